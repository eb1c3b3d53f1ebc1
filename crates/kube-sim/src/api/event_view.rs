//! events.k8s.io/v1 Events are a view of the core/v1 Event storage, as on a real server
//! (pkg/registry/core/rest/storage_core.go serves both from one store; the field mapping is
//! pkg/apis/events/v1/conversion.go). So an Event written through either API is read, listed,
//! watched and field-selected through both: `kubectl get events` shows what a controller
//! recorded with events.k8s.io/v1.
//!
//! Requests to the view are translated to the core resource before admission and dispatch, and
//! the answers translated back.

use axum::body::{Body, Bytes};
use axum::http::Method;
use axum::response::Response;
use futures::StreamExt;
use serde_json::{Map, Value};

use super::Query;
use crate::error::ApiError;
use crate::resources::ResourceType;

const GROUP: &str = "events.k8s.io";
const API_VERSION: &str = "events.k8s.io/v1";

/// events.k8s.io/v1 field name ↔ core/v1 field name, where they differ.
const RENAMED: [(&str, &str); 7] = [
    ("regarding", "involvedObject"),
    ("note", "message"),
    ("deprecatedSource", "source"),
    ("deprecatedFirstTimestamp", "firstTimestamp"),
    ("deprecatedLastTimestamp", "lastTimestamp"),
    ("deprecatedCount", "count"),
    ("reportingController", "reportingComponent"),
];

/// Whether `kind` is the events.k8s.io view of core Events.
pub fn is_view(kind: &ResourceType) -> bool {
    kind.group == GROUP && kind.plural == "events"
}

fn rename(
    object: &Value,
    pairs: impl Iterator<Item = (&'static str, &'static str)>,
    api_version: &str,
) -> Value {
    let Value::Object(fields) = object else {
        return object.clone();
    };
    let mut converted: Map<String, Value> = fields.clone();
    for (from, to) in pairs {
        if let Some(value) = converted.remove(from) {
            converted.insert(to.to_owned(), value);
        }
    }
    converted.insert(
        "apiVersion".to_owned(),
        Value::String(api_version.to_owned()),
    );
    Value::Object(converted)
}

/// An events.k8s.io/v1 Event as core/v1 stores it.
pub fn to_core(event: &Value) -> Value {
    if event.is_null() {
        return Value::Null;
    }
    rename(event, RENAMED.iter().copied(), "v1")
}

/// A stored core/v1 Event as events.k8s.io/v1 shows it.
pub fn from_core(event: &Value) -> Value {
    rename(
        event,
        RENAMED.iter().map(|(view, core)| (*core, *view)),
        API_VERSION,
    )
}

/// The view's field selector in core labels; labels the view does not define are refused as
/// the real server refuses them.
pub fn core_field_selector(selector: &str) -> Result<String, ApiError> {
    let mut translated = Vec::new();
    for requirement in selector.split(',').filter(|r| !r.is_empty()) {
        let at = requirement.find(['=', '!']).ok_or_else(|| {
            ApiError::bad_request(format!("invalid field selector: '{requirement}'"))
        })?;
        let (label, rest) = requirement.split_at(at);
        let core = match label.trim() {
            "reason" | "source" | "type" | "metadata.namespace" | "metadata.name" => {
                label.trim().to_owned()
            }
            "reportingController" => "reportingComponent".to_owned(),
            regarding if regarding.starts_with("regarding.") => {
                let field = &regarding["regarding.".len()..];
                if !matches!(
                    field,
                    "kind"
                        | "namespace"
                        | "name"
                        | "uid"
                        | "apiVersion"
                        | "resourceVersion"
                        | "fieldPath"
                ) {
                    return Err(unsupported(regarding));
                }
                format!("involvedObject.{field}")
            }
            other => return Err(unsupported(other)),
        };
        translated.push(format!("{core}{rest}"));
    }
    Ok(translated.join(","))
}

fn unsupported(label: &str) -> ApiError {
    ApiError::bad_request(format!("field label not supported: {label}"))
}

