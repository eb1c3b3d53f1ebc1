//! Node facts every program asks: is it Ready, does it carry a taint, and how an Event or a
//! reference names it.

use k8s_openapi::api::core::v1::{Node, NodeCondition, ObjectReference, Taint};

use crate::k8s::cached_node::CachedNode;

/// The Ready condition's status, as the node lifecycle controller and kubectl read it: a node
/// without a Ready condition has not reported yet and counts as Unknown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Readiness {
    Ready,
    NotReady,
    Unknown,
}

/// What the programs read of a Node's spec and status, whether they hold it whole (a fresh
/// read) or as a cache of thousands keeps it ([`CachedNode`]).
pub trait NodeFields: kube::Resource<DynamicType = ()> {
    fn conditions(&self) -> &[NodeCondition];
    fn taints(&self) -> &[Taint];
    /// The taints of an object about to be written, made present if they were not.
    fn taints_mut(&mut self) -> &mut Vec<Taint>;
    fn unschedulable(&self) -> bool;
    fn provider_id(&self) -> Option<&str>;
}

/// A `Node` and a [`CachedNode`] hold these fields under the same paths.
macro_rules! node_fields {
    ($($node:ty),*) => {$(
        impl NodeFields for $node {
            fn conditions(&self) -> &[NodeCondition] {
                self.status
                    .as_ref()
                    .and_then(|status| status.conditions.as_deref())
                    .unwrap_or_default()
            }

            fn taints(&self) -> &[Taint] {
                self.spec
                    .as_ref()
                    .and_then(|spec| spec.taints.as_deref())
                    .unwrap_or_default()
            }

            fn taints_mut(&mut self) -> &mut Vec<Taint> {
                self.spec
                    .get_or_insert_with(Default::default)
                    .taints
                    .get_or_insert_with(Vec::new)
            }

            fn unschedulable(&self) -> bool {
                self.spec
                    .as_ref()
                    .and_then(|spec| spec.unschedulable)
                    .unwrap_or(false)
            }

            fn provider_id(&self) -> Option<&str> {
                self.spec.as_ref()?.provider_id.as_deref()
            }
        }
    )*};
}

node_fields!(Node, CachedNode);

pub fn readiness(node: &impl NodeFields) -> Readiness {
    let status = node
        .conditions()
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|ready| ready.status.as_str());
    match status {
        Some("True") => Readiness::Ready,
        Some("False") => Readiness::NotReady,
        _ => Readiness::Unknown,
    }
}

pub fn taints(node: &impl NodeFields) -> &[Taint] {
    node.taints()
}

/// The first taint with `key`, whatever its value and effect.
pub fn taint_with_key<'a>(node: &'a impl NodeFields, key: &str) -> Option<&'a Taint> {
    node.taints().iter().find(|taint| taint.key == key)
}

/// Whether the node has a condition of `type_` with `status`.
pub fn has_condition(node: &impl NodeFields, type_: &str, status: &str) -> bool {
    node.conditions()
        .iter()
        .any(|c| c.type_ == type_ && c.status == status)
}

/// Drops from a cached Node what no controller of ours reads (managedFields, the image list,
/// the volumes, addresses, capacity): with thousands of nodes, the cache keeps what is used.
pub fn trim_for_cache(node: &mut Node) {
    node.metadata.managed_fields = None;
    if let Some(status) = node.status.as_mut() {
        status.images = None;
        status.volumes_in_use = None;
        status.volumes_attached = None;
        status.node_info = None;
        status.addresses = None;
        status.capacity = None;
        status.allocatable = None;
        status.daemon_endpoints = None;
    }
}

/// The reference Events about a node carry. Its uid is the node's name, as the kubelet records
/// node Events, so `kubectl describe node` finds them.
pub fn node_reference(name: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".to_owned()),
        kind: Some("Node".to_owned()),
        name: Some(name.to_owned()),
        uid: Some(name.to_owned()),
        ..ObjectReference::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(value: &serde_json::Value) -> Node {
        serde_json::from_value(value.clone()).unwrap()
    }

    #[test]
    fn readiness_follows_the_ready_condition() {
        let cases = [
            (json!({}), Readiness::Unknown),
            (
                json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}}),
                Readiness::Ready,
            ),
            (
                json!({"status": {"conditions": [{"type": "Ready", "status": "False"}]}}),
                Readiness::NotReady,
            ),
            (
                json!({"status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}}),
                Readiness::Unknown,
            ),
            (
                json!({"status": {"conditions": [{"type": "MemoryPressure", "status": "True"}]}}),
                Readiness::Unknown,
            ),
        ];
        for (value, expected) in cases {
            assert_eq!(readiness(&node(&value)), expected, "{value}");
        }
    }

    #[test]
    fn taints_and_conditions_are_found_by_key_and_type() {
        let marked = node(&json!({
            "spec": {"taints": [{"key": "a", "effect": "NoSchedule"}, {"key": "b", "value": "x", "effect": "NoExecute"}]},
            "status": {"conditions": [{"type": "GracefulShutdown", "status": "True"}]},
        }));
        assert_eq!(
            taint_with_key(&marked, "b").map(|t| t.effect.as_str()),
            Some("NoExecute")
        );
        assert!(taint_with_key(&marked, "c").is_none());
        assert!(taint_with_key(&node(&json!({})), "a").is_none());
        assert!(has_condition(&marked, "GracefulShutdown", "True"));
        assert!(!has_condition(&marked, "GracefulShutdown", "False"));
        assert!(!has_condition(
            &node(&json!({})),
            "GracefulShutdown",
            "True"
        ));
    }

    #[test]
    fn node_events_are_keyed_by_name_like_the_kubelets() {
        let reference = node_reference("n1");
        assert_eq!(reference.kind.as_deref(), Some("Node"));
        assert_eq!(reference.uid.as_deref(), Some("n1"));
        assert_eq!(reference.namespace, None);
    }
}
