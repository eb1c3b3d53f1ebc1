//! A node as the NodeDisruptionBudgets count it. The granting pass counts cached Nodes and
//! fresh reads alike; a fresh read keeps only what the budgets read
//! ([`crate::fresh_nodes::BudgetNode`]), as a rollout of thousands holds a read of its whole
//! pool while its drains run, and a `k8s_openapi` `Node` is 1,496 bytes before its first string.

use std::collections::BTreeMap;

use jiff::Timestamp;
use nodegrace_core::k8s::cached_node::CachedNode;
use nodegrace_core::k8s::nodes::{Readiness, readiness, taints};

use crate::api::{DISRUPTED_TAINT, FINALIZER};
use crate::budget::NodeFacts;

pub trait Member {
    fn facts(&self) -> NodeFacts<'_>;
    fn uid(&self) -> Option<&str>;
    /// When the Node object was created: a grant written without a UID counts only for a node
    /// created before it.
    fn created(&self) -> Option<Timestamp>;
    /// When its deletion was asked (`None`: not being deleted); waiting nodes are granted the
    /// oldest deletion first.
    fn deletion_asked(&self) -> Option<Timestamp>;
}

impl Member for CachedNode {
    fn facts(&self) -> NodeFacts<'_> {
        let deleting = self.metadata.deletion_timestamp.is_some();
        NodeFacts {
            name: self.metadata.name.as_deref().unwrap_or_default(),
            labels: labels_of(self),
            ready: readiness(self) == Readiness::Ready,
            deleting,
            awaits_grants: deleting
                && self
                    .metadata
                    .finalizers
                    .iter()
                    .flatten()
                    .any(|finalizer| finalizer == FINALIZER),
            disrupting: taints(self)
                .iter()
                .any(|taint| taint.key == DISRUPTED_TAINT && taint.effect == "NoSchedule"),
        }
    }

    fn uid(&self) -> Option<&str> {
        self.metadata.uid.as_deref()
    }

    fn created(&self) -> Option<Timestamp> {
        self.metadata.creation_timestamp.as_ref().map(|time| time.0)
    }

    fn deletion_asked(&self) -> Option<Timestamp> {
        self.metadata.deletion_timestamp.as_ref().map(|time| time.0)
    }
}

/// `node`'s labels; none is an empty set.
pub fn labels_of(node: &CachedNode) -> &BTreeMap<String, String> {
    static NO_LABELS: BTreeMap<String, String> = BTreeMap::new();
    node.metadata.labels.as_ref().unwrap_or(&NO_LABELS)
}
