//! The object state the simulated controllers share: conditions and tolerations.

use serde_json::{Value, json};

/// Whether `object` (a pod or a node) has condition `Ready` with status `True`.
pub fn is_ready(object: &Value) -> bool {
    object["status"]["conditions"]
        .as_array()
        .is_some_and(|conditions| {
            conditions
                .iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
}

/// podutil's `UpdatePodCondition` on JSON: sets the condition of `condition`'s type, keeping the
/// others and, while its status stays the same, its `lastTransitionTime`; nothing changes when
/// only the times would (the store then skips the write).
pub fn set_condition(object: &mut Value, condition: Value, now: &str) {
    let mut condition = condition;
    if !object["status"]["conditions"].is_array() {
        object["status"]["conditions"] = json!([]);
    }
    let Some(conditions) = object["status"]["conditions"].as_array_mut() else {
        return;
    };
    let existing = conditions
        .iter_mut()
        .find(|c| c["type"] == condition["type"]);
    let Some(existing) = existing else {
        condition["lastTransitionTime"] = json!(now);
        conditions.push(condition);
        return;
    };
    let same = ["status", "reason", "message"]
        .iter()
        .all(|field| existing[field] == condition[field]);
    if same {
        return;
    }
    condition["lastTransitionTime"] = if existing["status"] == condition["status"] {
        existing["lastTransitionTime"].clone()
    } else {
        json!(now)
    };
    *existing = condition;
}

/// Whether `pod` has finished: Succeeded or Failed, phases it never leaves.
pub fn is_finished(pod: &Value) -> bool {
    matches!(
        pod["status"]["phase"].as_str(),
        Some("Succeeded" | "Failed")
    )
}

/// KEP-2268's taint, put on a node whose machine the operator confirmed is off.
pub const OUT_OF_SERVICE_TAINT: &str = "node.kubernetes.io/out-of-service";

/// Whether `node` has a taint with the out-of-service key (any value or effect: the pod GC and
/// the attach/detach controller look at the key only).
pub fn is_out_of_service(node: &Value) -> bool {
    node["spec"]["taints"]
        .as_array()
        .is_some_and(|taints| taints.iter().any(|t| t["key"] == OUT_OF_SERVICE_TAINT))
}

fn text(value: &Value) -> &str {
    value.as_str().unwrap_or_default()
}

/// Kubernetes' `ToleratesTaint` on JSON: empty effect matches all effects, empty key with
/// `Exists` matches all taints, `Equal` (the default) compares values.
pub fn tolerates(toleration: &Value, taint: &Value) -> bool {
    let effect = text(&toleration["effect"]);
    let key = text(&toleration["key"]);
    (effect.is_empty() || effect == text(&taint["effect"]))
        && (key.is_empty() || key == text(&taint["key"]))
        && match text(&toleration["operator"]) {
            "Exists" => true,
            "" | "Equal" => text(&toleration["value"]) == text(&taint["value"]),
            _ => false,
        }
}

/// The pod spec's tolerations that tolerate `taint`.
pub fn tolerations_for<'a>(
    pod_spec: &'a Value,
    taint: &'a Value,
) -> impl Iterator<Item = &'a Value> {
    pod_spec["tolerations"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(move |t| tolerates(t, taint))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn toleration_matching() {
        let taint = json!({"key": "k", "value": "v", "effect": "NoExecute"});
        assert!(tolerates(&json!({"operator": "Exists"}), &taint));
        assert!(tolerates(&json!({"key": "k", "value": "v"}), &taint));
        assert!(!tolerates(&json!({"key": "k", "value": "w"}), &taint));
        assert!(!tolerates(
            &json!({"key": "k", "operator": "Exists", "effect": "NoSchedule"}),
            &taint
        ));
        assert!(is_ready(
            &json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}})
        ));
        assert!(!is_ready(&json!({})));
    }
}
