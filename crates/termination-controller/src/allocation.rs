//! The leader's granting pass: one pass over every waiting node, run once per change that can
//! move a budget's numbers. Each budget's numbers are counted once; the units it allows go to
//! the waiting nodes oldest deletion first, and the pass writes them with each budget's status
//! (one update per budget). A node's own calls (a grant at admission, the check before its
//! cordon) are [`Budgets`]'.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::PostParams;
use nodegrace_core::k8s::api_errors::status_code;
use nodegrace_core::k8s::cached_node::CachedNode;

use crate::api::{Grant, NodeDisruptionBudget, NodeDisruptionBudgetStatus};
use crate::budget::SpecError;
use crate::budget_index::{BudgetIndex, IndexedNode};
use crate::fresh_nodes::BudgetNode;
use crate::grants::{
    Budgets, Rules, Units, budget_numbers, count_started, covering, covers, status_for,
};
use crate::member::Member;
use crate::waits::Refusal;
use crate::waits::Verdict;

/// Which waiting nodes the budgets grant now, and why the others wait. Computed once per change
/// for every waiting node (never once per node), from each budget's numbers counted once.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Allocation {
    /// Per budget: the nodes it grants in this pass.
    pub grants: BTreeMap<String, Vec<(String, Grant)>>,
    /// Per budget: how many of those are Ready (disruptions started in its window).
    pub started: BTreeMap<String, i32>,
    /// Per waiting node (by UID): the budget it waits on, and why.
    pub waiting: HashMap<String, Verdict>,
}

/// Hands out the units the budgets allow to the nodes waiting for them (deleting, held by our
/// finalizer, not yet cordoned), the oldest deletion first: a node takes units only when every
/// budget covering it can give one, so a node blocked on one budget takes nothing from another
/// (the next node in line gets it). A NotReady node takes no unit (it is not available anyway).
pub fn allocate<N: Member>(
    budgets: &[Arc<NodeDisruptionBudget>],
    nodes: &[Arc<N>],
    now: Timestamp,
) -> Allocation {
    let own = own_nodes(budgets, nodes);
    allocate_among(budgets, &own, now, |_| true)
}

/// One scan of a pass's nodes: per budget (by name) the nodes it covers or has granted, and
/// the nodes waiting for grants. Every later look a pass takes at a budget then costs the
/// budget's size, not the cluster's, and each node's facts are read once per pass. The
/// budgets' numbers and statuses over these are what they are over all of the nodes.
struct OwnNodes<N> {
    by_budget: HashMap<String, Vec<Arc<N>>>,
    /// Deleting, held by our finalizer, not yet cordoned.
    waiting: Vec<Arc<N>>,
}

impl<N> Default for OwnNodes<N> {
    fn default() -> Self {
        Self {
            by_budget: HashMap::new(),
            waiting: Vec::new(),
        }
    }
}

fn own_nodes<N: Member>(budgets: &[Arc<NodeDisruptionBudget>], nodes: &[Arc<N>]) -> OwnNodes<N> {
    let mut own = OwnNodes {
        by_budget: budgets
            .iter()
            .map(|budget| (budget.name().to_owned(), Vec::new()))
            .collect(),
        waiting: Vec::new(),
    };
    for node in nodes {
        let facts = node.facts();
        if facts.awaits_grants && !facts.disrupting {
            own.waiting.push(Arc::clone(node));
        }
        for budget in budgets {
            let granted = budget
                .status
                .as_ref()
                .is_some_and(|status| status.disrupted_nodes.contains_key(facts.name));
            if (granted || covers(budget, &facts))
                && let Some(nodes) = own.by_budget.get_mut(budget.name())
            {
                nodes.push(Arc::clone(node));
            }
        }
    }
    own
}

