//! The object verbs: get, list, create, update, patch, delete, deletecollection, and the pod
//! eviction subresource.

use std::sync::Arc;

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;
use base64::Engine;
use serde_json::{Value, json};

use super::render::{self, Rendering};
use super::{App, Query, bytes_response, json_response, table};
use crate::error::ApiError;
use crate::managed_fields::{self, Scope, Shape, Writer};
use crate::patch::{self, PatchType};
use crate::resources::ResourceType;
use crate::selector::{FieldSelector, LabelSelector};
use crate::store::{DeleteOptions, Deletion, ObjectKey, Part, strategy};

fn parse_json(body: &Bytes) -> Result<Value, ApiError> {
    if body.is_empty() {
        return Ok(Value::Null);
    }
    serde_json::from_slice(body).map_err(|error| {
        ApiError::bad_request(format!("the request body is not valid JSON: {error}"))
    })
}

/// The selectors of a list or watch, as one predicate.
pub fn filter(
    kind: &ResourceType,
    query: &Query,
) -> Result<impl Fn(&Value) -> bool + use<>, ApiError> {
    let labels = LabelSelector::parse(query.get("labelSelector").unwrap_or_default())?;
    let fields = FieldSelector::parse(
        query.get("fieldSelector").unwrap_or_default(),
        &kind.group,
        &kind.plural,
    )?;
    Ok(move |object: &Value| labels.matches(object) && fields.matches(object))
}

/// The node a pod list is restricted to by its `spec.nodeName=<node>` field selector.
fn bound_node(kind: &ResourceType, query: &Query) -> Result<Option<String>, ApiError> {
    if !kind.is_core_pods() {
        return Ok(None);
    }
    let fields = FieldSelector::parse(
        query.get("fieldSelector").unwrap_or_default(),
        &kind.group,
        &kind.plural,
    )?;
    Ok(fields
        .required("spec.nodeName")
        .filter(|node| !node.is_empty())
        .map(str::to_owned))
}

