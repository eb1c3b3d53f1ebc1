//! One fresh read's nodes, and each budget's count of them made once per read. A rollout's
//! cordons each check their budget on a fresh read before they start ([`Budgets::overspent`]),
//! and hundreds of them share one read: counting the read's thousands of nodes anew for each
//! check made the checks of a rollout cost its size squared. A count made once leaves each
//! check the budget's grants to look up.
//!
//! [`Budgets::overspent`]: crate::grants::Budgets::overspent

use std::collections::HashMap;
use std::ops::Deref;
use std::sync::{Arc, Mutex, PoisonError};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use crate::api::NodeDisruptionBudget;
use crate::budget::{Limit, Numbers, available_unless_granted};
use crate::fresh_nodes::BudgetNode;
use crate::grants::covers;
use crate::member::Member;

/// The nodes of one read, in the order the API server listed them.
#[derive(Debug)]
pub struct NodesRead {
    nodes: Vec<Arc<BudgetNode>>,
    /// Per budget (by name), made at the first check that asks.
    counts: Mutex<HashMap<String, Arc<Count>>>,
}

/// How a budget's selector counts a read's nodes, its grants aside.
#[derive(Debug)]
struct Count {
    /// The selector counted by: a budget whose selector changed is counted anew.
    selector: Option<LabelSelector>,
    expected: i32,
    /// The selected nodes that are available unless the budget granted them, by name.
    available: Vec<Arc<BudgetNode>>,
    /// How many of those the budget's version (by resourceVersion) granted: the hundreds of
    /// cordons sharing a read mostly check one version of the budget, whose grants number
    /// the rollout's disruptions, and need not each look every grant up.
    granted: Mutex<Option<(String, usize)>>,
}

impl NodesRead {
    pub fn new(nodes: Vec<Arc<BudgetNode>>) -> Self {
        Self {
            nodes,
            counts: Mutex::default(),
        }
    }

    /// `budget`'s numbers over this read with `limit`: what
    /// [`budget_numbers`](crate::grants::budget_numbers) counts over the same nodes, at the
    /// cost of its grants once the read has been counted for it.
    pub fn numbers(&self, budget: &NodeDisruptionBudget, limit: Limit) -> Numbers {
        let count = self.count_for(budget);
        let available = count.available.len() - count.granted(budget);
        Numbers::counted(
            limit,
            count.expected,
            i32::try_from(available).unwrap_or(i32::MAX),
        )
    }

    fn count_for(&self, budget: &NodeDisruptionBudget) -> Arc<Count> {
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        let name = budget.metadata.name.as_deref().unwrap_or_default();
        if let Some(count) = counts
            .get(name)
            .filter(|count| count.selector == budget.spec.selector)
        {
            return Arc::clone(count);
        }
        let mut expected = 0;
        let mut available = Vec::new();
        for node in &self.nodes {
            let facts = node.facts();
            if covers(budget, &facts) {
                expected += 1;
                if available_unless_granted(&facts) {
                    available.push(Arc::clone(node));
                }
            }
        }
        available.sort_by(|a, b| a.facts().name.cmp(b.facts().name));
        let count = Arc::new(Count {
            selector: budget.spec.selector.clone(),
            expected,
            available,
            granted: Mutex::default(),
        });
        counts.insert(name.to_owned(), Arc::clone(&count));
        count
    }
}

impl Count {
    /// How many of the available nodes `budget` granted: each selected node it granted (a
    /// grant is by name, and for one Node object; a read joined from several can hold
    /// namesakes), counted once per version of the budget.
    fn granted(&self, budget: &NodeDisruptionBudget) -> usize {
        let version = budget.metadata.resource_version.as_deref();
        let mut known = self.granted.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((counted, granted)) = known.as_ref()
            && Some(counted.as_str()) == version
        {
            return *granted;
        }
        let granted = budget
            .grants()
            .into_iter()
            .flatten()
            .map(|(name, grant)| {
                let start = self
                    .available
                    .partition_point(|node| node.facts().name < name.as_str());
                self.available[start..]
                    .iter()
                    .take_while(|node| node.facts().name == name.as_str())
                    .filter(|node| grant.is_for(node.as_ref()))
                    .count()
            })
            .sum();
        if let Some(version) = version {
            *known = Some((version.to_owned(), granted));
        }
        granted
    }
}