/// [`own_nodes`] from the index: each budget's nodes with their facts read once per watch
/// event, and the nodes a budget granted whose labels have since left its selector looked up
/// by name (`get`), each checked as `own_nodes` checks it. A pass costs the budgets' sizes and
/// the waiting nodes, not the cluster's: in a cluster of 10,000 whose pool of 5,000 rolls,
/// half the nodes; with a budget per pool, a pool's.
fn indexed_own(
    budgets: &[Arc<NodeDisruptionBudget>],
    index: &BudgetIndex,
    get: impl Fn(&str) -> Option<Arc<CachedNode>>,
) -> OwnNodes<IndexedNode> {
    index.read(|covered, waiting| {
        let mut own = OwnNodes::default();
        for budget in budgets {
            let covered = covered.get(budget.name());
            let granted = || {
                budget
                    .status
                    .iter()
                    .flat_map(|status| status.disrupted_nodes.keys())
            };
            let is_granted = |name: &str| {
                budget
                    .status
                    .as_ref()
                    .is_some_and(|status| status.disrupted_nodes.contains_key(name))
            };
            // The cache may hold a newer selector than the index picked by (the loop syncs it
            // next): a node it no longer covers counts only if granted.
            let mut nodes: Vec<Arc<IndexedNode>> = covered
                .into_iter()
                .flat_map(BTreeMap::values)
                .filter(|node| {
                    let facts = node.facts();
                    covers(budget, &facts) || is_granted(facts.name)
                })
                .cloned()
                .collect();
            nodes.extend(
                granted()
                    .filter(|name| !covered.is_some_and(|covered| covered.contains_key(*name)))
                    .filter_map(|name| get(name))
                    .map(|node| Arc::new(IndexedNode::new(node))),
            );
            own.by_budget.insert(budget.name().to_owned(), nodes);
        }
        own.waiting = waiting
            .values()
            .filter(|node| {
                let facts = node.facts();
                facts.awaits_grants && !facts.disrupting
            })
            .cloned()
            .collect();
        own
    })
}

fn own_of<'a, N>(own: &'a OwnNodes<N>, budget: &NodeDisruptionBudget) -> &'a [Arc<N>] {
    own.by_budget.get(budget.name()).map_or(&[], Vec::as_slice)
}

/// [`allocate`] with the budgets' numbers counted over `own`, but only the waiting nodes
/// `judged` picks granted or refused.
fn allocate_among<N: Member>(
    budgets: &[Arc<NodeDisruptionBudget>],
    own: &OwnNodes<N>,
    now: Timestamp,
    judged: impl Fn(&N) -> bool,
) -> Allocation {
    let mut allocation = Allocation::default();
    let mut left: HashMap<&str, Result<Units, SpecError>> = budgets
        .iter()
        .map(|budget| {
            let state = Rules::of(budget, now).map(|rules| {
                let numbers = budget_numbers(budget, rules.limit, own_of(own, budget));
                rules.units(numbers, budget, now)
            });
            (budget.name(), state)
        })
        .collect();
    let mut waiters: Vec<&Arc<N>> = own.waiting.iter().filter(|node| judged(node)).collect();
    waiters.sort_by(|a, b| {
        (a.deletion_asked(), a.facts().name).cmp(&(b.deletion_asked(), b.facts().name))
    });
    for node in waiters {
        let facts = node.facts();
        let missing: Vec<Arc<NodeDisruptionBudget>> = covering(budgets, &facts)
            .into_iter()
            .filter(|budget| !budget.has_granted(node.as_ref()))
            .collect();
        let refusal = missing.iter().find_map(|budget| {
            let refusal = match left.get(budget.name())? {
                Err(error) => Refusal::Invalid(error.clone()),
                Ok(units) if facts.ready => units.refusal()?,
                Ok(_) => return None,
            };
            Some((budget.name().to_owned(), refusal))
        });
        let uid = node.uid().unwrap_or_default().to_owned();
        if let Some((budget, refusal)) = refusal {
            allocation
                .waiting
                .insert(uid, Verdict::Waiting { budget, refusal });
            continue;
        }
        for budget in missing {
            if facts.ready
                && let Some(Ok(units)) = left.get_mut(budget.name())
            {
                units.take();
                *allocation
                    .started
                    .entry(budget.name().to_owned())
                    .or_default() += 1;
            }
            allocation
                .grants
                .entry(budget.name().to_owned())
                .or_default()
                .push((
                    facts.name.to_owned(),
                    Grant {
                        uid: Some(uid.clone()),
                        granted_at: Time(now),
                    },
                ));
        }
    }
    allocation
}

