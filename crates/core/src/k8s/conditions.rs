//! Writing conditions through the status subresource, the way the kubelet does: a strategic
//! merge patch of just our condition (conditions merge by `type`), so we never overwrite what
//! other writers put in the status.

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, NodeCondition, Pod};
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;

use crate::k8s::nodes::NodeFields;

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

fn condition_entry(condition: &ConditionSpec, transition: Timestamp) -> serde_json::Value {
    json!({
        "type": condition.type_,
        "status": condition.status,
        "reason": condition.reason,
        "message": condition.message,
        "lastTransitionTime": transition.to_string(),
    })
}

/// The node's condition of `type_`.
pub fn node_condition<'a>(node: &'a impl NodeFields, type_: &str) -> Option<&'a NodeCondition> {
    node.conditions().iter().find(|c| c.type_ == type_)
}

/// When a condition is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConditionGuard {
    Always,
    /// Only over a current condition with this status: clearing a stale `True` must not add a
    /// condition where there was none.
    OnlyReplacing(&'static str),
    /// Only over a current condition of the type, whatever its status: a final word for a
    /// condition this program wrote, never a new condition on a node it never looked after.
    OnlyExisting,
}

impl ConditionGuard {
    pub fn admits(self, existing: Option<&NodeCondition>) -> bool {
        match self {
            Self::Always => true,
            Self::OnlyReplacing(status) => existing.is_some_and(|c| c.status == status),
            Self::OnlyExisting => existing.is_some(),
        }
    }
}

/// Sets a node condition, keeping `lastTransitionTime` when the status does not change, and
/// writing nothing when nothing changes (a heartbeat per reconcile would only churn watches).
pub async fn upsert_node_condition(
    nodes: &Api<Node>,
    node: &str,
    condition: &ConditionSpec,
) -> Result<ConditionChange, kube::Error> {
    let changes =
        upsert_node_conditions(nodes, node, &[(condition.clone(), ConditionGuard::Always)]).await?;
    Ok(changes[0])
}

/// [`upsert_node_condition`] for several conditions of one node in one read and at most one
/// patch, each only where its guard admits the current condition (`Unchanged` where it does
/// not). Later entries of a type win over earlier ones.
pub async fn upsert_node_conditions(
    nodes: &Api<Node>,
    node: &str,
    wanted: &[(ConditionSpec, ConditionGuard)],
) -> Result<Vec<ConditionChange>, kube::Error> {
    upsert_conditions_of(nodes, node, None, wanted).await
}

/// [`upsert_node_conditions`] on the Node object of `uid` only, when one is given: another
/// object of the name is left as it is (every change `Unchanged`), and the patch names the
/// UID, so a namesake registered between the read and the write refuses it (422).
pub async fn upsert_conditions_of(
    nodes: &Api<Node>,
    node: &str,
    uid: Option<&str>,
    wanted: &[(ConditionSpec, ConditionGuard)],
) -> Result<Vec<ConditionChange>, kube::Error> {
    let current = nodes.get_status(node).await?;
    if uid.is_some_and(|uid| current.metadata.uid.as_deref() != Some(uid)) {
        return Ok(vec![ConditionChange::Unchanged; wanted.len()]);
    }
    let now = Timestamp::now();
    let heartbeat = now.to_string();
    let mut changes = Vec::with_capacity(wanted.len());
    let mut entries = Vec::new();
    for (condition, guard) in wanted {
        let existing = node_condition(&current, &condition.type_);
        let change = if guard.admits(existing) {
            classify_change(existing, condition)
        } else {
            ConditionChange::Unchanged
        };
        changes.push(change);
        let transition = match (
            change,
            existing.and_then(|c| c.last_transition_time.as_ref()),
        ) {
            (ConditionChange::Unchanged, _) => continue,
            (ConditionChange::Updated, Some(since)) => since.0,
            _ => now,
        };
        let mut entry = condition_entry(condition, transition);
        entry["lastHeartbeatTime"] = json!(heartbeat);
        entries.push(entry);
    }
    if !entries.is_empty() {
        let mut patch = json!({"status": {"conditions": entries}});
        if let Some(uid) = uid {
            patch["metadata"] = json!({"uid": uid});
        }
        let written = nodes
            .patch_status(node, &PatchParams::default(), &Patch::Strategic(patch))
            .await;
        match written {
            // The UID named is not the object's: a namesake took the name since the read.
            Err(kube::Error::Api(status)) if uid.is_some() && status.code == 422 => {
                return Ok(vec![ConditionChange::Unchanged; wanted.len()]);
            }
            written => drop(written?),
        }
    }
    Ok(changes)
}

/// Sets a pod condition (e.g. `DisruptionTarget` before a deletion).
pub async fn set_pod_condition(
    pods: &Api<Pod>,
    pod: &str,
    condition: &ConditionSpec,
) -> Result<(), kube::Error> {
    let patch = json!({"status": {"conditions": [condition_entry(condition, Timestamp::now())]}});
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

    #[test]
    fn a_guarded_condition_replaces_only_the_named_status() {
        let condition = |status: &str| -> NodeCondition {
            serde_json::from_value(serde_json::json!({"type": "C", "status": status})).unwrap()
        };
        let clear = ConditionGuard::OnlyReplacing("True");
        assert!(clear.admits(Some(&condition("True"))));
        assert!(!clear.admits(Some(&condition("False"))));
        assert!(!clear.admits(None));
        assert!(ConditionGuard::Always.admits(None));
    }
}
