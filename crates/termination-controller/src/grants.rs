//! NodeDisruptionBudget grants and status. A grant is an entry in the budget's
//! `status.disruptedNodes`, written by an update that carries the resourceVersion the decision
//! was made on: of two writers (two controllers, two nodes, later the webhook) deciding on the
//! same version, one gets a 409, re-reads, and sees the unit taken.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::Api;
use kube::api::PostParams;
use kube::core::Selector;
use nodegrace_core::clock::Clock;
use nodegrace_core::k8s::api_errors::status_code;
use nodegrace_core::k8s::cached_node::CachedNode;
use nodegrace_core::k8s::watched::Watched;

use crate::api::{Grant, NodeDisruptionBudget, NodeDisruptionBudgetStatus, granted_in};
use crate::budget::{Limit, NodeFacts, Numbers, SpecError, numbers, selects};
use crate::fresh_nodes::{FreshNodes, Nodes};
use crate::member::Member;
use crate::nodes_read::NodesRead;
use crate::waits::{Refusal, Verdict, Waits};
use crate::windows::{Gate, Windows};

/// How long a grant for a node that was never deleted is kept (the disruption controller's
/// `DeletionTimeout` for `disruptedPods`): a grant taken by an admission that did not go
/// through must not hold the budget forever.
pub const UNUSED_GRANT_EXPIRY: Duration = Duration::from_secs(120);
/// How long the check before a cordon waits to share a read another caller (the granting
/// pass, every 200 ms at most while budgets move) begins, before it reads on its own.
const CHECK_JOINS_A_READ_WITHIN: Duration = Duration::from_millis(300);
/// Conflicts retried within one attempt before the caller is told to come back.
const CONFLICT_RETRIES: usize = 5;

pub const CONDITION: &str = "DisruptionAllowed";

/// Whether `budget` covers `node`. A budget whose selector cannot be read covers every node:
/// it fails closed, and its condition says what to fix.
pub fn covers(budget: &NodeDisruptionBudget, node: &NodeFacts<'_>) -> bool {
    selects(&budget.spec, node.labels).unwrap_or(true)
}

/// What a budget's spec says, read: its limit and its windows.
#[derive(Debug, Clone)]
pub struct Rules {
    pub limit: Limit,
    pub windows: Option<Windows>,
}

impl Rules {
    pub fn of(budget: &NodeDisruptionBudget, now: Timestamp) -> Result<Self, SpecError> {
        Ok(Self {
            limit: Limit::of(&budget.spec)?,
            windows: Windows::of(&budget.spec, now)?,
        })
    }

    /// What `budget` (whose status keeps the window's count) can still give now, with its
    /// `numbers`.
    pub(crate) fn units(
        &self,
        numbers: Numbers,
        budget: &NodeDisruptionBudget,
        now: Timestamp,
    ) -> Units {
        let record = budget
            .status
            .as_ref()
            .and_then(|status| status.active_window.as_ref());
        let gate = self
            .windows
            .as_ref()
            .map(|windows| windows.gate(record, now));
        Units::of(numbers, self, gate)
    }
}

/// What one budget can still give in a pass: units by its numbers and by its window.
#[derive(Debug, Clone)]
pub(crate) struct Units {
    numbers: Numbers,
    by_numbers: i32,
    gate: Option<Gate>,
    /// Starts left in the open window (`None`: no cap, or no windows).
    by_window: Option<i32>,
    max_per_window: Option<i32>,
}

impl Units {
    pub(crate) fn of(numbers: Numbers, rules: &Rules, gate: Option<Gate>) -> Self {
        let by_window = match &gate {
            Some(Gate::Open { left, .. }) => *left,
            Some(Gate::Closed { .. }) => Some(0),
            None => None,
        };
        Self {
            numbers,
            by_numbers: numbers.allowed,
            gate,
            by_window,
            max_per_window: rules.windows.as_ref().and_then(Windows::max_per_window),
        }
    }

    /// Why a Ready node gets no unit now; `None` when it would get one.
    pub(crate) fn refusal(&self) -> Option<Refusal> {
        match &self.gate {
            Some(Gate::Closed { next }) => Some(Refusal::OutsideWindows {
                next: next.as_ref().map(ToString::to_string),
            }),
            Some(Gate::Open { next, .. }) if self.by_window.is_some_and(|left| left <= 0) => {
                Some(Refusal::WindowSpent {
                    max: self.max_per_window.unwrap_or_default(),
                    next: next.as_ref().map(ToString::to_string),
                })
            }
            _ => (self.by_numbers <= 0).then_some(Refusal::Exhausted(self.numbers)),
        }
    }