/// What one pass over the budgets did.
#[derive(Debug, Default)]
pub struct Refreshed {
    /// Each budget's `disruptionsAllowed` after the pass.
    pub allowed: Vec<(String, i32)>,
    /// The budgets whose spec is invalid (they hold every node they may cover).
    pub invalid: HashSet<String>,
    /// The waiting nodes (by UID) whose wait the pass changed: granted, or waiting on
    /// something new ([`Waits::record`]).
    pub rejudged: Vec<String>,
    /// Status writes refused with a 409 (left to the next pass, which the watch triggers).
    pub conflicts: u32,
}

/// Grants the waiting nodes what the budgets allow (see [`allocate`]) and brings every budget's
/// status up to date, one write per budget; a 409 is left to the next change (the watch
/// delivers the newer version, which triggers another pass). The budgets a pass would grant
/// from or drop a grant of are decided again on a fresh read of their own nodes (a
/// label-selector LIST each, [`Budgets::fresh_nodes_of`]), with the budgets of every node
/// those grants go to: a pass costs the size of the budgets it moves, not the cluster's. The
/// rest go by the cache, and grant nothing.
pub async fn refresh_statuses(budgets: &Budgets) -> Result<Refreshed, kube::Error> {
    let cached = budgets.cache.state();
    let now = budgets.clock.now();
    let cached_own = indexed_own(&cached, &budgets.index, |name| {
        budgets.nodes.get(None, name)
    });
    let by_cache = allocate_among(&cached, &cached_own, now, |_| true);
    let (moved, mut by_cache_statuses) = moved_budgets(&cached, &cached_own, &by_cache, now);
    let mut fresh_own = OwnNodes::<BudgetNode>::default();
    let allocation = if moved.is_empty() {
        by_cache
    } else {
        let moving: Vec<Arc<NodeDisruptionBudget>> = cached
            .iter()
            .filter(|budget| moved.contains(budget.name()))
            .cloned()
            .collect();
        let fresh = budgets.fresh_nodes_of_all(&moving).await?;
        fresh_own = own_nodes(&moving, &fresh);
        // Only the nodes every budget covering them was read fresh for are judged again; any
        // other keeps the cache's verdict and is granted nothing this pass. Every fresh node
        // counts in its budgets' numbers.
        let whole = |node: &BudgetNode| {
            covering(&cached, &node.facts())
                .iter()
                .all(|budget| moved.contains(budget.name()))
        };
        let mut again = allocate_among(&moving, &fresh_own, now, whole);
        let mut waiting = by_cache.waiting;
        for node in fresh.iter().filter(|node| whole(node)) {
            if let Some(uid) = node.uid() {
                waiting.remove(uid);
            }
        }
        waiting.extend(again.waiting);
        again.waiting = waiting;
        again
    };
    let Allocation {
        mut grants,
        mut started,
        waiting,
    } = allocation;
    let mut refreshed = Refreshed::default();
    for budget in cached {
        let new_grants = grants.remove(budget.name());
        let fresh = fresh_own.by_budget.get(budget.name());
        let status = match (fresh, new_grants) {
            // Not read fresh and granting nothing: the status the cache gave it.
            (None, None) => by_cache_statuses
                .remove(budget.name())
                .unwrap_or_else(|| status_for(&budget, own_of(&cached_own, &budget), now)),
            (fresh, new_grants) => {
                let mut updated = (*budget).clone();
                if let Some(new) = new_grants {
                    let status = updated.status.get_or_insert_with(Default::default);
                    status.disrupted_nodes.extend(new);
                    let more = started.remove(budget.name()).unwrap_or_default();
                    count_started(&budget, status, more, now);
                }
                match fresh {
                    Some(fresh) => status_for(&updated, fresh, now),
                    None => status_for(&updated, own_of(&cached_own, &budget), now),
                }
            }
        };
        refreshed
            .allowed
            .push((budget.name().to_owned(), status.disruptions_allowed));
        if status
            .conditions
            .iter()
            .any(|condition| condition.reason == "InvalidSpec")
        {
            refreshed.invalid.insert(budget.name().to_owned());
        }
        if budget.status.as_ref() == Some(&status) {
            continue;
        }
        let updated = NodeDisruptionBudget {
            status: Some(status),
            ..(*budget).clone()
        };
        match budgets
            .api
            .replace_status(budget.name(), &PostParams::default(), &updated)
            .await
        {
            Ok(_) => {}
            Err(error) if status_code(&error) == Some(409) => refreshed.conflicts += 1,
            Err(error) if status_code(&error) == Some(404) => {}
            Err(error) => return Err(error),
        }
    }
    // Once the grants are written: a failed pass leaves the old verdicts, and their changes
    // are reported by the next.
    refreshed.rejudged = budgets.waits.record(waiting);
    Ok(refreshed)
}

