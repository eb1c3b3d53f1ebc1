//! NodeDisruptionBudget grants and status. A grant is an entry in the budget's
//! `status.disruptedNodes`, written by an update that carries the resourceVersion the decision
//! was made on: of two writers (two controllers, two nodes, later the webhook) deciding on the
//! same version, one gets a 409, re-reads, and sees the unit taken.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::Api;
use kube::api::PostParams;
use nodegrace_core::k8s::api_errors::status_code;
use nodegrace_core::k8s::nodes::{Readiness, readiness, taints};
use nodegrace_core::k8s::watched::Watched;

use crate::api::{
    DISRUPTED_TAINT, FINALIZER, Grant, NodeDisruptionBudget, NodeDisruptionBudgetStatus,
};
use crate::budget::{Limit, NodeFacts, Numbers, SpecError, may_grant, numbers, selects};

/// How long a grant for a node that was never deleted is kept (the disruption controller's
/// `DeletionTimeout` for `disruptedPods`): a grant taken by an admission that did not go
/// through must not hold the budget forever.
pub const UNUSED_GRANT_EXPIRY: Duration = Duration::from_secs(120);
/// Conflicts retried within one attempt before the caller is told to come back.
const CONFLICT_RETRIES: usize = 5;

pub const CONDITION: &str = "DisruptionAllowed";

pub fn facts(node: &Node) -> NodeFacts<'_> {
    static NO_LABELS: BTreeMap<String, String> = BTreeMap::new();
    let deleting = node.metadata.deletion_timestamp.is_some();
    NodeFacts {
        name: node.metadata.name.as_deref().unwrap_or_default(),
        labels: node.metadata.labels.as_ref().unwrap_or(&NO_LABELS),
        ready: readiness(node) == Readiness::Ready,
        deleting,
        awaits_grants: deleting
            && node
                .metadata
                .finalizers
                .iter()
                .flatten()
                .any(|finalizer| finalizer == FINALIZER),
        disrupting: taints(node)
            .iter()
            .any(|taint| taint.key == DISRUPTED_TAINT && taint.effect == "NoSchedule"),
    }
}

/// Whether `budget` covers `node`. A budget whose selector cannot be read covers every node:
/// it fails closed, and its condition says what to fix.
pub fn covers(budget: &NodeDisruptionBudget, node: &NodeFacts<'_>) -> bool {
    selects(&budget.spec, node.labels).unwrap_or(true)
}

/// Why a node is not granted by one budget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    Exhausted(Numbers),
    Invalid(SpecError),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Exhausted(numbers) => write!(f, "{numbers}"),
            Self::Invalid(error) => write!(f, "the budget is invalid and holds its nodes: {error}"),
        }
    }
}

/// The answer for a node: granted by every budget covering it, or waiting on `budget`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Granted { budgets: Vec<String> },
    Waiting { budget: String, refusal: Refusal },
}

/// What the budget numbers are computed from.
#[derive(Debug, Clone)]
pub struct Budgets {
    pub api: Api<NodeDisruptionBudget>,
    pub cache: Watched<NodeDisruptionBudget>,
    pub nodes: Watched<Node>,
}

impl Budgets {
    /// The budgets covering `node`, by name: grants are taken in this order, so two nodes
    /// covered by the same two budgets never hold one each while waiting for the other.
    pub fn covering(&self, node: &NodeFacts<'_>) -> Vec<Arc<NodeDisruptionBudget>> {
        covering(&self.cache.state(), node)
    }

    /// Takes the grants `node` still lacks, in name order, stopping at the first budget that
    /// refuses (the grants already taken are kept: the node is next in line for them).
    pub async fn acquire(&self, node: &Node) -> Result<Verdict, kube::Error> {
        let facts = facts(node);
        let mut budgets = Vec::new();
        for budget in self.covering(&facts) {
            if !budget.has_granted(node)
                && let Some(refusal) = self.grant(&budget, node, &facts).await?
            {
                return Ok(Verdict::Waiting {
                    budget: budget.name().to_owned(),
                    refusal,
                });
            }
            budgets.push(budget.name().to_owned());
        }
        Ok(Verdict::Granted { budgets })
    }

    /// The verdict [`Budgets::acquire`] would reach now, taking nothing (dry runs, plans).
    pub fn verdict(&self, node: &Node) -> Verdict {
        verdict(&self.cache.state(), &self.nodes.state(), node)
    }