    pub(crate) fn take(&mut self) {
        self.by_numbers -= 1;
        if let Some(left) = self.by_window.as_mut() {
            *left -= 1;
        }
    }

    /// The disruptions allowed now, as the status reports them.
    pub(crate) fn allowed(&self) -> i32 {
        self.by_window
            .map_or(self.by_numbers, |left| left.min(self.by_numbers))
            .max(0)
    }
}

/// What the budget numbers are computed from.
#[derive(Debug, Clone)]
pub struct Budgets {
    pub api: Api<NodeDisruptionBudget>,
    pub cache: Watched<NodeDisruptionBudget>,
    pub nodes: Watched<CachedNode>,
    /// The fresh reads every grant (and every grant dropped) is decided on.
    pub fresh: Arc<FreshNodes>,
    /// Grant times, expiries and maintenance windows are read off this clock.
    pub clock: Arc<dyn Clock>,
    /// The last granting pass's verdicts (the pass is in `allocation.rs`).
    pub waits: Waits,
    /// Each budget's nodes and the waiting ones, which the leader's loop keeps and the pass
    /// reads.
    pub index: Arc<crate::budget_index::BudgetIndex>,
}

impl Budgets {
    /// The budgets covering `node`, by name: grants are taken in this order, so two nodes
    /// covered by the same two budgets never hold one each while waiting for the other.
    pub fn covering(&self, node: &NodeFacts<'_>) -> Vec<Arc<NodeDisruptionBudget>> {
        covering(&self.cache.state(), node)
    }

    /// The budgets covering `node` that have all granted it (by name), or `None` while one
    /// has not: the cache's answer, which the leader's allocation writes.
    pub fn granted(&self, node: &CachedNode) -> Option<Vec<String>> {
        let covering = self.covering(&node.facts());
        covering
            .iter()
            .all(|budget| budget.has_granted(node))
            .then(|| {
                covering
                    .iter()
                    .map(|budget| budget.name().to_owned())
                    .collect()
            })
    }

    /// Why `node` (by UID) waits, as the leader's last granting pass judged it.
    pub fn waiting_on(&self, uid: &str) -> Option<Verdict> {
        self.waits.of(uid)
    }