pub fn get(
    app: &App,
    kind: &ResourceType,
    namespace: Option<&str>,
    name: &str,
    rendering: Rendering,
) -> Result<Response, ApiError> {
    let object = app.store.get(kind, namespace, name)?;
    if rendering == Rendering::Metadata {
        return Ok(json_response(StatusCode::OK, &render::partial(&object)));
    }
    if rendering == Rendering::Table {
        let revision = object["metadata"]["resourceVersion"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        return Ok(json_response(
            StatusCode::OK,
            &table::table(kind, &[object], &revision, None),
        ));
    }
    Ok(bytes_response(
        StatusCode::OK,
        serde_json::to_vec(&*object).unwrap_or_default(),
    ))
}

/// Where a list continues: after `key`, `returned` items into it, at `revision` (its first
/// page's, which every page of it reads).
struct Continue {
    key: ObjectKey,
    returned: u64,
    revision: u64,
}

fn encode_continue(token: &Continue) -> String {
    let Continue {
        key: (namespace, name),
        returned,
        revision,
    } = token;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(
        serde_json::to_vec(&json!([namespace, name, returned, revision])).unwrap_or_default(),
    )
}

fn decode_continue(token: &str) -> Result<Continue, ApiError> {
    let invalid = || {
        ApiError::bad_request("continue key is not valid: the token was not issued by this server")
    };
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .map_err(|_| invalid())?;
    let (namespace, name, returned, revision): (String, String, u64, u64) =
        serde_json::from_slice(&bytes).map_err(|_| invalid())?;
    Ok(Continue {
        key: (namespace, name),
        returned,
        revision,
    })
}

pub fn list(
    app: &App,
    kind: &ResourceType,
    namespace: Option<&str>,
    query: &Query,
    rendering: Rendering,
) -> Result<Response, ApiError> {
    let matches = filter(kind, query)?;
    let after = query.get("continue").map(decode_continue).transpose()?;
    let limit = query.limit()?;
    let page = match &after {
        Some(after) => {
            app.store
                .list_at(kind, namespace, &after.key, limit, &matches, after.revision)?
        }
        None => match bound_node(kind, query)? {
            Some(node) => app
                .store
                .list_pods_on_node(&node, namespace, limit, &matches),
            None => app.store.list(kind, namespace, None, limit, &matches),
        },
    };
    let revision = page.resource_version.to_string();
    let returned = after.map_or(0, |after| after.returned) + page.items.len() as u64;
    let next = page.next.as_ref().map(|key| {
        encode_continue(&Continue {
            key: key.clone(),
            returned,
            revision: page.resource_version,
        })
    });
    // The etcd3 store counts what is left only for a list without selectors.
    let selected = query.get("labelSelector").is_some_and(|s| !s.is_empty())
        || query.get("fieldSelector").is_some_and(|s| !s.is_empty());
    let remaining = page
        .next
        .as_ref()
        .filter(|_| !selected)
        .map(|last| app.store.count_after(kind, namespace, last, returned));
    if rendering == Rendering::Table {
        return Ok(json_response(
            StatusCode::OK,
            &table::table(kind, &page.items, &revision, next.as_deref()),
        ));
    }
    let metadata_only = rendering == Rendering::Metadata;
    let (list_kind, api_version) = if metadata_only {
        (
            "PartialObjectMetadataList".to_owned(),
            "meta.k8s.io/v1".to_owned(),
        )
    } else {
        (kind.list_kind(), kind.api_version())
    };
    // Written by hand so the items are serialised straight from the store, without a copy.
    let mut body = Vec::with_capacity(256 + page.items.len() * 1024);
    let mut metadata = json!({"resourceVersion": revision});
    if let Some(next) = next {
        metadata["continue"] = Value::String(next);
    }
    if let Some(remaining) = remaining {
        metadata["remainingItemCount"] = json!(remaining);
    }
    body.extend_from_slice(
        format!(
            "{{\"kind\":\"{list_kind}\",\"apiVersion\":\"{api_version}\",\"metadata\":{metadata},\"items\":[",
        )
        .as_bytes(),
    );
    for (index, item) in page.items.iter().enumerate() {
        if index > 0 {
            body.push(b',');
        }
        let written = if metadata_only {
            serde_json::to_writer(&mut body, &render::partial(item))
        } else {
            serde_json::to_writer(&mut body, &**item)
        };
        written.map_err(|e| ApiError::internal(e.to_string()))?;
    }
    body.extend_from_slice(b"]}");
    Ok(bytes_response(StatusCode::OK, body))
}

/// What a write must satisfy: a CRD's own rules, or a custom object's schema. Read before
/// any store update, whose closure runs under the store lock.
enum Schema {
    None,
    Crd,
    /// A ValidatingAdmissionPolicy: its expressions must compile.
    Policy,
    /// A validating or mutating webhook configuration: its webhooks must be well formed.
    WebhookConfiguration,
    Custom(Value),
}

impl Schema {
    /// The shape ownership and apply follow: a custom resource's schema, else the built-ins'.
    fn shape(&self) -> Shape<'_> {
        match self {
            Self::Custom(schema) => Shape::Schema(schema),
            Self::None | Self::Crd | Self::Policy | Self::WebhookConfiguration => Shape::Builtin,
        }
    }

    fn of(app: &App, kind: &ResourceType) -> Result<Self, ApiError> {
        if kind.group == "apiextensions.k8s.io" && kind.plural == "customresourcedefinitions" {
            return Ok(Self::Crd);
        }
        if kind.group == "admissionregistration.k8s.io"
            && kind.plural == "validatingadmissionpolicies"
        {
            return Ok(Self::Policy);
        }
        if crate::webhook_configuration::is_webhook_configuration(kind) {
            return Ok(Self::WebhookConfiguration);
        }
        if !kind.custom {
            return Ok(Self::None);
        }
        let crds = app
            .store
            .kind("apiextensions.k8s.io", "customresourcedefinitions");
        let crd = app
            .store
            .get(&crds, None, &format!("{}.{}", kind.plural, kind.group))?;
        Ok(crate::crd_schema::schema_for(&crd, &kind.version)
            .filter(|schema| !schema.is_null())
            .map_or(Self::None, |schema| Self::Custom(schema.clone())))
    }

    /// Checks what a write stores: a built-in object decodes as its Go type, a custom one is
    /// pruned, defaulted and validated against its schema. `old` is the stored object an update
    /// replaces; `fieldValidation=Strict` refuses unknown fields, otherwise they are dropped.
    fn admit(
        &self,
        kind: &ResourceType,
        object: &mut Value,
        old: Option<&Value>,
        query: &Query,
    ) -> Result<(), ApiError> {
        let strict = query.get("fieldValidation") == Some("Strict");
        if !kind.custom {
            crate::typed::decode_builtin(kind, object, strict)?;
        }
        match self {
            Self::None => Ok(()),
            Self::WebhookConfiguration => crate::webhook_configuration::validate(kind, object),
            Self::Crd => crate::crd_schema::validate_crd(object),
            Self::Policy => crate::admission_policy::check_policy(object).map_err(|message| {
                let name = object["metadata"]["name"].as_str().unwrap_or_default();
                ApiError::invalid(
                    &kind.group,
                    &kind.kind,
                    name,
                    &[crate::error::Cause {
                        reason: "FieldValueInvalid",
                        field: message.split(':').next().unwrap_or_default().to_owned(),
                        message,
                    }],
                )
            }),
            Self::Custom(schema) => crate::crd_schema::Admission {
                group: &kind.group,
                kind: &kind.kind,
                version: &kind.version,
                schema,
                strict,
            }
            .admit(object, old),
        }
    }
}

