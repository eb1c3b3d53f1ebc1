//! The `/scale` subresource (autoscaling/v1 Scale) of ReplicaSets, Deployments, StatefulSets
//! and custom resources that declare one: a view of the replica count and selector, whose
//! writes set the object's replicas (pkg/registry/apps/*/storage/storage.go, ScaleREST;
//! apiextensions-apiserver/pkg/registry/customresource/etcd.go, ScaleREST).

use axum::body::Bytes;
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::Response;
use serde_json::{Value, json};

use super::{App, Query, json_response, objects};
use crate::error::{ApiError, Cause};
use crate::patch::{self, PatchType};
use crate::resources::{ResourceType, ScalePaths};

/// `.spec.replicas` → `/spec/replicas`.
fn pointer(path: &str) -> String {
    path.trim_start_matches('.')
        .split('.')
        .fold(String::new(), |mut pointer, part| {
            pointer.push('/');
            pointer.push_str(part);
            pointer
        })
}

/// A LabelSelector in its string form (metav1.LabelSelectorAsSelector), requirements sorted
/// by key.
fn selector_string(selector: &Value) -> String {
    let mut requirements: Vec<(String, String)> = Vec::new();
    for (key, value) in selector["matchLabels"].as_object().into_iter().flatten() {
        requirements.push((
            key.clone(),
            format!("{key}={}", value.as_str().unwrap_or_default()),
        ));
    }
    for expression in selector["matchExpressions"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let key = expression["key"].as_str().unwrap_or_default();
        let mut values: Vec<&str> = crate::json::strings(&expression["values"]).collect();
        values.sort_unstable();
        let text = match expression["operator"].as_str().unwrap_or_default() {
            "In" => format!("{key} in ({})", values.join(",")),
            "NotIn" => format!("{key} notin ({})", values.join(",")),
            "Exists" => key.to_owned(),
            _ => format!("!{key}"),
        };
        requirements.push((key.to_owned(), text));
    }
    requirements.sort();
    requirements
        .into_iter()
        .map(|(_, text)| text)
        .collect::<Vec<_>>()
        .join(",")
}

fn paths(kind: &ResourceType) -> Result<&ScalePaths, ApiError> {
    kind.scale
        .as_ref()
        .ok_or_else(|| ApiError::not_found(&kind.group, &format!("{}/scale", kind.plural), ""))
}

/// The Scale an object shows.
pub fn view(kind: &ResourceType, object: &Value) -> Result<Value, ApiError> {
    let paths = paths(kind)?;
    let replicas = |path: &str| object.pointer(&pointer(path)).and_then(Value::as_i64);
    let meta = &object["metadata"];
    let mut scale = json!({
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            "name": meta["name"],
            "uid": meta["uid"],
            "resourceVersion": meta["resourceVersion"],
            "creationTimestamp": meta["creationTimestamp"],
        },
        "spec": {},
        "status": {"replicas": replicas(&paths.status_replicas).unwrap_or(0)},
    });
    if let Some(namespace) = meta["namespace"].as_str() {
        scale["metadata"]["namespace"] = json!(namespace);
    }
    // Built-in kinds default replicas to 1; a custom resource shows what it has.
    let spec_replicas = replicas(&paths.spec_replicas).or((!kind.custom).then_some(1));
    if let Some(spec_replicas) = spec_replicas {
        scale["spec"]["replicas"] = json!(spec_replicas);
    }
    let selector = match &paths.label_selector {
        Some(path) => object
            .pointer(&pointer(path))
            .and_then(Value::as_str)
            .map(str::to_owned),
        None => object["spec"]["selector"]
            .is_object()
            .then(|| selector_string(&object["spec"]["selector"])),
    };
    if let Some(selector) = selector {
        scale["status"]["selector"] = json!(selector);
    }
    Ok(scale)
}

#[allow(clippy::too_many_arguments)]
pub fn serve(
    app: &App,
    method: &Method,
    kind: &ResourceType,
    namespace: Option<&str>,
    name: &str,
    query: &Query,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<Response, ApiError> {
    let paths = paths(kind)?;
    let current = app.store.get(kind, namespace, name)?;
    let wanted = match *method {
        Method::GET => return Ok(json_response(StatusCode::OK, &view(kind, &current)?)),
        Method::PUT => serde_json::from_slice::<Value>(body).map_err(|e| {
            ApiError::bad_request(format!("the request body is not valid JSON: {e}"))
        })?,
        Method::PATCH => {
            let content_type = headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default();
            let patch_type = PatchType::from_content_type(content_type)
                .ok_or_else(|| ApiError::unsupported_media_type(content_type))?;
            if patch_type == PatchType::Apply {
                return Err(ApiError::unsupported_media_type(content_type));
            }
            let patch = patch::parse_body(patch_type, body)?;
            patch::apply(&view(kind, &current)?, patch_type, &patch, false)?
        }
        _ => {
            return Err(ApiError::method_not_allowed(format!(
                "{method} is not supported on scale"
            )));
        }
    };
    let replicas = wanted["spec"]["replicas"].as_i64().unwrap_or(0);
    if replicas < 0 {
        return Err(ApiError::invalid(
            "autoscaling",
            "Scale",
            name,
            &[Cause {
                reason: "FieldValueInvalid",
                field: "spec.replicas".to_owned(),
                message: format!("Invalid value: {replicas}: must be greater than or equal to 0"),
            }],
        ));
    }
    // A Scale carrying a resourceVersion is a precondition on the object, as for any update.
    let version = wanted["metadata"]["resourceVersion"].clone();
    let target = pointer(&paths.spec_replicas);
    let updated =
        objects::update_main_with(app, kind, namespace, name, query, headers, |object| {
            let mut updated = object.clone();
            if version.as_str().is_some_and(|v| !v.is_empty()) {
                updated["metadata"]["resourceVersion"] = version;
            }
            set_pointer(&mut updated, &target, json!(replicas));
            Ok(updated)
        })?;
    Ok(json_response(StatusCode::OK, &view(kind, &updated)?))
}

/// Sets a value at a JSON pointer, making the objects on the way.
fn set_pointer(object: &mut Value, pointer: &str, value: Value) {
    let mut at = object;
    for part in pointer.trim_start_matches('/').split('/') {
        if !at.is_object() {
            *at = json!({});
        }
        at = &mut at[part];
    }
    *at = value;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors_print_as_kubectl_reads_them() {
        let selector = json!({"matchLabels": {"b": "2", "a": "1"}, "matchExpressions": [{"key": "c", "operator": "In", "values": ["y", "x"]}, {"key": "d", "operator": "DoesNotExist"}]});
        assert_eq!(selector_string(&selector), "a=1,b=2,c in (x,y),!d");
    }

    #[test]
    fn pointers_are_made_on_the_way() {
        let mut object = json!({});
        set_pointer(&mut object, &pointer(".spec.replicas"), json!(3));
        assert_eq!(object, json!({"spec": {"replicas": 3}}));
    }
}