impl Deref for NodesRead {
    type Target = [Arc<BudgetNode>];

    fn deref(&self) -> &Self::Target {
        &self.nodes
    }
}

#[cfg(test)]
mod tests {
    use nodegrace_core::k8s::cached_node::CachedNode;
    use serde_json::json;

    use super::*;
    use crate::api::DISRUPTED_TAINT;
    use crate::grants::budget_numbers;
    use crate::grants::tests::{budget, node};

    /// Nodes of every kind the numbers tell apart: Ready or not, deleting (held by us) or not,
    /// cordoned by us or not, in or out of the pool, and namesakes of other UIDs.
    fn read() -> NodesRead {
        let nodes = (0..40)
            .map(|i| {
                let mut node: CachedNode =
                    (*node(&format!("n{}", i % 30), i % 3 != 0, i % 2 == 0)).clone();
                if i >= 30 {
                    node.metadata.uid = Some(format!("namesake-{i}"));
                    node.metadata.creation_timestamp =
                        Some(serde_json::from_value(json!("2026-11-23T09:45:00Z")).unwrap());
                }
                if i % 5 == 0 {
                    node.spec = serde_json::from_value(
                        json!({"taints": [{"key": DISRUPTED_TAINT, "effect": "NoSchedule"}]}),
                    )
                    .unwrap();
                }
                if i % 4 == 0 {
                    node.metadata.labels = Some([("pool".to_owned(), "b".to_owned())].into());
                }
                Arc::new(BudgetNode::from(node))
            })
            .collect();
        NodesRead::new(nodes)
    }

    /// A budget over pool `pool` with grants to n0..n11 (by UID, to a namesake's UID, or
    /// without one before or after the nodes were created).
    fn granting(pool: &str) -> NodeDisruptionBudget {
        let grants: serde_json::Map<String, serde_json::Value> = (0..12)
            .map(|i| {
                let grant = match i % 4 {
                    0 => json!({"uid": format!("uid-n{i}"), "grantedAt": "2026-11-23T10:00:00Z"}),
                    1 => json!({"uid": format!("namesake-{}", i + 30), "grantedAt": "2026-11-23T10:00:00Z"}),
                    2 => json!({"grantedAt": "2026-11-23T09:30:00Z"}),
                    _ => json!({"grantedAt": "2026-11-23T08:00:00Z"}),
                };
                (format!("n{i}"), grant)
            })
            .collect();
        let mut budget = budget(
            &json!({"selector": {"matchLabels": {"pool": pool}}, "maxUnavailable": 3}),
            &serde_json::Value::Object(grants),
        );
        budget.metadata.name = Some("pool".to_owned());
        budget.metadata.resource_version = Some("1".to_owned());
        budget
    }

    /// The count made once per read gives what counting every node gives, for the same budget
    /// with other grants, and for a budget whose selector changed.
    #[test]
    fn a_read_counted_once_gives_the_numbers_of_counting_every_node() {
        let read = read();
        let limit = Limit::MaxUnavailable(crate::budget::Amount::Count(3));
        for budget in [granting("a"), granting("b"), granting("a")] {
            assert_eq!(
                read.numbers(&budget, limit),
                budget_numbers(&budget, limit, &read),
                "{:?}",
                budget.spec.selector
            );
        }
        // A newer version of the budget, with fewer grants, is counted anew.
        let mut fewer = granting("a");
        fewer.metadata.resource_version = Some("2".to_owned());
        if let Some(status) = fewer.status.as_mut() {
            status.disrupted_nodes.retain(|name, _| name.ends_with('1'));
        }
        assert_eq!(
            read.numbers(&fewer, limit),
            budget_numbers(&fewer, limit, &read)
        );
        assert_ne!(
            read.numbers(&fewer, limit),
            read.numbers(&granting("a"), limit),
            "the grants count"
        );
    }
}
