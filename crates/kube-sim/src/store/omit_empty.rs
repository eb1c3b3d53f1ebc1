//! Go's `omitempty` as the API server's JSON encoding applies it: a list or map field tagged so
//! and left empty (`ownerReferences: []`, `taints: []`, `labels: {}`) is not written at all.
//! Every kind's `metadata` is an `ObjectMeta` (a custom resource's is decoded into one too);
//! the other fields are those of built-in kinds tagged `omitempty` in every type that has them.

use serde_json::Value;

use crate::resources::ResourceType;

/// ObjectMeta's lists and maps, all `omitempty`.
const OBJECT_META: &[&str] = &[
    "ownerReferences",
    "finalizers",
    "managedFields",
    "labels",
    "annotations",
];

/// Fields of built-in kinds tagged `omitempty` wherever they appear (NodeSpec.Taints,
/// PodSpec.Tolerations, NodeStatus.VolumesInUse/VolumesAttached, NamespaceSpec.Finalizers,
/// PodDisruptionBudgetStatus.DisruptedPods, ConfigMap/Secret data, …) besides ObjectMeta's.
const BUILT_IN: &[&str] = &[
    "taints",
    "tolerations",
    "volumesInUse",
    "volumesAttached",
    "disruptedPods",
    "data",
    "binaryData",
    "imagePullSecrets",
];

/// Subtrees whose keys are the user's, not a Go type's fields.
const USER_KEYED: &[&str] = &[
    "labels",
    "annotations",
    "data",
    "binaryData",
    "stringData",
    "openAPIV3Schema",
];

fn empty(value: &Value) -> bool {
    match value {
        Value::Array(items) => items.is_empty(),
        Value::Object(map) => map.is_empty(),
        _ => false,
    }
}

pub fn omit_empty(kind: &ResourceType, object: &mut Value) {
    if kind.custom {
        if let Some(metadata) = object["metadata"].as_object_mut() {
            metadata.retain(|key, value| !(OBJECT_META.contains(&key.as_str()) && empty(value)));
        }
        return;
    }
    walk(object);
}

fn walk(value: &mut Value) {
    match value {
        Value::Object(map) => {
            map.retain(|key, value| {
                let key = key.as_str();
                !((OBJECT_META.contains(&key) || BUILT_IN.contains(&key)) && empty(value))
            });
            for (key, child) in map.iter_mut() {
                if !USER_KEYED.contains(&key.as_str()) {
                    walk(child);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(walk),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::omit_empty;
    use crate::resources::Registry;

    #[test]
    fn empty_tagged_fields_go_and_the_users_keys_stay() {
        let registry = Registry::default();
        let pods = registry.find("", "v1", "pods").unwrap();
        let mut pod = json!({
            "metadata": {"name": "p", "ownerReferences": [], "labels": {}, "annotations": {"finalizers": ""}},
            "spec": {"containers": [], "tolerations": [], "template": {"metadata": {"finalizers": []}}},
        });
        omit_empty(&pods, &mut pod);
        assert_eq!(
            pod,
            json!({
                "metadata": {"name": "p", "annotations": {"finalizers": ""}},
                "spec": {"containers": [], "template": {"metadata": {}}},
            })
        );
    }

    #[test]
    fn a_custom_resource_keeps_its_own_empty_fields() {
        let registry = Registry::default();
        let mut kind = (*registry.find("", "v1", "pods").unwrap()).clone();
        kind.custom = true;
        let mut object = json!({"metadata": {"finalizers": []}, "spec": {"taints": []}});
        omit_empty(&kind, &mut object);
        assert_eq!(object, json!({"metadata": {}, "spec": {"taints": []}}));
    }
}
