//! A Node as a controller that watches thousands of them keeps it: the metadata whole, and of
//! the spec and status only what the controllers read (the providerID, the taints, the cordon,
//! the conditions). A `k8s_openapi` `Node` is 1,496 bytes before its first string however
//! much of it is empty, its status alone 888 (`nodeInfo`, `config`, `daemonEndpoints` are
//! inline); this is 440. It is parsed from the API server's JSON directly, so the fields it
//! lacks are never allocated, and the same paths (`node.spec.taints`,
//! `node.status.conditions`) read the same fields as on a `Node`.
//!
//! Written back only as a JSON patch of what changed ([`crate::k8s::node_identity`]): a
//! whole-object update from it would drop every field it does not hold.

use k8s_openapi::api::core::v1::{Node, NodeCondition, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
pub struct CachedNode {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<CachedNodeSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<CachedNodeStatus>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
pub struct CachedNodeSpec {
    #[serde(
        rename = "providerID",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub provider_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub taints: Option<Vec<Taint>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unschedulable: Option<bool>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
pub struct CachedNodeStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<NodeCondition>>,
}

impl k8s_openapi::Resource for CachedNode {
    const API_VERSION: &'static str = <Node as k8s_openapi::Resource>::API_VERSION;
    const GROUP: &'static str = <Node as k8s_openapi::Resource>::GROUP;
    const KIND: &'static str = <Node as k8s_openapi::Resource>::KIND;
    const VERSION: &'static str = <Node as k8s_openapi::Resource>::VERSION;
    const URL_PATH_SEGMENT: &'static str = <Node as k8s_openapi::Resource>::URL_PATH_SEGMENT;
    type Scope = <Node as k8s_openapi::Resource>::Scope;
}

impl k8s_openapi::Metadata for CachedNode {
    type Ty = ObjectMeta;

    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl From<Node> for CachedNode {
    fn from(node: Node) -> Self {
        Self {
            metadata: node.metadata,
            spec: node.spec.map(|spec| CachedNodeSpec {
                provider_id: spec.provider_id,
                taints: spec.taints,
                unschedulable: spec.unschedulable,
            }),
            status: node.status.map(|status| CachedNodeStatus {
                conditions: status.conditions,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fields it keeps read the same from the API server's JSON as a `Node`'s do, and
    /// the rest are not kept.
    #[test]
    fn a_node_parses_into_the_fields_the_controllers_read() {
        let json = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": "n1", "uid": "u1", "resourceVersion": "7",
                "labels": {"pool": "a"}, "annotations": {"note": "x"},
                "finalizers": ["nodegrace.io/termination"]},
            "spec": {"providerID": "aws:///us-east-1a/i-1", "unschedulable": true,
                "podCIDR": "10.0.0.0/24",
                "taints": [{"key": "k", "value": "v", "effect": "NoSchedule"}]},
            "status": {"conditions": [{"type": "Ready", "status": "True",
                "lastTransitionTime": "2026-11-30T10:00:00Z"}],
                "nodeInfo": {"machineID": "m", "kernelVersion": "6"},
                "images": [{"names": ["busybox"], "sizeBytes": 1}]},
        });
        let cached: CachedNode = serde_json::from_value(json.clone()).unwrap();
        let whole: Node = serde_json::from_value(json).unwrap();
        assert_eq!(cached, CachedNode::from(whole));
        assert_eq!(
            cached.spec.as_ref().unwrap().provider_id.as_deref(),
            Some("aws:///us-east-1a/i-1")
        );
        let written = serde_json::to_value(&cached).unwrap();
        assert!(written["spec"].get("podCIDR").is_none());
        assert!(written["status"].get("nodeInfo").is_none());
        assert!(size_of::<CachedNode>() * 3 < size_of::<Node>());
    }
}
