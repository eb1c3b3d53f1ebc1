//! The four patch types the API server accepts: JSON merge patch (RFC 7386), JSON patch
//! (RFC 6902), strategic merge patch (list merge keys for the fields our components touch) and
//! server-side apply (simplified; see README).

use serde_json::{Map, Value};

use crate::error::ApiError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    Merge,
    Json,
    StrategicMerge,
    Apply,
}

impl PatchType {
    pub fn from_content_type(content_type: &str) -> Option<Self> {
        let media = content_type.split(';').next().unwrap_or_default().trim();
        match media {
            "application/merge-patch+json" => Some(Self::Merge),
            "application/json-patch+json" => Some(Self::Json),
            "application/strategic-merge-patch+json" => Some(Self::StrategicMerge),
            "application/apply-patch+yaml" | "application/apply-patch+cbor" => Some(Self::Apply),
            _ => None,
        }
    }
}

/// Parses a patch body (YAML is accepted for apply, as the API server does).
pub fn parse_body(patch_type: PatchType, body: &[u8]) -> Result<Value, ApiError> {
    let parsed = if patch_type == PatchType::Apply {
        serde_yaml_ng::from_slice::<Value>(body).map_err(|e| e.to_string())
    } else {
        serde_json::from_slice::<Value>(body).map_err(|e| e.to_string())
    };
    parsed.map_err(|error| ApiError::bad_request(format!("error decoding patch: {error}")))
}

/// Applies `patch` to `current`. Strategic merge is rejected for custom resources, as the API
/// server does, because they have no patch metadata.
pub fn apply(
    current: &Value,
    patch_type: PatchType,
    patch: &Value,
    custom_resource: bool,
) -> Result<Value, ApiError> {
    match patch_type {
        PatchType::Merge => {
            let mut result = current.clone();
            json_patch::merge(&mut result, patch);
            Ok(result)
        }
        PatchType::Json => {
            let operations: json_patch::Patch =
                serde_json::from_value(patch.clone()).map_err(|error| {
                    ApiError::bad_request(format!("the JSON patch is malformed: {error}"))
                })?;
            let mut result = current.clone();
            json_patch::patch(&mut result, &operations).map_err(|error| {
                ApiError::invalid("", "JSONPatch", "", &[crate::error::Cause {
                    reason: "FieldValueInvalid",
                    field: error.path.to_string(),
                    message: format!("the server rejected our request due to an error in our request: {error}"),
                }])
            })?;
            Ok(result)
        }
        PatchType::StrategicMerge if custom_resource => Err(ApiError::unsupported_media_type(
            "application/strategic-merge-patch+json is not supported for custom resources",
        )),
        PatchType::StrategicMerge | PatchType::Apply => Ok(strategic_merge(current, patch, "")),
    }
}

/// How a list field merges: by a key field, as a set of primitives, or (the default for lists
/// without patch metadata, e.g. tolerations and taints) replaced whole.
pub(crate) fn list_strategy(field: &str) -> Option<&'static str> {
    match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "volumes"
        | "env"
        | "imagePullSecrets"
        | "webhooks"
        // lifecycle.k8s.io's Eviction status (`+listType=map +listMapKey=name`).
        | "responders"
        | "targetResponders"
        | "requesters" => Some("name"),
        "conditions" | "addresses" => Some("type"),
        "ownerReferences" => Some("uid"),
        "ports" => Some("containerPort"),
        "volumeMounts" => Some("mountPath"),
        "finalizers" => Some(""),
        _ => None,
    }
}

fn strategic_merge(current: &Value, patch: &Value, field: &str) -> Value {
    match (current, patch) {
        (Value::Object(current), Value::Object(patch)) => {
            if patch.get("$patch").and_then(Value::as_str) == Some("replace") {
                let mut replaced = patch.clone();
                replaced.remove("$patch");
                return Value::Object(replaced);
            }
            let mut result = current.clone();
            for (key, value) in patch {
                if key.starts_with("$setElementOrder/") || key == "$retainKeys" || key == "$patch" {
                    continue;
                }
                if let Some(list) = key.strip_prefix("$deleteFromPrimitiveList/") {
                    if let (Some(Value::Array(items)), Some(remove)) =
                        (result.get_mut(list), value.as_array())
                    {
                        items.retain(|item| !remove.contains(item));
                    }
                    continue;
                }
                if value.is_null() {
                    result.remove(key);
                    continue;
                }
                let merged = match result.get(key) {
                    Some(existing) => strategic_merge(existing, value, key),
                    None => strip_directives(value),
                };
                result.insert(key.clone(), merged);
            }
            Value::Object(result)
        }
        (Value::Array(current), Value::Array(patch)) => match list_strategy(field) {
            Some("") => {
                let mut merged = current.clone();
                for item in patch {
                    if !merged.contains(item) {
                        merged.push(item.clone());
                    }
                }
                Value::Array(merged)
            }
            Some(merge_key) => Value::Array(merge_keyed(current, patch, merge_key)),
            None => strip_directives(&Value::Array(patch.clone())),
        },
        (_, patch) => strip_directives(patch),
    }
}