/// The request as the core resource would receive it. A PATCH is resolved against the view of
/// the stored object and continues as a PUT guarded by the version it was computed from.
pub fn request_to_core(
    method: &Method,
    query: &Query,
    body: Bytes,
    current: Option<&Value>,
    patch_type: Option<crate::patch::PatchType>,
) -> Result<(Method, Query, Bytes), ApiError> {
    let query = match query.get("fieldSelector") {
        Some(selector) => query.with("fieldSelector", &core_field_selector(selector)?),
        None => query.clone(),
    };
    let parse = |bytes: &Bytes| -> Result<Value, ApiError> {
        serde_json::from_slice(bytes)
            .map_err(|e| ApiError::bad_request(format!("the request body is not valid JSON: {e}")))
    };
    let encode = |value: &Value| Bytes::from(serde_json::to_vec(value).unwrap_or_default());
    match *method {
        Method::POST | Method::PUT if !body.is_empty() => {
            Ok((method.clone(), query, encode(&to_core(&parse(&body)?))))
        }
        Method::PATCH => {
            let patch_type = patch_type.ok_or_else(|| ApiError::unsupported_media_type(""))?;
            let patch = crate::patch::parse_body(patch_type, &body)?;
            match current {
                Some(current) => {
                    let mut patched = to_core(&crate::patch::apply(
                        &from_core(current),
                        patch_type,
                        &patch,
                        false,
                    )?);
                    patched["metadata"]["resourceVersion"] =
                        current["metadata"]["resourceVersion"].clone();
                    Ok((Method::PUT, query, encode(&patched)))
                }
                // Server-side apply of something new creates it.
                None => Ok((method.clone(), query, encode(&to_core(&patch)))),
            }
        }
        _ => Ok((method.clone(), query, body)),
    }
}

/// The core resource's answer as the view gives it: Events and EventLists converted, watch
/// events converted line by line; Tables and Status bodies unchanged.
pub async fn response_from_core(response: Response, watch: bool) -> Response {
    let (parts, body) = response.into_parts();
    if watch {
        let lines = body.into_data_stream().map(|chunk| {
            chunk.map(|bytes| {
                let mut converted = Vec::with_capacity(bytes.len() + 64);
                for line in bytes.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
                    converted.extend_from_slice(&convert_bytes(line, true));
                    converted.push(b'\n');
                }
                Bytes::from(converted)
            })
        });
        return Response::from_parts(parts, Body::from_stream(lines));
    }
    let Ok(bytes) = axum::body::to_bytes(body, usize::MAX).await else {
        return Response::from_parts(parts, Body::empty());
    };
    let converted = convert_bytes(&bytes, false);
    let mut parts = parts;
    parts.headers.remove(axum::http::header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::from(converted))
}

fn convert_bytes(bytes: &[u8], watch_event: bool) -> Vec<u8> {
    let Ok(mut value) = serde_json::from_slice::<Value>(bytes) else {
        return bytes.to_vec();
    };
    let object = if watch_event {
        &mut value["object"]
    } else {
        &mut value
    };
    match object["kind"].as_str() {
        Some("Event") => *object = from_core(object),
        Some("EventList") => {
            if let Some(items) = object["items"].as_array_mut() {
                for item in items.iter_mut() {
                    *item = from_core(item);
                }
            }
            object["apiVersion"] = Value::String(API_VERSION.to_owned());
        }
        _ => return bytes.to_vec(),
    }
    serde_json::to_vec(&value).unwrap_or_else(|_| bytes.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_event_round_trips_through_core_storage() {
        let view = json!({
            "apiVersion": API_VERSION, "kind": "Event",
            "metadata": {"name": "node-1.1", "namespace": "default"},
            "regarding": {"kind": "Node", "name": "node-1"}, "note": "stopping",
            "reason": "NodeShutdown", "type": "Normal", "reportingController": "nodegrace-x",
            "reportingInstance": "node-1", "action": "Terminate", "eventTime": "2026-01-01T00:00:00.000000Z",
            "deprecatedCount": 2,
        });
        let core = to_core(&view);
        assert_eq!(core["apiVersion"], "v1");
        assert_eq!(core["involvedObject"]["name"], "node-1");
        assert_eq!(core["message"], "stopping");
        assert_eq!(core["reportingComponent"], "nodegrace-x");
        assert_eq!(core["count"], 2);
        assert!(core.get("note").is_none() && core.get("regarding").is_none());
        assert_eq!(from_core(&core), view);
    }

    #[test]
    fn field_labels_follow_the_upstream_mapping() {
        assert_eq!(
            core_field_selector("regarding.name=node-1,reportingController!=x,type==Warning")
                .unwrap(),
            "involvedObject.name=node-1,reportingComponent!=x,type==Warning"
        );
        for refused in ["involvedObject.name=node-1", "note=x", "regarding.bogus=1"] {
            let error = core_field_selector(refused).unwrap_err();
            assert_eq!(error.code, 400, "{refused}");
            assert!(
                error.message.contains("field label not supported"),
                "{refused}: {}",
                error.message
            );
        }
    }
}
