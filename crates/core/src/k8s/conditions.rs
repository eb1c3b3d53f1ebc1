//! Writing conditions through the status subresource, the way the kubelet does: a strategic
//! merge patch of just our condition (conditions merge by `type`), so we never overwrite what
//! other writers put in the status.

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;

/// The condition to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConditionSpec<'a> {
    pub type_: &'a str,
    /// `True`, `False` or `Unknown`.
    pub status: &'a str,
    /// CamelCase, by API convention.
    pub reason: &'a str,
    pub message: &'a str,
}

/// What an upsert did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConditionChange {
    /// Same status, reason and message already there: nothing was written.
    Unchanged,
    /// Reason or message changed; `lastTransitionTime` kept.
    Updated,
    /// The status changed (or the condition is new): `lastTransitionTime` is now.
    Transitioned,
}

/// A strategic merge patch of the status with this one condition (conditions merge by `type`).
fn status_patch(condition: &ConditionSpec<'_>, transition: Timestamp) -> serde_json::Value {
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

/// Sets a node condition. `lastTransitionTime` changes only when the status does; the patch is
/// skipped entirely when nothing would change.
pub async fn upsert_node_condition(
    nodes: &Api<Node>,
    node: &str,
    condition: &ConditionSpec<'_>,
) -> Result<ConditionChange, kube::Error> {
    let current = nodes.get_status(node).await?;
    let existing = current
        .status
        .as_ref()
        .and_then(|status| status.conditions.as_ref())
        .and_then(|conditions| conditions.iter().find(|c| c.type_ == condition.type_))
        .map(|c| {
            (
                c.status.clone(),
                c.reason.clone().unwrap_or_default(),
                c.message.clone().unwrap_or_default(),
                c.last_transition_time.clone(),
            )
        });
    let now = Timestamp::now();
    let (change, transition) = match existing {
        Some((status, reason, message, _))
            if status == condition.status
                && reason == condition.reason
                && message == condition.message =>
        {
            return Ok(ConditionChange::Unchanged);
        }
        Some((status, _, _, Some(since))) if status == condition.status => {
            (ConditionChange::Updated, since.0)
        }
        _ => (ConditionChange::Transitioned, now),
    };
    let mut patch = status_patch(condition, transition);
    // Nodes report when the condition was last confirmed; pods have no such field.
    patch["status"]["conditions"][0]["lastHeartbeatTime"] = json!(now.to_string());
    nodes
        .patch_status(node, &PatchParams::default(), &Patch::Strategic(patch))
        .await?;
    Ok(change)
}

/// Sets a pod condition such as `DisruptionTarget` (pods/status, merged by `type`).
pub async fn set_pod_condition(
    pods: &Api<Pod>,
    pod: &str,
    condition: &ConditionSpec<'_>,
) -> Result<(), kube::Error> {
    let patch = status_patch(condition, Timestamp::now());
    pods.patch_status(pod, &PatchParams::default(), &Patch::Strategic(patch))
        .await?;
    Ok(())
}
