//! Writing conditions through the status subresource, the way the kubelet does: a strategic
//! merge patch of just our condition (conditions merge by `type`), so we never overwrite what
//! other writers put in the status.

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, NodeCondition, Pod};
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;

/// The condition to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConditionSpec {
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// CamelCase, by API convention.
    pub reason: String,
    pub message: String,
}

impl ConditionSpec {
    pub fn new(type_: &str, status: &str, reason: &str, message: impl Into<String>) -> Self {
        Self {
            type_: type_.to_owned(),
            status: status.to_owned(),
            reason: reason.to_owned(),
            message: message.into(),
        }
    }
}

/// What writing a condition did (or would do) to the node's current one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConditionChange {
    /// Status, reason and message were already as wanted: nothing written.
    Unchanged,
    /// Same status, new reason or message: `lastTransitionTime` is kept.
    Updated,
    /// New condition or new status: `lastTransitionTime` is now.
    Transitioned,
}

/// How `wanted` changes `existing`, by the API conventions on `lastTransitionTime`.
pub fn classify_change(
    existing: Option<&NodeCondition>,
    wanted: &ConditionSpec,
) -> ConditionChange {
    match existing {
        Some(current)
            if current.status == wanted.status
                && current.reason.as_deref() == Some(wanted.reason.as_str())
                && current.message.as_deref() == Some(wanted.message.as_str()) =>
        {
            ConditionChange::Unchanged
        }
        Some(current)
            if current.status == wanted.status && current.last_transition_time.is_some() =>
        {
            ConditionChange::Updated
        }
        _ => ConditionChange::Transitioned,
    }
}

fn status_patch(condition: &ConditionSpec, transition: Timestamp) -> serde_json::Value {
    json!({
        "status": {
            "conditions": [{
                "type": condition.type_,
                "status": condition.status,
                "reason": condition.reason,
                "message": condition.message,
                "lastTransitionTime": transition.to_string(),
            }]
        }
    })
}

/// The node's condition of `type_`.
pub fn node_condition<'a>(node: &'a Node, type_: &str) -> Option<&'a NodeCondition> {
    node.status
        .as_ref()
        .and_then(|status| status.conditions.as_ref())
        .and_then(|conditions| conditions.iter().find(|c| c.type_ == type_))
}

/// Sets a node condition, keeping `lastTransitionTime` when the status does not change, and
/// writing nothing when nothing changes (a heartbeat per reconcile would only churn watches).
pub async fn upsert_node_condition(
    nodes: &Api<Node>,
    node: &str,
    condition: &ConditionSpec,
) -> Result<ConditionChange, kube::Error> {
    upsert_node_condition_if(nodes, node, condition, |_| true).await
}

/// [`upsert_node_condition`] only when `guard` accepts the current condition (e.g. clear a
/// condition only if it is `True`); `Unchanged` when it does not.
pub async fn upsert_node_condition_if(
    nodes: &Api<Node>,
    node: &str,
    condition: &ConditionSpec,
    guard: impl FnOnce(Option<&NodeCondition>) -> bool,
) -> Result<ConditionChange, kube::Error> {
    let current = nodes.get_status(node).await?;
    let existing = node_condition(&current, &condition.type_);
    if !guard(existing) {
        return Ok(ConditionChange::Unchanged);
    }
    let change = classify_change(existing, condition);
    let now = Timestamp::now();
    let transition = match (
        change,
        existing.and_then(|c| c.last_transition_time.as_ref()),
    ) {
        (ConditionChange::Unchanged, _) => return Ok(change),
        (ConditionChange::Updated, Some(since)) => since.0,
        _ => now,
    };
    let mut patch = status_patch(condition, transition);
    patch["status"]["conditions"][0]["lastHeartbeatTime"] = json!(now.to_string());
    nodes
        .patch_status(node, &PatchParams::default(), &Patch::Strategic(patch))
        .await?;
    Ok(change)
}

/// Sets a pod condition (e.g. `DisruptionTarget` before a deletion).
pub async fn set_pod_condition(
    pods: &Api<Pod>,
    pod: &str,
    condition: &ConditionSpec,
) -> Result<(), kube::Error> {
    let patch = status_patch(condition, Timestamp::now());
    pods.patch_status(pod, &PatchParams::default(), &Patch::Strategic(patch))
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_change_keeps_the_transition_time_only_when_the_status_stays() {
        let existing =
            |value: serde_json::Value| -> NodeCondition { serde_json::from_value(value).unwrap() };
        let wanted = ConditionSpec::new("ShutdownInhibited", "True", "ActiveLeases", "a");
        let since = "2026-01-01T00:00:00Z";
        let cases = [
            (None, ConditionChange::Transitioned),
            (
                Some(existing(
                    json!({"type": "ShutdownInhibited", "status": "True", "reason": "ActiveLeases", "message": "a", "lastTransitionTime": since}),
                )),
                ConditionChange::Unchanged,
            ),
            (
                Some(existing(
                    json!({"type": "ShutdownInhibited", "status": "True", "reason": "ActiveLeases", "message": "b", "lastTransitionTime": since}),
                )),
                ConditionChange::Updated,
            ),
            (
                Some(existing(
                    json!({"type": "ShutdownInhibited", "status": "True", "reason": "Other", "message": "a"}),
                )),
                ConditionChange::Transitioned,
            ),
            (
                Some(existing(
                    json!({"type": "ShutdownInhibited", "status": "False", "reason": "ActiveLeases", "message": "a", "lastTransitionTime": since}),
                )),
                ConditionChange::Transitioned,
            ),
        ];
        for (current, expected) in cases {
            assert_eq!(
                classify_change(current.as_ref(), &wanted),
                expected,
                "{current:?}"
            );
        }
    }
}
