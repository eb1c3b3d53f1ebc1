//! Pods by the node they are bound to, as the real API server's watch cache indexes
//! `spec.nodeName`: a kubelet's or a node controller's pod list costs that node's pods, not
//! the cluster's.

use std::collections::{BTreeSet, HashMap};

use serde_json::Value;

use super::ObjectKey;

#[derive(Debug, Default)]
pub(super) struct PodsByNode {
    nodes: HashMap<String, BTreeSet<ObjectKey>>,
}

impl PodsByNode {
    /// Follows a pod from `before` to `after` (either absent for a create or a delete).
    pub fn record(&mut self, key: &ObjectKey, before: Option<&Value>, after: Option<&Value>) {
        let (was, is) = (before.and_then(node_of), after.and_then(node_of));
        if was == is {
            return;
        }
        if let Some(was) = was
            && let Some(keys) = self.nodes.get_mut(was)
        {
            keys.remove(key);
            if keys.is_empty() {
                self.nodes.remove(was);
            }
        }
        if let Some(is) = is {
            self.nodes
                .entry(is.to_owned())
                .or_default()
                .insert(key.clone());
        }
    }

    /// The keys of the pods bound to `node`, in key order.
    pub fn on(&self, node: &str) -> impl Iterator<Item = &ObjectKey> {
        self.nodes.get(node).into_iter().flatten()
    }
}

/// Unbound pods (an empty `spec.nodeName`) are not indexed: a list of them scans.
fn node_of(pod: &Value) -> Option<&str> {
    pod["spec"]["nodeName"]
        .as_str()
        .filter(|node| !node.is_empty())
}
