//! Each NodeDisruptionBudget's nodes, and the nodes waiting for grants, kept up to date from
//! the watches by the leader's loop: a granting pass then looks at the nodes of the budgets it
//! judges, never at every cached node. A node's change costs a look at each budget's selector;
//! a budget's new selector costs one scan of the cache, once.
//!
//! Each node is kept with what the budgets read of it worked out once, when its watch event
//! came ([`IndexedNode`]): a rollout's passes count a budget's nodes several times each, and
//! need not work out readiness, finalizer and taints anew at every count.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::ResourceExt;
use nodegrace_core::k8s::cached_node::CachedNode;

use crate::api::NodeDisruptionBudget;
use crate::budget::NodeFacts;
use crate::grants::covers;
use crate::member::{Member, labels_of};

/// Per budget (by name): its nodes by name.
pub type Covered = HashMap<String, BTreeMap<String, Arc<IndexedNode>>>;

/// A cached Node (the cache's own copy, shared, not cloned) with its budget facts read.
#[derive(Debug)]
pub struct IndexedNode {
    node: Arc<CachedNode>,
    ready: bool,
    awaits_grants: bool,
    disrupting: bool,
}

impl IndexedNode {
    pub fn new(node: Arc<CachedNode>) -> Self {
        let NodeFacts {
            ready,
            awaits_grants,
            disrupting,
            ..
        } = node.facts();
        Self {
            node,
            ready,
            awaits_grants,
            disrupting,
        }
    }
}

impl Member for IndexedNode {
    fn facts(&self) -> NodeFacts<'_> {
        NodeFacts {
            name: self.node.metadata.name.as_deref().unwrap_or_default(),
            labels: labels_of(&self.node),
            ready: self.ready,
            deleting: self.node.deletion_asked().is_some(),
            awaits_grants: self.awaits_grants,
            disrupting: self.disrupting,
        }
    }

    fn uid(&self) -> Option<&str> {
        Member::uid(self.node.as_ref())
    }

    fn created(&self) -> Option<Timestamp> {
        self.node.created()
    }

    fn deletion_asked(&self) -> Option<Timestamp> {
        self.node.deletion_asked()
    }
}

/// Shared by the leader's loop, which keeps it, and the granting pass, which reads it.
#[derive(Debug, Default)]
pub struct BudgetIndex {
    inner: Mutex<Index>,
}

#[derive(Debug, Default)]
struct Index {
    /// Per budget (by name): the selector its nodes were picked by.
    selectors: HashMap<String, Option<LabelSelector>>,
    covered: Covered,
    /// Deleting, held by our finalizer, not yet cordoned; by name.
    waiting: BTreeMap<String, Arc<IndexedNode>>,
}

impl BudgetIndex {
    /// Picks the nodes of each budget whose selector is new (or changed) from `all_nodes` (the
    /// cache's), and forgets the budgets gone. Cheap when no selector changed: one comparison
    /// per budget, and no look at the nodes.
    pub fn sync_budgets(
        &self,
        budgets: &[Arc<NodeDisruptionBudget>],
        all_nodes: impl FnOnce() -> Vec<Arc<CachedNode>>,
    ) {
        let mut index = self.lock();
        let present = |name: &String| budgets.iter().any(|budget| budget.name_any() == *name);
        index.selectors.retain(|name, _| present(name));
        index.covered.retain(|name, _| present(name));
        let mut all_nodes = Some(all_nodes);
        let mut cached: Option<Vec<Arc<IndexedNode>>> = None;
        for budget in budgets {
            let name = budget.name_any();
            if index
                .selectors
                .get(&name)
                .is_some_and(|selector| *selector == budget.spec.selector)
            {
                continue;
            }
            let all = cached.get_or_insert_with(|| {
                all_nodes.take().map_or_else(Vec::new, |all_nodes| {
                    all_nodes()
                        .into_iter()
                        .map(|node| Arc::new(IndexedNode::new(node)))
                        .collect()
                })
            });
            let picked = all
                .iter()
                .filter(|node| covers(budget, &node.facts()))
                .map(|node| (node.facts().name.to_owned(), Arc::clone(node)))
                .collect();
            index
                .selectors
                .insert(name.clone(), budget.spec.selector.clone());
            index.covered.insert(name, picked);
        }
    }

    /// The node named `name` is now `node` (`None`: gone): its place in every budget and
    /// among the waiting nodes.
    pub fn node_changed(
        &self,
        name: &str,
        node: Option<Arc<CachedNode>>,
        budgets: &[Arc<NodeDisruptionBudget>],
    ) {
        let node = node.map(|node| Arc::new(IndexedNode::new(node)));
        let mut index = self.lock();
        match node.as_ref().filter(|node| {
            let facts = node.facts();
            facts.awaits_grants && !facts.disrupting
        }) {
            Some(waiting) => index.waiting.insert(name.to_owned(), Arc::clone(waiting)),
            None => index.waiting.remove(name),
        };
        for budget in budgets {
            let Some(covered) = index.covered.get_mut(&budget.name_any()) else {
                continue;
            };
            match node.as_ref().filter(|node| covers(budget, &node.facts())) {
                Some(node) => covered.insert(name.to_owned(), Arc::clone(node)),
                None => covered.remove(name),
            };
        }
    }

    /// Runs `read` over each budget's nodes and the waiting nodes, as they are now; the
    /// leader's loop waits meanwhile.
    pub fn read<R>(
        &self,
        read: impl FnOnce(&Covered, &BTreeMap<String, Arc<IndexedNode>>) -> R,
    ) -> R {
        let index = self.lock();
        read(&index.covered, &index.waiting)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Index> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
