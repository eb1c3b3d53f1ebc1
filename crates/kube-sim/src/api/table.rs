//! Server-side printing (`meta.k8s.io/v1 Table`), which kubectl asks for on `get`.

use std::sync::Arc;

use serde_json::{Value, json};

use crate::resources::ResourceType;

fn column(name: &str, kind: &str, description: &str, priority: i64) -> Value {
    json!({"name": name, "type": kind, "format": if name == "Name" { "name" } else { "" }, "description": description, "priority": priority})
}

/// A compact age, as kubectl prints it: 45s, 12m, 5h, 3d.
pub fn age(object: &Value) -> String {
    let Some(created) = object["metadata"]["creationTimestamp"]
        .as_str()
        .and_then(|t| t.parse::<jiff::Timestamp>().ok())
    else {
        return "<unknown>".to_owned();
    };
    let seconds = jiff::Timestamp::now()
        .duration_since(created)
        .as_secs()
        .max(0);
    match seconds {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

fn text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Null => "<none>".to_owned(),
        other => other.to_string(),
    }
}

/// An IntOrString as kubectl shows it; unset is N/A.
fn int_or_string(value: &Value) -> String {
    match value {
        Value::Null => "N/A".to_owned(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn columns(kind: &ResourceType) -> Vec<Value> {
    let name = column(
        "Name",
        "string",
        "Name must be unique within a namespace.",
        0,
    );
    let age = column("Age", "string", "Time since creation.", 0);
    match (kind.group.as_str(), kind.plural.as_str()) {
        ("", "pods") => vec![
            name,
            column("Ready", "string", "Ready containers", 0),
            column("Status", "string", "The pod's phase, or Terminating", 0),
            column("Restarts", "string", "Container restarts", 0),
            age,
            column("IP", "string", "Pod IP", 1),
            column("Node", "string", "Node the pod is bound to", 1),
        ],
        ("", "nodes") => vec![
            name,
            column("Status", "string", "Ready condition, and scheduling", 0),
            column("Roles", "string", "Node roles", 0),
            age,
            column("Version", "string", "Kubelet version", 0),
        ],
        ("coordination.k8s.io", "leases") => vec![
            name,
            column("Holder", "string", "spec.holderIdentity", 0),
            age,
        ],
        ("policy", "poddisruptionbudgets") => vec![
            name,
            column("Min Available", "string", "spec.minAvailable", 0),
            column("Max Unavailable", "string", "spec.maxUnavailable", 0),
            column(
                "Allowed Disruptions",
                "integer",
                "status.disruptionsAllowed",
                0,
            ),
            age,
        ],
        // pkg/printers/internalversion/printers.go, eventColumnDefinitions.
        ("", "events") => vec![
            column("Last Seen", "string", "Time of the latest occurrence.", 0),
            column("Type", "string", "Normal or Warning.", 0),
            column("Reason", "string", "Why the event happened.", 0),
            column("Object", "string", "The object the event is about.", 0),
            column("Subobject", "string", "The part of the object.", 1),
            column("Source", "string", "The component reporting the event.", 1),
            column("Message", "string", "A human-readable description.", 0),
            column("First Seen", "string", "Time of the first occurrence.", 1),
            column("Count", "string", "How often it happened.", 1),
            column(
                "Name",
                "string",
                "Name must be unique within a namespace.",
                1,
            ),
        ],
        _ => vec![name, age],
    }
}

/// How long ago `time` (RFC 3339) was, as kubectl's columns show it.
fn since(time: &Value) -> Option<String> {
    let time = time.as_str()?.parse::<jiff::Timestamp>().ok()?;
    let created = json!({"metadata": {"creationTimestamp": time.to_string()}});
    Some(age(&created))
}

fn event_cells(object: &Value) -> Vec<Value> {
    let first = since(&object["firstTimestamp"]).or_else(|| since(&object["eventTime"]));
    let last = since(&object["series"]["lastObservedTime"])
        .or_else(|| since(&object["lastTimestamp"]))
        .or_else(|| first.clone())
        .unwrap_or_else(|| "<unknown>".to_owned());
    let involved = &object["involvedObject"];
    let source = object["source"]["component"]
        .as_str()
        .or_else(|| object["reportingComponent"].as_str())
        .unwrap_or_default();
    let count = object["series"]["count"]
        .as_i64()
        .or_else(|| object["count"].as_i64())
        .unwrap_or(1);
    vec![
        json!(last),
        json!(text(&object["type"])),
        json!(text(&object["reason"])),
        json!(format!(
            "{}/{}",
            involved["kind"].as_str().unwrap_or_default().to_lowercase(),
            involved["name"].as_str().unwrap_or_default()
        )),
        json!(involved["fieldPath"].as_str().unwrap_or_default()),
        json!(source),
        json!(object["message"].as_str().unwrap_or_default()),
        json!(first.unwrap_or_else(|| "<unknown>".to_owned())),
        json!(count.to_string()),
        json!(object["metadata"]["name"]),
    ]
}

fn cells(kind: &ResourceType, object: &Value) -> Vec<Value> {
    let name = json!(object["metadata"]["name"]);
    let age = json!(age(object));
    match (kind.group.as_str(), kind.plural.as_str()) {
        ("", "pods") => {
            let containers = object["spec"]["containers"].as_array().map_or(0, Vec::len);
            let ready = object["status"]["containerStatuses"]
                .as_array()
                .map_or(0, |statuses| {
                    statuses.iter().filter(|s| s["ready"] == true).count()
                });
            let status = if object["metadata"]["deletionTimestamp"].is_string() {
                "Terminating".to_owned()
            } else {
                text(&object["status"]["phase"])
            };
            vec![
                name,
                json!(format!("{ready}/{containers}")),
                json!(status),
                json!("0"),
                age,
                json!(text(&object["status"]["podIP"])),
                json!(text(&object["spec"]["nodeName"])),
            ]
        }
        ("", "nodes") => {
            let ready = object["status"]["conditions"]
                .as_array()
                .and_then(|conditions| conditions.iter().find(|c| c["type"] == "Ready"))
                .map_or("Unknown", |c| {
                    if c["status"] == "True" {
                        "Ready"
                    } else {
                        "NotReady"
                    }
                });
            let status = if object["spec"]["unschedulable"] == true {
                format!("{ready},SchedulingDisabled")
            } else {
                ready.to_owned()
            };
            vec![
                name,
                json!(status),
                json!("<none>"),
                age,
                json!(text(&object["status"]["nodeInfo"]["kubeletVersion"])),
            ]
        }
        ("coordination.k8s.io", "leases") => {
            vec![name, json!(text(&object["spec"]["holderIdentity"])), age]
        }
        ("policy", "poddisruptionbudgets") => vec![
            name,
            json!(int_or_string(&object["spec"]["minAvailable"])),
            json!(int_or_string(&object["spec"]["maxUnavailable"])),
            json!(object["status"]["disruptionsAllowed"].as_i64().unwrap_or(0)),
            age,
        ],
        ("", "events") => event_cells(object),
        _ => vec![name, age],
    }
}

/// The rows' objects are PartialObjectMetadata, the default of `includeObject`.
pub fn table(
    kind: &ResourceType,
    items: &[Arc<Value>],
    revision: &str,
    next: Option<&str>,
) -> Value {
    let rows: Vec<Value> = items
        .iter()
        .map(|object| {
            json!({
                "cells": cells(kind, object),
                "object": {
                    "kind": "PartialObjectMetadata",
                    "apiVersion": "meta.k8s.io/v1",
                    "metadata": object["metadata"],
                },
            })
        })
        .collect();
    let mut metadata = json!({"resourceVersion": revision});
    if let Some(next) = next {
        metadata["continue"] = json!(next);
    }
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": metadata,
        "columnDefinitions": columns(kind),
        "rows": rows,
    })
}