/// The manager a write is recorded under: `fieldManager`, else the User-Agent's product
/// (fieldmanager's prefixFromUserAgent).
fn manager(query: &Query, headers: &HeaderMap) -> String {
    if let Some(manager) = query.get("fieldManager") {
        return manager.to_owned();
    }
    headers
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .and_then(|agent| agent.split('/').next())
        .filter(|product| !product.is_empty())
        .unwrap_or("unknown")
        .to_owned()
}

fn scope(kind: &ResourceType, part: Part) -> Scope {
    match part {
        Part::Status => Scope::Status,
        Part::Main if kind.has_status => Scope::MainOfStatusKind,
        Part::Main => Scope::Main,
    }
}

pub fn create(
    app: &App,
    kind: &ResourceType,
    namespace: Option<&str>,
    query: &Query,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<Response, ApiError> {
    let mut object = parse_json(body)?;
    let schema = Schema::of(app, kind)?;
    schema.admit(kind, &mut object, None, query)?;
    let manager = manager(query, headers);
    let writer = Writer {
        manager: &manager,
        api_version: &kind.api_version(),
        scope: scope(kind, Part::Main),
    };
    managed_fields::record_update(None, &mut object, &writer, schema.shape());
    if query.dry_run() {
        let judged = app.store.create_dry_run(kind, namespace, object)?;
        return Ok(json_response(StatusCode::CREATED, &judged));
    }
    let created = app.store.create(kind, namespace, object)?;
    Ok(bytes_response(
        StatusCode::CREATED,
        serde_json::to_vec(&*created).unwrap_or_default(),
    ))
}

/// Whose bookkeeping a PUT's managedFields are: the server's own (an apply resolved before
/// admission already recorded them) or to be recorded now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bookkeeping {
    Record,
    AlreadyApplied,
}

#[allow(clippy::too_many_arguments)]
pub fn update(
    app: &App,
    kind: &ResourceType,
    namespace: Option<&str>,
    name: &str,
    part: Part,
    query: &Query,
    headers: &HeaderMap,
    body: &Bytes,
    bookkeeping: Bookkeeping,
) -> Result<Response, ApiError> {
    let mut object = parse_json(body)?;
    let schema = Schema::of(app, kind)?;
    if query.dry_run() {
        let current = app.store.get(kind, namespace, name).ok();
        schema.admit(kind, &mut object, current.as_deref(), query)?;
        return Ok(json_response(StatusCode::OK, &object));
    }
    let unconditional = object["metadata"]["resourceVersion"]
        .as_str()
        .is_none_or(str::is_empty);
    let exists = app.store.get(kind, namespace, name).is_ok();
    if !exists && part == Part::Main && strategy::allows_create_on_update(kind) {
        object["metadata"]["name"] = Value::String(name.to_owned());
        schema.admit(kind, &mut object, None, query)?;
        let created = app.store.create(kind, namespace, object)?;
        return Ok(bytes_response(
            StatusCode::CREATED,
            serde_json::to_vec(&*created).unwrap_or_default(),
        ));
    }
    if exists && unconditional && !strategy::allows_unconditional_update(kind) {
        return Err(strategy::version_required(kind, name));
    }
    let manager = manager(query, headers);
    let writer = Writer {
        manager: &manager,
        api_version: &kind.api_version(),
        scope: scope(kind, part),
    };
    let updated = app.store.update(kind, namespace, name, part, |current| {
        let mut object = object;
        // A PUT's uid is a precondition (rest.DefaultUpdatedObjectInfo), checked before
        // anything else: the object meant is gone.
        if let Some(uid) = object["metadata"]["uid"]
            .as_str()
            .filter(|uid| !uid.is_empty())
        {
            let precondition = crate::store::Preconditions {
                uid: Some(uid.to_owned()),
                resource_version: None,
            };
            precondition.check(kind, name, current)?;
        }
        schema.admit(kind, &mut object, Some(current), query)?;
        if bookkeeping == Bookkeeping::Record {
            managed_fields::record_update(Some(current), &mut object, &writer, schema.shape());
        }
        Ok(object)
    })?;
    Ok(bytes_response(
        StatusCode::OK,
        serde_json::to_vec(&*updated).unwrap_or_default(),
    ))
}

