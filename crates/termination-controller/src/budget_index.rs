//! Each NodeDisruptionBudget's nodes, and the nodes waiting for grants, kept up to date from
//! the watches by the leader's loop: a granting pass then looks at the nodes of the budgets it
//! judges, never at every cached node. A node's change costs a look at each budget's selector;
//! a budget's new selector costs one scan of the cache, once.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::ResourceExt;

use crate::api::NodeDisruptionBudget;
use crate::grants::covers;
use crate::member::Member;

/// Shared by the leader's loop, which keeps it, and the granting pass, which reads it.
#[derive(Debug, Default)]
pub struct BudgetIndex {
    inner: Mutex<Index>,
}

#[derive(Debug, Default)]
struct Index {
    /// Per budget (by name): the selector its nodes were picked by.
    selectors: HashMap<String, Option<LabelSelector>>,
    /// Per budget (by name): the names of the nodes it covers.
    covered: HashMap<String, BTreeSet<String>>,
    /// Deleting, held by our finalizer, not yet cordoned.
    waiting: BTreeSet<String>,
}

impl BudgetIndex {
    /// Picks the nodes of each budget whose selector is new (or changed) from `all_nodes` (the
    /// cache's), and forgets the budgets gone. Cheap when no selector changed: one comparison
    /// per budget, and no look at the nodes.
    pub fn sync_budgets(
        &self,
        budgets: &[Arc<NodeDisruptionBudget>],
        all_nodes: impl FnOnce() -> Vec<Arc<Node>>,
    ) {
        let mut index = self.lock();
        let present = |name: &String| budgets.iter().any(|budget| budget.name_any() == *name);
        index.selectors.retain(|name, _| present(name));
        index.covered.retain(|name, _| present(name));
        let mut all_nodes = Some(all_nodes);
        let mut cached: Option<Vec<Arc<Node>>> = None;
        for budget in budgets {
            let name = budget.name_any();
            if index
                .selectors
                .get(&name)
                .is_some_and(|selector| *selector == budget.spec.selector)
            {
                continue;
            }
            if cached.is_none() {
                cached = all_nodes.take().map(|all_nodes| all_nodes());
            }
            let all = cached.as_deref().unwrap_or_default();
            let picked = all
                .iter()
                .filter(|node| covers(budget, &node.facts()))
                .map(|node| node.name_any())
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
        node: Option<&Node>,
        budgets: &[Arc<NodeDisruptionBudget>],
    ) {
        let mut index = self.lock();
        let facts = node.map(Member::facts);
        let waiting = facts
            .as_ref()
            .is_some_and(|facts| facts.awaits_grants && !facts.disrupting);
        if waiting {
            index.waiting.insert(name.to_owned());
        } else {
            index.waiting.remove(name);
        }
        for budget in budgets {
            let Some(covered) = index.covered.get_mut(&budget.name_any()) else {
                continue;
            };
            if facts.as_ref().is_some_and(|facts| covers(budget, facts)) {
                covered.insert(name.to_owned());
            } else {
                covered.remove(name);
            }
        }
    }

    /// Runs `read` over each budget's nodes (names by budget name) and the waiting nodes'
    /// names, as they are now; the leader's loop waits meanwhile.
    pub fn read<R>(
        &self,
        read: impl FnOnce(&HashMap<String, BTreeSet<String>>, &BTreeSet<String>) -> R,
    ) -> R {
        let index = self.lock();
        read(&index.covered, &index.waiting)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Index> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