    /// Takes the grants `node` still lacks, in name order, stopping at the first budget that
    /// refuses (the grants already taken are kept: the node is next in line for them).
    pub async fn acquire(&self, node: &CachedNode) -> Result<Verdict, kube::Error> {
        let facts = node.facts();
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

    /// Every node as the API server has it now. Grants are decided on this, never on the
    /// cache alone: a cache can be any time behind while its watch is down (a replica cut off
    /// from the API server serves reviews all the same), and numbers counted from it — a
    /// namesake unknown, a gone node still Ready — over-spend the budget.
    pub async fn fresh_nodes(&self) -> Result<Nodes, kube::Error> {
        self.fresh.read("").await
    }

    /// The nodes `budget` may cover, as the API server has them now: only its selector's, so a
    /// check per cordon costs the budget's size, not the cluster's, and the checks of many
    /// nodes at once share their reads ([`FreshNodes`]). A selector the API cannot take (the
    /// budget is invalid, and covers every node) reads every node.
    async fn fresh_nodes_of(&self, budget: &NodeDisruptionBudget) -> Result<Nodes, kube::Error> {
        self.fresh_nodes_joining(budget, Duration::ZERO).await
    }

    /// [`Self::fresh_nodes_of`], sharing a read another caller begins `within`
    /// ([`FreshNodes::read_joining`]).
    async fn fresh_nodes_joining(
        &self,
        budget: &NodeDisruptionBudget,
        within: Duration,
    ) -> Result<Nodes, kube::Error> {
        match narrowing(budget) {
            Some(selector) => self.fresh_nodes_selected(&selector, within).await,
            None => self.fresh.read_joining("", within).await,
        }
    }

    /// The nodes any of `budgets` may cover, as the API server has them now, each once.
    pub(crate) async fn fresh_nodes_of_all(
        &self,
        budgets: &[Arc<NodeDisruptionBudget>],
    ) -> Result<Nodes, kube::Error> {
        let Some(selectors) = budgets
            .iter()
            .map(|budget| narrowing(budget))
            .collect::<Option<Vec<Selector>>>()
        else {
            return self.fresh_nodes().await;
        };
        if let [selector] = &selectors[..] {
            return self.fresh_nodes_selected(selector, Duration::ZERO).await;
        }
        let mut seen = HashSet::new();
        let mut nodes = Vec::new();
        for selector in selectors {
            for node in self
                .fresh_nodes_selected(&selector, Duration::ZERO)
                .await?
                .iter()
            {
                if seen.insert(node.uid().map(str::to_owned)) {
                    nodes.push(Arc::clone(node));
                }
            }
        }
        Ok(Arc::new(NodesRead::new(nodes)))
    }

    async fn fresh_nodes_selected(
        &self,
        selector: &Selector,
        within: Duration,
    ) -> Result<Nodes, kube::Error> {
        match self.fresh.read_joining(&selector.to_string(), within).await {
            // A value the API refuses in a selector: the budget covers every node.
            Err(error) if status_code(&error) == Some(400) => self.fresh_nodes().await,
            read => read,
        }
    }

    /// Before the cordon that starts `node`'s disruption: whether, on a fresh read, a budget
    /// that granted it is now over-spent with it counted — another node of it turned NotReady
    /// between the read the grant was decided on and now. Such a grant is given back
    /// ([`Budgets::release`]) and the node waits again. A NotReady node is granted whatever
    /// the numbers, so it never is.
    pub async fn overspent(
        &self,
        node: &CachedNode,
    ) -> Result<Option<(String, Numbers)>, kube::Error> {
        let facts = node.facts();
        if !facts.ready {
            return Ok(None);
        }
        for budget in self.covering(&facts) {
            let Ok(limit) = Limit::of(&budget.spec) else {
                continue;
            };
            // The granting pass reads the budget's nodes again within its pace whenever it
            // can grant more: a rollout's checks ride on those reads instead of doubling them.
            let nodes = self
                .fresh_nodes_joining(&budget, CHECK_JOINS_A_READ_WITHIN)
                .await?;
            let numbers = nodes.numbers(&budget, limit);
            if numbers.available < numbers.desired {
                return Ok(Some((budget.name().to_owned(), numbers)));
            }
        }
        Ok(None)
    }

    /// The verdict [`Budgets::acquire`] would reach now, taking nothing (dry runs, plans).
    pub fn verdict(&self, node: &CachedNode) -> Verdict {
        verdict(
            &self.cache.state(),
            &self.nodes.state(),
            node,
            self.clock.now(),
        )
    }

    /// Gives back `node`'s grants from `budgets` (an admission that took some but was then
    /// refused by another budget). Best effort: an unused grant also expires by itself.
    pub async fn release(&self, node: &CachedNode, budgets: &[String]) -> Result<(), kube::Error> {
        let name = node.metadata.name.as_deref().unwrap_or_default();
        for budget_name in budgets {
            let Some(cached) = self.cache.get(None, budget_name) else {
                continue;
            };
            let Some(grant) = cached
                .grants()
                .and_then(|grants| grants.get(name))
                .filter(|grant| grant.is_for(node))
            else {
                continue;
            };
            match self.remove_grant(budget_name, name, grant).await {
                Ok(()) => {}
                // The grant is no longer the one the cache showed (given back, or granted
                // anew): only a read tells whether this node still holds one.
                Err(error) if matches!(status_code(&error), Some(409 | 422)) => {
                    self.release_read(node, budget_name).await?;
                }
                Err(error) => return Err(error),
            }
        }
        Ok(())
    }

    /// Removes the grant `name` holds in `budget_name`'s status if it is still `grant`: a JSON
    /// patch that tests the entry, then removes it. One request, and no conflict with the
    /// granting pass's writes of the rest of the status, which a whole-status update of a
    /// cached copy met in a rollout (a 409, a read and a retry per grant given back).
    async fn remove_grant(
        &self,
        budget_name: &str,
        name: &str,
        grant: &Grant,
    ) -> Result<(), kube::Error> {
        let path = format!(
            "/status/disruptedNodes/{}",
            name.replace('~', "~0").replace('/', "~1")
        );
        let operations = serde_json::json!([
            {"op": "test", "path": path, "value": grant},
            {"op": "remove", "path": path},
        ]);
        let body = serde_json::to_vec(&operations).map_err(kube::Error::SerdeError)?;
        let request =
            http::Request::patch(format!("{}/{budget_name}/status", self.api.resource_url()))
                .header(http::header::CONTENT_TYPE, "application/json-patch+json")
                .body(body)
                .map_err(kube::Error::HttpError)?;
        let client: kube::Client = self.api.clone().into_client();
        client
            .request::<NodeDisruptionBudget>(request)
            .await
            .map(drop)
    }

    /// [`Self::release`] of one budget on a read of it, retried on conflicts.
    async fn release_read(&self, node: &CachedNode, budget_name: &str) -> Result<(), kube::Error> {
        let name = node.metadata.name.as_deref().unwrap_or_default();
        for _ in 0..CONFLICT_RETRIES {
            let mut budget = self.api.get_status(budget_name).await?;
            if !budget.has_granted(node) {
                return Ok(());
            }
            let Some(status) = budget.status.as_mut() else {
                return Ok(());
            };
            status.disrupted_nodes.remove(name);
            match self
                .api
                .replace_status(budget_name, &PostParams::default(), &budget)
                .await
            {
                Ok(_) => return Ok(()),
                Err(error) if status_code(&error) == Some(409) => {}
                Err(error) => return Err(error),
            }
        }
        Ok(())
    }

    async fn grant(
        &self,
        cached: &NodeDisruptionBudget,
        node: &CachedNode,
        facts: &NodeFacts<'_>,
    ) -> Result<Option<Refusal>, kube::Error> {
        let mut budget = cached.clone();
        for _ in 0..CONFLICT_RETRIES {
            let nodes = self.fresh_nodes_of(&budget).await?;
            let now = self.clock.now();
            if let Some(refusal) = refusal(&budget, node, facts, &nodes, now) {
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
                    granted_at: Time(now),
                },
            );
            if facts.ready {
                count_started(&budget, &mut status, 1, now);
            }
            budget.status = Some(status);
            budget.status = Some(status_for(&budget, &nodes, now));
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
pub fn verdict<N: Member>(
    budgets: &[Arc<NodeDisruptionBudget>],
    nodes: &[Arc<N>],
    node: &CachedNode,
    now: Timestamp,
) -> Verdict {
    let facts = node.facts();
    let mut granted = Vec::new();
    for budget in covering(budgets, &facts) {
        if let Some(refusal) = refusal(&budget, node, &facts, nodes, now) {
            return Verdict::Waiting {
                budget: budget.name().to_owned(),
                refusal,
            };
        }
        granted.push(budget.name().to_owned());
    }
    Verdict::Granted { budgets: granted }
}

/// The label selector that narrows `budget`'s nodes; `None` when it covers every node (no
/// selector, an empty one, or one that cannot be read).
fn narrowing(budget: &NodeDisruptionBudget) -> Option<Selector> {
    budget
        .spec
        .selector
        .clone()
        .and_then(|selector| Selector::try_from(selector).ok())
        .filter(|selector| !selector.selects_all())
}

/// The budgets covering `node`, by name (the order grants are taken in).
pub(crate) fn covering(
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
fn refusal<N: Member>(
    budget: &NodeDisruptionBudget,
    node: &impl Member,
    facts: &NodeFacts<'_>,
    nodes: &[Arc<N>],
    now: Timestamp,
) -> Option<Refusal> {
    if budget.has_granted(node) {
        return None;
    }
    let rules = match Rules::of(budget, now) {
        Ok(rules) => rules,
        Err(error) => return Some(Refusal::Invalid(error)),
    };
    if !facts.ready {
        // A NotReady node takes nothing from availability: neither numbers nor windows hold
        // it.
        return None;
    }
    rules
        .units(budget_numbers(budget, rules.limit, nodes), budget, now)
        .refusal()
}

/// Counts `more` disruptions started in the window open now into `status` (nothing without
/// windows, or outside them).
pub(crate) fn count_started(
    budget: &NodeDisruptionBudget,
    status: &mut NodeDisruptionBudgetStatus,
    more: i32,
    now: Timestamp,
) {
    if let Ok(Some(windows)) = Windows::of(&budget.spec, now) {
        status.active_window = windows.record(status.active_window.as_ref(), more, now);
    }
}

pub(crate) fn budget_numbers<N: Member>(
    budget: &NodeDisruptionBudget,
    limit: Limit,
    nodes: &[Arc<N>],
) -> Numbers {
    numbers_under(budget, budget.grants(), limit, nodes)
}

/// [`budget_numbers`] as if the budget's grants were `grants`.
fn numbers_under<N: Member>(
    budget: &NodeDisruptionBudget,
    grants: Option<&BTreeMap<String, Grant>>,
    limit: Limit,
    nodes: &[Arc<N>],
) -> Numbers {
    let selected: Vec<(NodeFacts<'_>, bool)> = nodes
        .iter()
        .map(|node| {
            let facts = node.facts();
            (facts, granted_in(grants, node.as_ref()))
        })
        .filter(|(facts, _)| covers(budget, facts))
        .collect();
    numbers(
        limit,
        selected.iter().map(|(facts, granted)| (facts, *granted)),
    )
}

/// The status `budget` should have: grants of gone nodes (and unused expired ones) dropped,
/// numbers recomputed, the condition set (its transition time kept while it holds).
pub fn status_for<N: Member>(
    budget: &NodeDisruptionBudget,
    nodes: &[Arc<N>],
    now: Timestamp,
) -> NodeDisruptionBudgetStatus {
    let no_status = NodeDisruptionBudgetStatus::default();
    let old = budget.status.as_ref().unwrap_or(&no_status);
    let by_name: HashMap<&str, &N> = nodes
        .iter()
        .filter_map(|node| {
            let name = node.facts().name;
            old.disrupted_nodes
                .contains_key(name)
                .then_some((name, node.as_ref()))
        })
        .collect();
    let mut status = NodeDisruptionBudgetStatus {
        observed_generation: budget.metadata.generation,
        disrupted_nodes: old
            .disrupted_nodes
            .iter()
            .filter(|(name, grant)| {
                by_name
                    .get(name.as_str())
                    .filter(|node| grant.is_for(**node))
                    .is_some_and(|node| {
                        node.deletion_asked().is_some()
                            || now.duration_since(grant.granted_at.0).unsigned_abs()
                                < UNUSED_GRANT_EXPIRY
                    })
            })
            .map(|(name, grant)| (name.clone(), grant.clone()))
            .collect(),
        ..NodeDisruptionBudgetStatus::default()
    };
    let (state, reason, message) = match Rules::of(budget, now) {
        Ok(rules) => {
            let numbers = numbers_under(budget, Some(&status.disrupted_nodes), rules.limit, nodes);
            if let Some(windows) = &rules.windows {
                status.active_window = windows.record(old.active_window.as_ref(), 0, now);
                status.next_window = windows.next_start(now).map(|next| Time(next.timestamp()));
            }
            let units = rules.units(numbers, budget, now);
            status.expected_nodes = numbers.expected;
            status.current_available = numbers.available;
            status.desired_available = numbers.desired;
            status.disruptions_allowed = units.allowed();
            match units.refusal() {
                None => ("True", "SufficientNodes", numbers.to_string()),
                Some(refusal @ Refusal::OutsideWindows { .. }) => {
                    ("False", "OutsideMaintenanceWindow", refusal.to_string())
                }
                Some(refusal @ Refusal::WindowSpent { .. }) => {
                    ("False", "MaintenanceWindowSpent", refusal.to_string())
                }
                Some(_) => ("False", "InsufficientNodes", numbers.to_string()),
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::api::FINALIZER;
    use serde_json::json;

    pub(crate) fn node(name: &str, ready: bool, deleting: bool) -> Arc<CachedNode> {
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

    pub(crate) fn budget(
        spec: &serde_json::Value,
        grants: &serde_json::Value,
    ) -> NodeDisruptionBudget {
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
        let cordoned = |node: Arc<CachedNode>| {
            let mut node = (*node).clone();
            node.spec.get_or_insert_with(Default::default).taints =
                Some(vec![crate::tiers::disrupted_taint()]);
            Arc::new(node)
        };
        let without_our_finalizer = |node: Arc<CachedNode>| {
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
}