/// Writes the main object as `change` makes it of the current one, admitted and its fields
/// recorded as a PUT's are (for subresources that write into the object, like `/scale`).
pub fn update_main_with(
    app: &App,
    kind: &ResourceType,
    namespace: Option<&str>,
    name: &str,
    query: &Query,
    headers: &HeaderMap,
    change: impl FnOnce(&Value) -> Result<Value, ApiError>,
) -> Result<Arc<Value>, ApiError> {
    let schema = Schema::of(app, kind)?;
    let manager = manager(query, headers);
    let writer = Writer {
        manager: &manager,
        api_version: &kind.api_version(),
        scope: scope(kind, Part::Main),
    };
    app.store
        .update(kind, namespace, name, Part::Main, |current| {
            let mut object = change(current)?;
            schema.admit(kind, &mut object, Some(current), query)?;
            managed_fields::record_update(Some(current), &mut object, &writer, schema.shape());
            Ok(object)
        })
}

#[allow(clippy::too_many_arguments)]
pub fn patch(
    app: &App,
    kind: &ResourceType,
    namespace: Option<&str>,
    name: &str,
    part: Part,
    query: &Query,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<Response, ApiError> {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let patch_type = PatchType::from_content_type(content_type)
        .ok_or_else(|| ApiError::unsupported_media_type(content_type))?;
    let patch = patch::parse_body(patch_type, body)?;
    if patch_type == PatchType::Apply && query.get("fieldManager").is_none() {
        return Err(ApiError::bad_request(
            "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch",
        ));
    }
    let schema = Schema::of(app, kind)?;
    let manager = manager(query, headers);
    let writer = Writer {
        manager: &manager,
        api_version: &kind.api_version(),
        scope: scope(kind, part),
    };
    let force = query.flag("force");
    let resolve = |current: &Value| -> Result<Value, ApiError> {
        if patch_type == PatchType::Apply {
            return managed_fields::apply(Some(current), &patch, &writer, force, schema.shape());
        }
        let mut patched = patch::apply(current, patch_type, &patch, kind.custom)?;
        managed_fields::record_update(Some(current), &mut patched, &writer, schema.shape());
        Ok(patched)
    };
    if query.dry_run() {
        let current = app.store.get(kind, namespace, name)?;
        return Ok(json_response(StatusCode::OK, &resolve(&current)?));
    }
    let patched = app.store.update(kind, namespace, name, part, |current| {
        let mut patched = resolve(current)?;
        schema.admit(kind, &mut patched, Some(current), query)?;
        Ok(patched)
    });
    match patched {
        Ok(object) => Ok(bytes_response(
            StatusCode::OK,
            serde_json::to_vec(&*object).unwrap_or_default(),
        )),
        // Server-side apply creates what does not exist yet.
        Err(error) if error.code == 404 && patch_type == PatchType::Apply && part == Part::Main => {
            let mut object = managed_fields::apply(None, &patch, &writer, force, schema.shape())?;
            object["metadata"]["name"] = Value::String(name.to_owned());
            schema.admit(kind, &mut object, None, query)?;
            let created = app.store.create(kind, namespace, object)?;
            Ok(bytes_response(
                StatusCode::CREATED,
                serde_json::to_vec(&*created).unwrap_or_default(),
            ))
        }
        Err(error) => Err(error),
    }
}

/// An apply resolved for admission: the object it makes of `current`, managedFields included.
pub fn resolve_apply(
    app: &App,
    kind: &ResourceType,
    sub: Option<&str>,
    query: &Query,
    headers: &HeaderMap,
    current: &Value,
    config: &Value,
) -> Result<Value, ApiError> {
    let schema = Schema::of(app, kind)?;
    let part = if sub == Some("status") {
        Part::Status
    } else {
        Part::Main
    };
    let manager = manager(query, headers);
    let writer = Writer {
        manager: &manager,
        api_version: &kind.api_version(),
        scope: scope(kind, part),
    };
    managed_fields::apply(
        Some(current),
        config,
        &writer,
        query.flag("force"),
        schema.shape(),
    )
}

fn delete_options(query: &Query, body: &Bytes) -> Result<DeleteOptions, ApiError> {
    let mut options = DeleteOptions::from_json(&parse_json(body)?)?;
    if let Some(grace) = query.grace_period_seconds()? {
        options.grace_period_seconds = Some(grace);
    }
    if let Some(orphan) = query.get("orphanDependents") {
        options.orphan_dependents = Some(orphan == "true");
        if orphan == "true" && options.propagation_policy.is_none() {
            options.propagation_policy = Some("Orphan".to_owned());
        }
    }
    if let Some(policy) = query.get("propagationPolicy") {
        options.propagation_policy = Some(policy.to_owned());
    }
    options.dry_run |= query.dry_run();
    Ok(options)
}

pub fn delete(
    app: &App,
    user: &str,
    kind: &ResourceType,
    namespace: Option<&str>,
    name: &str,
    query: &Query,
    body: &Bytes,
) -> Result<Response, ApiError> {
    let options = delete_options(query, body)?;
    if options.dry_run {
        let current = app.store.get(kind, namespace, name)?;
        return Ok(bytes_response(
            StatusCode::OK,
            serde_json::to_vec(&*current).unwrap_or_default(),
        ));
    }
    let current = app.store.get(kind, namespace, name)?;
    if is_pods(kind) {
        app.audit
            .pod_leaving(&app.store, &current, crate::audit::Disruption::Delete, user);
    }
    let deletion = app.store.delete(kind, namespace, name, &options)?;
    app.audit.deleting(
        &app.store,
        &kind.plural,
        &current,
        options.grace_period_seconds,
        user,
    );
    // handlers/delete.go: 202 only for an object not deleted at once whose client asked for
    // its dependents not to be orphaned; 200 otherwise, finalizers or not.
    let code = match deletion {
        Deletion::Marked(_) if options.orphan_dependents == Some(false) => StatusCode::ACCEPTED,
        Deletion::Marked(_) | Deletion::Removed(_) => StatusCode::OK,
    };
    Ok(bytes_response(
        code,
        serde_json::to_vec(&**deletion.object()).unwrap_or_default(),
    ))
}

pub fn delete_collection(
    app: &App,
    user: &str,
    kind: &ResourceType,
    namespace: Option<&str>,
    query: &Query,
    body: &Bytes,
) -> Result<Response, ApiError> {
    let options = delete_options(query, body)?;
    let matches = filter(kind, query)?;
    let page = app.store.list(kind, namespace, None, 0, &matches);
    let mut deleted: Vec<Arc<Value>> = Vec::new();
    for object in page.items {
        let meta = &object["metadata"];
        let (ns, name) = (
            meta["namespace"].as_str(),
            meta["name"].as_str().unwrap_or_default(),
        );
        if options.dry_run {
            deleted.push(object.clone());
            continue;
        }
        if is_pods(kind) {
            app.audit
                .pod_leaving(&app.store, &object, crate::audit::Disruption::Delete, user);
        }
        match app.store.delete(kind, ns, name, &options) {
            Ok(deletion) => {
                app.audit.deleting(
                    &app.store,
                    &kind.plural,
                    &object,
                    options.grace_period_seconds,
                    user,
                );
                deleted.push(Arc::clone(deletion.object()));
            }
            Err(error) if error.code == 404 => {}
            Err(error) => return Err(error),
        }
    }
    let items: Vec<&Value> = deleted.iter().map(|o| &**o).collect();
    Ok(json_response(
        StatusCode::OK,
        &json!({
            "kind": kind.list_kind(),
            "apiVersion": kind.api_version(),
            "metadata": {"resourceVersion": app.store.revision().to_string()},
            "items": items,
        }),
    ))
}

fn is_pods(kind: &ResourceType) -> bool {
    kind.group.is_empty() && kind.plural == "pods"
}

/// A successful eviction answers `metav1.Status{Status: Success}`, which the create handler
/// gives the code 201.
pub fn evict(
    app: &App,
    user: &str,
    namespace: &str,
    name: &str,
    query: &Query,
    body: &Bytes,
) -> Result<Response, ApiError> {
    let eviction = parse_json(body)?;
    crate::eviction::evict(
        &app.store,
        &app.audit,
        user,
        namespace,
        name,
        &eviction,
        query.dry_run(),
    )?;
    Ok(json_response(
        StatusCode::CREATED,
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
    ))
}