fn merge_keyed(current: &[Value], patch: &[Value], merge_key: &str) -> Vec<Value> {
    let mut merged: Vec<Value> = current.to_vec();
    for item in patch {
        let key = &item[merge_key];
        let position = merged
            .iter()
            .position(|existing| &existing[merge_key] == key);
        if item.get("$patch").and_then(Value::as_str) == Some("delete") {
            if let Some(position) = position {
                merged.remove(position);
            }
            continue;
        }
        match position {
            Some(position) => merged[position] = strategic_merge(&merged[position], item, ""),
            None => merged.push(strip_directives(item)),
        }
    }
    merged
}

/// New values carry no `$` directives into the stored object.
fn strip_directives(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(key, _)| !key.starts_with('$'))
                .map(|(key, value)| (key.clone(), strip_directives(value)))
                .collect::<Map<String, Value>>(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(strip_directives).collect()),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn content_types_map_to_patch_types() {
        assert_eq!(
            PatchType::from_content_type("application/merge-patch+json"),
            Some(PatchType::Merge)
        );
        assert_eq!(
            PatchType::from_content_type("application/strategic-merge-patch+json; charset=utf-8"),
            Some(PatchType::StrategicMerge)
        );
        assert_eq!(
            PatchType::from_content_type("application/apply-patch+yaml"),
            Some(PatchType::Apply)
        );
        assert_eq!(PatchType::from_content_type("application/json"), None);
    }

    #[test]
    fn merge_patch_replaces_lists_and_deletes_nulls() {
        let current = json!({"metadata": {"labels": {"a": "1", "b": "2"}}, "spec": {"taints": [{"key": "x"}]}});
        let patch = json!({"metadata": {"labels": {"b": null, "c": "3"}}, "spec": {"taints": []}});
        let result = apply(&current, PatchType::Merge, &patch, false).unwrap();
        assert_eq!(
            result,
            json!({"metadata": {"labels": {"a": "1", "c": "3"}}, "spec": {"taints": []}})
        );
    }

    #[test]
    fn json_patch_operations_and_failed_tests() {
        let current = json!({"metadata": {"labels": {"a": "1"}}});
        let patch = json!([{"op": "add", "path": "/metadata/labels/b", "value": "2"}, {"op": "remove", "path": "/metadata/labels/a"}]);
        assert_eq!(
            apply(&current, PatchType::Json, &patch, false).unwrap(),
            json!({"metadata": {"labels": {"b": "2"}}})
        );
        let failing = json!([{"op": "test", "path": "/metadata/labels/a", "value": "9"}]);
        assert_eq!(
            apply(&current, PatchType::Json, &failing, false)
                .unwrap_err()
                .code,
            422
        );
        assert_eq!(
            apply(&current, PatchType::Json, &json!({"op": "add"}), false)
                .unwrap_err()
                .code,
            400
        );
    }

    #[test]
    fn strategic_merge_uses_merge_keys_and_replaces_taints_and_tolerations() {
        let current = json!({
            "spec": {"containers": [{"name": "a", "image": "1"}, {"name": "b", "image": "1"}], "tolerations": [{"key": "x"}], "taints": [{"key": "t1"}]},
            "status": {"conditions": [{"type": "Ready", "status": "True"}, {"type": "Other", "status": "False"}]},
            "metadata": {"finalizers": ["f1"]}
        });
        let patch = json!({
            "spec": {"containers": [{"name": "b", "image": "2"}, {"name": "c", "image": "3"}], "tolerations": [{"key": "y"}], "taints": [{"key": "t2"}]},
            "status": {"conditions": [{"type": "Ready", "status": "False"}, {"type": "Other", "$patch": "delete"}]},
            "metadata": {"finalizers": ["f2"]}
        });
        let result = apply(&current, PatchType::StrategicMerge, &patch, false).unwrap();
        assert_eq!(
            result["spec"]["containers"],
            json!([{"name": "a", "image": "1"}, {"name": "b", "image": "2"}, {"name": "c", "image": "3"}])
        );
        assert_eq!(result["spec"]["tolerations"], json!([{"key": "y"}]));
        assert_eq!(result["spec"]["taints"], json!([{"key": "t2"}]));
        assert_eq!(
            result["status"]["conditions"],
            json!([{"type": "Ready", "status": "False"}])
        );
        assert_eq!(result["metadata"]["finalizers"], json!(["f1", "f2"]));
        let removed = apply(
            &result,
            PatchType::StrategicMerge,
            &json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["f1"]}}),
            false,
        )
        .unwrap();
        assert_eq!(removed["metadata"]["finalizers"], json!(["f2"]));
    }

    #[test]
    fn strategic_merge_is_refused_for_custom_resources() {
        assert_eq!(
            apply(&json!({}), PatchType::StrategicMerge, &json!({}), true)
                .unwrap_err()
                .code,
            415
        );
    }

    #[test]
    fn apply_bodies_may_be_yaml() {
        let body = parse_body(PatchType::Apply, b"metadata:\n  labels:\n    a: b\n").unwrap();
        assert_eq!(body, json!({"metadata": {"labels": {"a": "b"}}}));
        assert_eq!(parse_body(PatchType::Merge, b"{").unwrap_err().code, 400);
    }
}