    /// Gives back `node`'s grants from `budgets` (an admission that took some but was then
    /// refused by another budget). Best effort: an unused grant also expires by itself.
    pub async fn release(&self, node: &Node, budgets: &[String]) -> Result<(), kube::Error> {
        let name = node.metadata.name.as_deref().unwrap_or_default();
        for budget_name in budgets {
            for _ in 0..CONFLICT_RETRIES {
                let mut budget = self.api.get_status(budget_name).await?;
                if !budget.has_granted(node) {
                    break;
                }
                let Some(status) = budget.status.as_mut() else {
                    break;
                };
                status.disrupted_nodes.remove(name);
                match self
                    .api
                    .replace_status(budget_name, &PostParams::default(), &budget)
                    .await
                {
                    Ok(_) => break,
                    Err(error) if status_code(&error) == Some(409) => {}
                    Err(error) => return Err(error),
                }
            }
        }
        Ok(())
    }

    async fn grant(
        &self,
        cached: &NodeDisruptionBudget,
        node: &Node,
        facts: &NodeFacts<'_>,
    ) -> Result<Option<Refusal>, kube::Error> {
        let mut budget = cached.clone();
        for _ in 0..CONFLICT_RETRIES {
            let nodes = self.nodes.state();
            if let Some(refusal) = refusal(&budget, node, facts, &nodes) {
                return Ok(Some(refusal));
            }
            if budget.has_granted(node) {
                return Ok(None);
            }
            let mut status = budget.status.clone().unwrap_or_default();
            // Keyed by name as PDBs' disruptedPods are; the UID keeps a namesake out.
            status.disrupted_nodes.insert(
                facts.name.to_owned(),
                Grant {
                    uid: node.metadata.uid.clone(),
                    granted_at: Time(Timestamp::now()),
                },
            );
            budget.status = Some(status);
            budget.status = Some(status_for(&budget, &nodes, Timestamp::now()));
            match self
                .api
                .replace_status(budget.name(), &PostParams::default(), &budget)
                .await
            {
                Ok(_) => return Ok(None),
                Err(error) if status_code(&error) == Some(409) => {
                    budget = self.api.get_status(cached.name()).await?;
                }
                Err(error) => return Err(error),
            }
        }
        Err(kube::Error::Api(Box::new(
            kube::core::Status::failure(
                &format!(
                    "NodeDisruptionBudget {} kept changing while a grant was taken; retrying",
                    cached.name()
                ),
                "Conflict",
            )
            .with_code(409),
        )))
    }
}

/// The verdict of `budgets` for `node`, over `nodes`, taking nothing.
pub fn verdict(budgets: &[Arc<NodeDisruptionBudget>], nodes: &[Arc<Node>], node: &Node) -> Verdict {
    let facts = facts(node);
    let mut granted = Vec::new();
    for budget in covering(budgets, &facts) {
        if let Some(refusal) = refusal(&budget, node, &facts, nodes) {
            return Verdict::Waiting {
                budget: budget.name().to_owned(),
                refusal,
            };
        }
        granted.push(budget.name().to_owned());
    }
    Verdict::Granted { budgets: granted }
}

/// The budgets covering `node`, by name (the order grants are taken in).
fn covering(
    budgets: &[Arc<NodeDisruptionBudget>],
    node: &NodeFacts<'_>,
) -> Vec<Arc<NodeDisruptionBudget>> {
    let mut covering: Vec<_> = budgets
        .iter()
        .filter(|budget| covers(budget, node))
        .cloned()
        .collect();
    covering.sort_by(|a, b| a.name().cmp(b.name()));
    covering
}

/// Why `budget` would not grant `node` now; `None` when it has or would.
fn refusal(
    budget: &NodeDisruptionBudget,
    node: &Node,
    facts: &NodeFacts<'_>,
    nodes: &[Arc<Node>],
) -> Option<Refusal> {
    if budget.has_granted(node) {
        return None;
    }
    let limit = match Limit::of(&budget.spec) {
        Ok(limit) => limit,
        Err(error) => return Some(Refusal::Invalid(error)),
    };
    let numbers = budget_numbers(budget, limit, nodes);
    (!may_grant(numbers, facts)).then_some(Refusal::Exhausted(numbers))
}

