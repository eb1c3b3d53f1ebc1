//! The reviews that ask the authorizer (pkg/registry/authorization/*accessreview) and the
//! authenticator (pkg/registry/authentication/selfsubjectreview): `kubectl auth can-i` and
//! `kubectl auth whoami` use them. Nothing is stored.

use std::collections::BTreeMap;

use axum::body::Bytes;
use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{Value, json};

use crate::json::owned_strings;

use super::{App, json_response};
use crate::auth::attributes::{Attributes, Request, Resource};
use crate::auth::{User, authorize};
use crate::error::{ApiError, Cause};

fn parse(body: &Bytes) -> Result<Value, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the request body is not valid JSON: {e}")))
}

fn invalid(kind: &str, field: &str, message: &str) -> ApiError {
    ApiError::invalid(
        "authorization.k8s.io",
        kind,
        "",
        &[Cause {
            reason: "FieldValueInvalid",
            field: field.to_owned(),
            message: message.to_owned(),
        }],
    )
}

/// SelfSubjectAccessReview (as `user`), SubjectAccessReview and LocalSubjectAccessReview (as
/// the user the spec names).
pub fn review(
    app: &App,
    user: &User,
    plural: &str,
    namespace: Option<&str>,
    body: &Bytes,
) -> Result<Response, ApiError> {
    let mut review = parse(body)?;
    let (kind, subject) = match plural {
        "selfsubjectaccessreviews" => ("SelfSubjectAccessReview", user.clone()),
        "subjectaccessreviews" => ("SubjectAccessReview", named_subject(&review["spec"])),
        "localsubjectaccessreviews" => ("LocalSubjectAccessReview", named_subject(&review["spec"])),
        other => {
            return Err(ApiError::method_not_allowed(format!(
                "{other} can not be created here"
            )));
        }
    };
    if kind != "SelfSubjectAccessReview" && subject.name.is_empty() && subject.groups.is_empty() {
        return Err(invalid(
            kind,
            "spec.user",
            "at least one of user or group must be specified",
        ));
    }
    let spec = &review["spec"];
    let attributes = if let Some(resource) = spec["resourceAttributes"].as_object() {
        let field = |name: &str| {
            resource
                .get(name)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        if let Some(namespace) = namespace
            && field("namespace") != namespace
        {
            return Err(invalid(
                kind,
                "spec.resourceAttributes.namespace",
                "must match metadata.namespace",
            ));
        }
        Attributes::resource(
            &field("verb"),
            Resource {
                group: field("group"),
                version: field("version"),
                resource: field("resource"),
                subresource: field("subresource"),
                namespace: field("namespace"),
                name: field("name"),
            },
        )
    } else if let Some(non_resource) = spec["nonResourceAttributes"].as_object() {
        let field = |name: &str| {
            non_resource
                .get(name)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        Attributes {
            verb: field("verb"),
            kind: Request::NonResource {
                path: field("path"),
            },
        }
    } else {
        return Err(invalid(
            kind,
            "spec.resourceAttributes",
            "exactly one of nonResourceAttributes or resourceAttributes must be specified",
        ));
    };
    let decision = authorize(&app.store, &subject, &attributes);
    let mut status = json!({"allowed": decision.allowed});
    if !decision.reason.is_empty() {
        status["reason"] = json!(decision.reason);
    }
    review["kind"] = json!(kind);
    review["apiVersion"] = json!("authorization.k8s.io/v1");
    review["metadata"]["creationTimestamp"] = Value::Null;
    review["status"] = status;
    Ok(json_response(StatusCode::CREATED, &review))
}

fn named_subject(spec: &Value) -> User {
    let extra: BTreeMap<String, Vec<String>> = spec["extra"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(key, values)| (key.clone(), owned_strings(values)))
        .collect();
    User {
        name: spec["user"].as_str().unwrap_or_default().to_owned(),
        uid: spec["uid"].as_str().unwrap_or_default().to_owned(),
        groups: owned_strings(&spec["groups"]),
        extra,
    }
}

/// SelfSubjectReview: who the request authenticated as (after impersonation).
pub fn whoami(user: &User) -> Response {
    json_response(
        StatusCode::CREATED,
        &json!({
            "kind": "SelfSubjectReview",
            "apiVersion": "authentication.k8s.io/v1",
            "metadata": {"creationTimestamp": null},
            "status": {"userInfo": user.to_json()},
        }),
    )
}
