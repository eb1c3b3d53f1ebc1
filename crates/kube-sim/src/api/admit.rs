//! Admission in an API write's path (staging/src/k8s.io/apiserver/pkg/admission): the
//! registered webhooks and ValidatingAdmissionPolicies see the object as the write would leave
//! it — a PATCH resolved first, a subresource write as its own object (an Eviction, a Scale).

use std::sync::Arc;

use axum::body::Bytes;
use axum::http::{HeaderMap, Method, header};
use serde_json::Value;

use super::query::Query;
use super::target::Target;
use super::{App, objects, scale};
use crate::error::ApiError;

/// Runs admission webhooks on API writes. A PATCH is resolved here and continues as a PUT of
/// the admitted object, guarded by the version it was computed from; a resolved apply carries
/// its managedFields already.
pub(super) async fn admitted(
    app: &App,
    user: &crate::auth::User,
    method: &Method,
    target: &Target,
    query: &Query,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<(Method, Bytes, objects::Bookkeeping, Vec<String>), Refused> {
    use crate::admission::{Operation, Request, admit, any_registered};
    use objects::Bookkeeping::{AlreadyApplied, Record};
    let write = matches!(
        *method,
        Method::POST | Method::PUT | Method::PATCH | Method::DELETE
    );
    if !write || !(any_registered(&app.store) || crate::admission_policy::any_bound(&app.store)) {
        return Ok((method.clone(), body, Record, Vec::new()));
    }
    let (kind, namespace, name, sub) = match target {
        Target::Collection { kind, namespace } if *method == Method::POST => {
            (kind, namespace.as_deref(), None, None)
        }
        Target::Object {
            kind,
            namespace,
            name,
            sub,
        } => (
            kind,
            namespace.as_deref(),
            Some(name.as_str()),
            sub.as_deref(),
        ),
        _ => return Ok((method.clone(), body, Record, Vec::new())),
    };
    // A subresource write is admitted like any other; the eviction subresource's object is the
    // Eviction itself (policy/v1), created on the pod's `eviction` subresource.
    let eviction = sub == Some("eviction");
    if eviction && *method != Method::POST {
        return Ok((method.clone(), body, Record, Vec::new()));
    }
    let parse = |bytes: &Bytes| -> Result<Value, ApiError> {
        serde_json::from_slice(bytes)
            .map_err(|e| ApiError::bad_request(format!("the request body is not valid JSON: {e}")))
    };
    // The scale subresource is admitted as the Scale it shows, like its writes.
    let scale = sub == Some("scale");
    let old = match name {
        Some(name) if !eviction => app.store.get(kind, namespace, name).ok(),
        _ => None,
    };
    let old = match old {
        Some(object) if scale => Some(Arc::new(scale::view(kind, &object)?)),
        other => other,
    };
    let (operation, object) = match *method {
        Method::POST => (Operation::Create, parse(&body)?),
        Method::PUT => (Operation::Update, parse(&body)?),
        Method::DELETE => (
            Operation::Delete,
            old.as_deref().cloned().ok_or_else(|| {
                ApiError::not_found(&kind.group, &kind.plural, name.unwrap_or_default())
            })?,
        ),
        _ => {
            let content_type = headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default();
            let patch_type = crate::patch::PatchType::from_content_type(content_type)
                .ok_or_else(|| ApiError::unsupported_media_type(content_type))?;
            let patch = crate::patch::parse_body(patch_type, &body)?;
            match &old {
                Some(current) if patch_type == crate::patch::PatchType::Apply && !scale => (
                    Operation::Update,
                    objects::resolve_apply(app, kind, sub, query, headers, current, &patch)?,
                ),
                Some(current) => (
                    Operation::Update,
                    crate::patch::apply(current, patch_type, &patch, kind.custom)?,
                ),
                // Server-side apply of something new is a create.
                None => return Ok((method.clone(), body, Record, Vec::new())),
            }
        }
    };
    let object_name = name
        .map(str::to_owned)
        .or_else(|| object["metadata"]["name"].as_str().map(str::to_owned))
        .unwrap_or_default();
    let request = Request {
        operation,
        kind,
        subresource: sub,
        namespace,
        name: &object_name,
        object_kind: if eviction {
            Some(("policy", "v1", "Eviction"))
        } else if scale {
            Some(("autoscaling", "v1", "Scale"))
        } else {
            None
        },
        old: old.as_deref(),
        dry_run: query.dry_run(),
        user,
    };
    let crate::admission::Admitted {
        object: admitted,
        mut warnings,
    } = admit(&app.store, &request, object)
        .await
        .map_err(|(error, warnings)| Refused { error, warnings })?;
    match crate::admission_policy::validate(&app.store, &request, &admitted) {
        Ok(more) => warnings.extend(more),
        Err(error) => return Err(Refused { error, warnings }),
    }
    let applied = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(crate::patch::PatchType::from_content_type)
        == Some(crate::patch::PatchType::Apply);
    match *method {
        Method::DELETE => Ok((method.clone(), body, Record, warnings)),
        Method::PATCH => {
            let mut admitted = admitted;
            admitted["metadata"]["resourceVersion"] =
                old.map_or(Value::Null, |o| o["metadata"]["resourceVersion"].clone());
            Ok((
                Method::PUT,
                Bytes::from(serde_json::to_vec(&admitted).unwrap_or_default()),
                if applied { AlreadyApplied } else { Record },
                warnings,
            ))
        }
        _ => Ok((
            method.clone(),
            Bytes::from(serde_json::to_vec(&admitted).unwrap_or_default()),
            Record,
            warnings,
        )),
    }
}

/// A write admission refused, with the warnings of the webhooks that answered before.
pub(super) struct Refused {
    pub(super) error: ApiError,
    pub(super) warnings: Vec<String>,
}

impl From<ApiError> for Refused {
    fn from(error: ApiError) -> Self {
        Self {
            error,
            warnings: Vec::new(),
        }
    }
}