fn budget_numbers(budget: &NodeDisruptionBudget, limit: Limit, nodes: &[Arc<Node>]) -> Numbers {
    let selected: Vec<(NodeFacts<'_>, bool)> = nodes
        .iter()
        .map(|node| (facts(node), budget.has_granted(node)))
        .filter(|(facts, _)| covers(budget, facts))
        .collect();
    numbers(
        limit,
        selected.iter().map(|(facts, granted)| (facts, *granted)),
    )
}

/// The status `budget` should have: grants of gone nodes (and unused expired ones) dropped,
/// numbers recomputed, the condition set (its transition time kept while it holds).
pub fn status_for(
    budget: &NodeDisruptionBudget,
    nodes: &[Arc<Node>],
    now: Timestamp,
) -> NodeDisruptionBudgetStatus {
    let old = budget.status.clone().unwrap_or_default();
    let by_name: HashMap<&str, &Node> = nodes
        .iter()
        .filter_map(|node| Some((node.metadata.name.as_deref()?, node.as_ref())))
        .collect();
    let mut status = NodeDisruptionBudgetStatus {
        observed_generation: budget.metadata.generation,
        disrupted_nodes: old
            .disrupted_nodes
            .iter()
            .filter(|(name, grant)| {
                by_name
                    .get(name.as_str())
                    .filter(|node| grant.is_for(node))
                    .is_some_and(|node| {
                        node.metadata.deletion_timestamp.is_some()
                            || now.duration_since(grant.granted_at.0).unsigned_abs()
                                < UNUSED_GRANT_EXPIRY
                    })
            })
            .map(|(name, grant)| (name.clone(), grant.clone()))
            .collect(),
        ..NodeDisruptionBudgetStatus::default()
    };
    let pruned = NodeDisruptionBudget {
        status: Some(status.clone()),
        ..budget.clone()
    };
    let (state, reason, message) = match Limit::of(&budget.spec) {
        Ok(limit) => {
            let numbers = budget_numbers(&pruned, limit, nodes);
            status.expected_nodes = numbers.expected;
            status.current_available = numbers.available;
            status.desired_available = numbers.desired;
            status.disruptions_allowed = numbers.allowed;
            if numbers.allowed > 0 {
                ("True", "SufficientNodes", numbers.to_string())
            } else {
                ("False", "InsufficientNodes", numbers.to_string())
            }
        }
        Err(error) => (
            "False",
            "InvalidSpec",
            format!("{error}; every node it may cover waits until it is fixed"),
        ),
    };
    let transition = old
        .conditions
        .iter()
        .find(|condition| condition.type_ == CONDITION && condition.status == state)
        .map_or_else(
            || Time(now),
            |condition| condition.last_transition_time.clone(),
        );
    status.conditions = vec![Condition {
        type_: CONDITION.to_owned(),
        status: state.to_owned(),
        reason: reason.to_owned(),
        message,
        observed_generation: budget.metadata.generation,
        last_transition_time: transition,
    }];
    status
}

/// Brings every budget's status up to date; a 409 is left to the next change (the watch
/// delivers the newer version, which triggers another pass).
pub async fn refresh_statuses(
    budgets: &Budgets,
    mut allowed: impl FnMut(&str, i32),
) -> Result<(), kube::Error> {
    let nodes = budgets.nodes.state();
    let now = Timestamp::now();
    for budget in budgets.cache.state() {
        let status = status_for(&budget, &nodes, now);
        allowed(budget.name(), status.disruptions_allowed);
        if budget.status.as_ref() == Some(&status) {
            continue;
        }
        let mut updated = (*budget).clone();
        updated.status = Some(status);
        match budgets
            .api
            .replace_status(budget.name(), &PostParams::default(), &updated)
            .await
        {
            Ok(_) => {}
            Err(error) if matches!(status_code(&error), Some(404 | 409)) => {}
            Err(error) => return Err(error),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(name: &str, ready: bool, deleting: bool) -> Arc<Node> {
        let mut value = json!({
            "metadata": {"name": name, "uid": format!("uid-{name}"), "labels": {"pool": "a"},
                "creationTimestamp": "2026-11-23T09:00:00Z"},
            "status": {"conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}]},
        });
        if deleting {
            value["metadata"]["deletionTimestamp"] = json!("2026-11-23T10:00:00Z");
            value["metadata"]["finalizers"] = json!([FINALIZER]);
        }
        Arc::new(serde_json::from_value(value).unwrap())
    }

    fn budget(spec: &serde_json::Value, grants: &serde_json::Value) -> NodeDisruptionBudget {
        serde_json::from_value(json!({
            "apiVersion": "nodegrace.io/v1alpha1", "kind": "NodeDisruptionBudget",
            "metadata": {"name": "pool-a", "generation": 2},
            "spec": spec,
            "status": {"disruptedNodes": grants},
        }))
        .unwrap()
    }

    #[test]
    fn status_prunes_gone_and_expired_grants_and_counts_the_rest() {
        let now: Timestamp = "2026-11-23T10:10:00Z".parse().unwrap();
        let nodes = [
            node("a", true, true),
            node("b", true, false),
            node("c", true, false),
            node("d", true, false),
        ];
        let budget = budget(
            &json!({"selector": {"matchLabels": {"pool": "a"}}, "maxUnavailable": 1}),
            &json!({
                "a": {"uid": "uid-a", "grantedAt": "2026-11-23T10:00:00Z"}, // deleting: kept
                "b": {"uid": "uid-b", "grantedAt": "2026-11-23T10:00:00Z"}, // never deleted, 10 min old: expired
                "c": "2026-11-23T10:09:30Z",    // v0.1's bare time, fresh, node older: kept
                "d": {"uid": "uid-old-d", "grantedAt": "2026-11-23T10:09:30Z"}, // a namesake's: dropped
                "gone": {"uid": "uid-gone", "grantedAt": "2026-11-23T10:00:00Z"}, // no such node: dropped
            }),
        );
        let status = status_for(&budget, &nodes, now);
        assert_eq!(
            status.disrupted_nodes.keys().collect::<Vec<_>>(),
            ["a", "c"]
        );
        assert_eq!(status.disrupted_nodes["c"].uid, None, "kept as it was");
        assert_eq!(status.observed_generation, Some(2));
        assert_eq!(
            (
                status.expected_nodes,
                status.current_available,
                status.desired_available,
                status.disruptions_allowed
            ),
            (4, 2, 3, 0)
        );
        assert_eq!(status.conditions[0].reason, "InsufficientNodes");
    }

    /// Each kind of node, and how it counts: `(available, disrupted)` as seen by a budget that
    /// has granted only `granted`.
    #[test]
    fn status_numbers_follow_the_definitions() {
        let now: Timestamp = "2026-11-23T10:10:00Z".parse().unwrap();
        let cordoned = |node: Arc<Node>| {
            let mut node = (*node).clone();
            node.spec.get_or_insert_with(Default::default).taints =
                Some(vec![crate::tiers::disrupted_taint()]);
            Arc::new(node)
        };
        let without_our_finalizer = |node: Arc<Node>| {
            let mut node = (*node).clone();
            node.metadata.finalizers = Some(vec!["other.io/hold".to_owned()]);
            Arc::new(node)
        };
        let granted =
            json!({"granted": {"uid": "uid-granted", "grantedAt": "2026-11-23T10:09:00Z"}});
        // (nodes, maxUnavailable, expected, available, desired, allowed)
        let cases = [
            (vec![node("ready", true, false)], 1, (1, 1, 0, 1)),
            (vec![node("waiting", true, true)], 1, (1, 1, 0, 1)),
            (vec![node("granted", true, true)], 1, (1, 0, 0, 0)),
            (
                vec![cordoned(node("cordoned", true, true))],
                1,
                (1, 0, 0, 0),
            ),
            (vec![node("down", false, false)], 1, (1, 0, 0, 0)),
            (
                vec![without_our_finalizer(node("leaving", true, true))],
                1,
                (1, 0, 0, 0),
            ),
            // The history: n1 cordoned before the budget existed, n2 and n3 Ready.
            (
                vec![
                    cordoned(node("n1", true, true)),
                    node("n2", true, false),
                    node("n3", true, false),
                ],
                1,
                (3, 2, 2, 0),
            ),
            (
                vec![
                    node("granted", true, true),
                    node("waiting", true, true),
                    cordoned(node("cordoned", true, true)),
                    node("down", false, false),
                    without_our_finalizer(node("leaving", true, true)),
                    node("ready", true, false),
                ],
                2,
                (6, 2, 4, 0),
            ),
        ];
        for (nodes, max_unavailable, expected) in cases {
            let budget = budget(
                &json!({"selector": {"matchLabels": {"pool": "a"}}, "maxUnavailable": max_unavailable}),
                &granted,
            );
            let status = status_for(&budget, &nodes, now);
            let names: Vec<_> = nodes
                .iter()
                .map(|node| node.metadata.name.clone())
                .collect();
            assert_eq!(
                (
                    status.expected_nodes,
                    status.current_available,
                    status.desired_available,
                    status.disruptions_allowed
                ),
                expected,
                "{names:?}"
            );
        }
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
        assert!(covers(&budget, &facts(&node("a", true, false))));
    }
}