/// The budgets a pass moves, by name: those that would grant a node or drop a grant, and
/// every budget covering a node granted, so that node is judged whole. With each budget's
/// status as the cache gives it (by name), which is the one written for a budget not moved.
fn moved_budgets<N: Member>(
    budgets: &[Arc<NodeDisruptionBudget>],
    own: &OwnNodes<N>,
    allocation: &Allocation,
    now: Timestamp,
) -> (HashSet<String>, HashMap<String, NodeDisruptionBudgetStatus>) {
    let mut moved = HashSet::new();
    let mut statuses = HashMap::new();
    for budget in budgets {
        let status = status_for(budget, own_of(own, budget), now);
        if budget
            .status
            .as_ref()
            .is_some_and(|old| old.disrupted_nodes.len() > status.disrupted_nodes.len())
        {
            moved.insert(budget.name().to_owned());
        }
        statuses.insert(budget.name().to_owned(), status);
    }
    let granted: HashSet<&str> = allocation
        .grants
        .values()
        .flatten()
        .map(|(node, _)| node.as_str())
        .collect();
    // Only waiting nodes are granted.
    for node in own.waiting.iter().filter(|_| !granted.is_empty()) {
        let facts = node.facts();
        if granted.contains(facts.name) {
            moved.extend(
                covering(budgets, &facts)
                    .iter()
                    .map(|budget| budget.name().to_owned()),
            );
        }
    }
    (moved, statuses)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grants::tests::{budget, node};
    use kube::ResourceExt;
    use serde_json::json;

    fn deleted_at(node: &CachedNode, at: &str) -> Arc<CachedNode> {
        let mut node = node.clone();
        node.metadata.deletion_timestamp = Some(Time(at.parse().unwrap()));
        Arc::new(node)
    }

    fn named(name: &str, spec: &serde_json::Value) -> Arc<NodeDisruptionBudget> {
        let mut budget = budget(spec, &json!({}));
        budget.metadata.name = Some(name.to_owned());
        Arc::new(budget)
    }

    fn granted_nodes(allocation: &Allocation, budget: &str) -> Vec<String> {
        allocation
            .grants
            .get(budget)
            .map(|grants| grants.iter().map(|(node, _)| node.clone()).collect())
            .unwrap_or_default()
    }

    fn labelled(name: &str, labels: &serde_json::Value, deleting: bool) -> Arc<CachedNode> {
        let mut node = (*node(name, true, deleting)).clone();
        node.metadata.labels = serde_json::from_value(labels.clone()).unwrap();
        Arc::new(node)
    }

    /// Each node's name and what the budgets read of it, by name.
    fn names<N: Member>(nodes: &[Arc<N>]) -> Vec<(String, bool, bool, bool, bool, Option<String>)> {
        let mut names: Vec<_> = nodes
            .iter()
            .map(|node| {
                let facts = node.facts();
                (
                    facts.name.to_owned(),
                    facts.ready,
                    facts.deleting,
                    facts.awaits_grants,
                    facts.disrupting,
                    node.uid().map(str::to_owned),
                )
            })
            .collect();
        names.sort();
        names
    }

    /// What a pass reads of the index, against a scan of every node.
    fn assert_indexed_as_scanned(
        budgets: &[Arc<NodeDisruptionBudget>],
        index: &BudgetIndex,
        nodes: &[Arc<CachedNode>],
    ) {
        let scanned = own_nodes(budgets, nodes);
        let indexed = indexed_own(budgets, index, |name| {
            nodes.iter().find(|node| node.name_any() == name).cloned()
        });
        for budget in budgets {
            assert_eq!(
                names(own_of(&indexed, budget)),
                names(own_of(&scanned, budget)),
                "budget {}",
                budget.name()
            );
        }
        assert_eq!(names(&indexed.waiting), names(&scanned.waiting));
    }

    /// The index a granting pass reads gives each budget the nodes a scan of every node
    /// would: those it covers and those it granted (a node whose labels moved since), and the
    /// waiting nodes; and it follows nodes that change, come and go, and a new selector.
    #[test]
    fn the_index_gives_a_pass_what_a_scan_of_every_node_does() {
        let mut pool = (*named(
            "pool",
            &json!({"selector": {"matchLabels": {"pool": "a"}}, "maxUnavailable": 1}),
        ))
        .clone();
        pool.status = serde_json::from_value(json!({"disruptedNodes": {
            "moved": {"uid": "uid-moved", "grantedAt": "2026-11-23T10:00:00Z"}}}))
        .unwrap();
        let gpus = named(
            "gpus",
            &json!({"selector": {"matchLabels": {"gpu": "x"}}, "maxUnavailable": 1}),
        );
        let budgets = vec![Arc::new(pool), gpus];
        let mut nodes = vec![
            labelled("a1", &json!({"pool": "a"}), true),
            labelled("a2", &json!({"pool": "a", "gpu": "x"}), false),
            labelled("moved", &json!({"pool": "b"}), true),
            labelled("other", &json!({"pool": "b"}), false),
        ];
        let index = BudgetIndex::default();
        index.sync_budgets(&budgets, || nodes.clone());
        for node in &nodes {
            index.node_changed(&node.name_any(), Some(Arc::clone(node)), &budgets);
        }
        assert_indexed_as_scanned(&budgets, &index, &nodes);

        // other joins the gpus; a2 goes.
        nodes[3] = labelled("other", &json!({"gpu": "x"}), true);
        index.node_changed("other", Some(Arc::clone(&nodes[3])), &budgets);
        nodes.remove(1);
        index.node_changed("a2", None, &budgets);
        assert_indexed_as_scanned(&budgets, &index, &nodes);

        // The gpus' budget now selects pool b: picked anew from the nodes.
        let mut budgets = budgets;
        budgets[1] = named(
            "gpus",
            &json!({"selector": {"matchLabels": {"pool": "b"}}, "maxUnavailable": 1}),
        );
        index.sync_budgets(&budgets, || nodes.clone());
        assert_indexed_as_scanned(&budgets, &index, &nodes);
    }

    /// A pass that reads only some budgets fresh judges only the nodes wholly under them, but
    /// counts every node in their numbers: a node left unjudged still takes its budget's room.
    #[test]
    fn nodes_left_unjudged_still_count_in_their_budgets_numbers() {
        let now: Timestamp = "2026-11-23T10:10:00Z".parse().unwrap();
        let pool = json!({"selector": {"matchLabels": {"pool": "a"}}, "maxUnavailable": 1});
        let nodes = vec![
            deleted_at(&node("first", true, true), "2026-11-23T10:01:00Z"),
            deleted_at(&node("second", true, true), "2026-11-23T10:02:00Z"),
            node("down", false, false),
            node("up", true, false),
        ];
        let only_second = |node: &CachedNode| node.metadata.name.as_deref() == Some("second");
        let budgets = [named("pool", &pool)];
        let own = own_nodes(&budgets, &nodes);
        let allocation = allocate_among(&budgets, &own, now, only_second);
        assert!(
            granted_nodes(&allocation, "pool").is_empty(),
            "down is unavailable"
        );
        assert!(
            !allocation.waiting.contains_key("uid-first"),
            "first was not judged"
        );
        assert!(allocation.waiting.contains_key("uid-second"));
    }

    /// [`allocate`] over cached Nodes, which must allocate as it does over a fresh read's
    /// [`BudgetNode`]s of the same nodes.
    fn allocated_alike(
        budgets: &[Arc<NodeDisruptionBudget>],
        nodes: &[Arc<CachedNode>],
        now: Timestamp,
    ) -> Allocation {
        let read: Vec<Arc<BudgetNode>> = nodes
            .iter()
            .map(|node| Arc::new(BudgetNode::from((**node).clone())))
            .collect();
        let allocation = allocate(budgets, nodes, now);
        assert_eq!(allocate(budgets, &read, now), allocation);
        allocation
    }

    #[test]
    fn units_go_to_the_oldest_deletions_and_a_blocked_node_takes_none() {
        let now: Timestamp = "2026-11-23T10:10:00Z".parse().unwrap();
        let pool = json!({"selector": {"matchLabels": {"pool": "a"}}, "maxUnavailable": 2});
        let nodes = vec![
            deleted_at(&node("young", true, true), "2026-11-23T10:05:00Z"),
            deleted_at(&node("old", true, true), "2026-11-23T10:01:00Z"),
            deleted_at(&node("middle", true, true), "2026-11-23T10:03:00Z"),
            node("d", true, false),
            node("e", true, false),
        ];
        let allocation = allocated_alike(&[named("pool", &pool)], &nodes, now);
        assert_eq!(granted_nodes(&allocation, "pool"), ["old", "middle"]);
        assert!(matches!(
            allocation.waiting.get("uid-young"),
            Some(Verdict::Waiting {
                refusal: Refusal::Exhausted(_),
                ..
            })
        ));

        // "old" is also under a budget that allows nothing: it takes nothing from "pool",
        // whose units go to the next in line.
        let mut held = nodes.clone();
        let mut old = (*held[1]).clone();
        old.metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("gpu".to_owned(), "x".to_owned());
        held[1] = Arc::new(old);
        let gpus = named(
            "gpus",
            &json!({"selector": {"matchLabels": {"gpu": "x"}}, "maxUnavailable": 0}),
        );
        let allocation = allocated_alike(&[gpus, named("pool", &pool)], &held, now);
        assert_eq!(granted_nodes(&allocation, "pool"), ["middle", "young"]);
        assert!(matches!(
            allocation.waiting.get("uid-old"),
            Some(Verdict::Waiting { budget, .. }) if budget == "gpus"
        ));

        // A NotReady node is granted without taking a unit (one is left: 4 available, 3
        // must stay); an invalid budget holds its nodes.
        let mut down = nodes.clone();
        down[1] = deleted_at(&node("old", false, true), "2026-11-23T10:01:00Z");
        let allocation = allocated_alike(&[named("pool", &pool)], &down, now);
        assert_eq!(granted_nodes(&allocation, "pool"), ["old", "middle"]);
        let invalid = named("pool", &json!({"selector": {"matchLabels": {"pool": "a"}}}));
        let allocation = allocated_alike(&[invalid], &nodes, now);
        assert!(allocation.grants.is_empty());
        assert!(matches!(
            allocation.waiting.get("uid-old"),
            Some(Verdict::Waiting {
                refusal: Refusal::Invalid(_),
                ..
            })
        ));
    }

    #[test]
    fn an_invalid_budget_says_so_and_covers_nodes_it_cannot_read() {
        let budget = budget(
            &json!({"selector": {"matchExpressions": [{"key": "pool", "operator": "Gt"}]}, "minAvailable": 1, "maxUnavailable": 1}),
            &json!({}),
        );
        let status = status_for(&budget, &[node("a", true, false)], Timestamp::now());
        assert_eq!(status.conditions[0].status, "False");
        assert_eq!(status.conditions[0].reason, "InvalidSpec");
        assert!(status.conditions[0].message.contains("exactly one"));
        assert!(covers(&budget, &node("a", true, false).facts()));
    }
}
