//! The leader's loop: a termination task per deleting node that carries our finalizer; the
//! finalizer added to managed nodes on sight; budgets' status kept current; and, with
//! `--not-ready-timeout`, a timer per NotReady node. Watches report which node changed, so
//! the loop never rescans the cluster for one change.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{DeleteParams, Preconditions};
use nodegrace_core::assembly::Lead;
use nodegrace_core::dirty::Dirty;
use nodegrace_core::error_chain::Chain;
use nodegrace_core::k8s::api_errors::status_code;
use nodegrace_core::k8s::conditions::node_condition;
use nodegrace_core::k8s::events::EventReport;
use nodegrace_core::k8s::node_identity::NodeIdentity;
use nodegrace_core::k8s::nodes::{Readiness, node_reference, readiness};
use nodegrace_core::k8s::watched::Watched;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tokio_util::time::{DelayQueue, delay_queue};

use crate::api::{FINALIZER, NodeDisruptionBudget};
use crate::grants::refresh_statuses;
use crate::metrics::NdbLabel;
use crate::shared::Shared;
use crate::termination::{Finished, NodeTermination, has_finalizer, ours, remove_finalizer};
use nodegrace_core::k8s::partition;

/// Budget statuses are recomputed at most this often: nodes change all the time (heartbeats),
/// and one pass covers every change since the last.
const STATUS_REFRESH_PAUSE: Duration = Duration::from_millis(200);

/// Finalizer writes in flight at once. They go at the client's `--api-qps` whatever their
/// number; a task per node for a cluster's 5,000 new nodes held 5,000 requests' state at once.
const FINALIZER_WRITES_IN_FLIGHT: usize = 16;

#[derive(Debug)]
pub struct Controller {
    pub shared: Arc<Shared>,
    pub dirty: Arc<Dirty>,
}

impl Lead for Controller {
    fn lead(&self, acting: CancellationToken) -> impl Future<Output = ()> + Send {
        self.run(acting)
    }
}

impl Controller {
    /// Runs until `acting` is cancelled (leadership lost, or the program stopping).
    pub async fn run(&self, acting: CancellationToken) {
        // Wakes the tasks past their grants on what every drain reads (PodDisruptionBudgets,
        // drain rules, namespaces' labels); their own Node's changes wake them by their turns.
        let (poke, poked) = watch::channel(());
        // Counts node changes that may move a budget's numbers (heartbeats do not).
        let (relevant, node_changes) = watch::channel(0u64);
        let statuses = tokio::spawn(keep_statuses(
            Arc::clone(&self.shared),
            node_changes,
            acting.child_token(),
        ));
        self.look_after_nodes(&acting, &poke, &poked, &relevant)
            .await;
        acting.cancel();
        let _ = statuses.await;
    }

    async fn look_after_nodes(
        &self,
        acting: &CancellationToken,
        poke: &watch::Sender<()>,
        poked: &watch::Receiver<()>,
        relevant: &watch::Sender<u64>,
    ) {
        let shared = &self.shared;
        // What of each node the budgets and the tasks look at; a change of anything else
        // (heartbeats, images, addresses) wakes nothing.
        let mut shapes: HashMap<String, NodeShape> = HashMap::new();
        // Termination tasks by the Node's UID: a namesake is another node, with a task of
        // its own.
        let mut workers: HashSet<String> = HashSet::new();
        // Nodes whose finalizer a task removed (UID → name, to look each up by): the cache may
        // still show them with it for a moment, and they must not get a second task.
        let mut released: HashMap<String, String> = HashMap::new();
        let mut running: JoinSet<(NodeIdentity, Finished)> = JoinSet::new();
        let mut bookkeeping: JoinSet<String> = JoinSet::new();
        let mut in_bookkeeping: HashSet<String> = HashSet::new();
        // Nodes whose finalizer write waits for a free slot, marked dirty again when one frees.
        let mut deferred: BTreeSet<String> = BTreeSet::new();
        let mut checks: DelayQueue<String> = DelayQueue::new();
        let mut scheduled: HashMap<String, delay_queue::Key> = HashMap::new();
        // NotReady nodes the partition guard holds, checked again whenever some node's
        // readiness changes or a node comes or goes (that moves the fractions).
        let mut held: HashSet<String> = HashSet::new();
        let mut budgets = shared.budgets.cache.clone();
        let mut pdbs = shared.pdbs.clone();
        let mut drain_rules = shared.drain_rules.clone();
        let mut namespaces = shared.namespaces.clone();
        for node in shared.nodes().state() {
            self.dirty
                .mark(node.metadata.name.as_deref().unwrap_or_default());
        }
        let mut budgets_moved = true;
        let mut wake_tasks = false;
        loop {
            let mut fractions_moved = false;
            for name in self.dirty.take() {
                let Some(node) = shared.nodes().get(None, &name) else {
                    let gone = shapes.remove(&name);
                    if let Some(uid) = gone.as_ref().and_then(|shape| shape.uid.as_deref()) {
                        shared.turns.wake(uid);
                    }
                    budgets_moved |= gone.is_some();
                    fractions_moved |= gone.is_some();
                    continue;
                };
                let shape = NodeShape::of(&node);
                let ready = shape.ready;
                let before = shapes.insert(name.clone(), shape.clone());
                fractions_moved |= before.as_ref().map(|before| before.ready) != Some(ready);
                if before.as_ref() != Some(&shape) {
                    budgets_moved = true;
                    if let Some(uid) = &shape.uid {
                        shared.turns.wake(uid);
                    }
                }
                let Some(identity) = NodeIdentity::of(&node) else {
                    continue;
                };
                if ours(&node) {
                    if !released.contains_key(identity.uid())
                        && workers.insert(identity.uid().to_owned())
                    {
                        let task = NodeTermination::new(Arc::clone(shared), identity.clone());
                        let wake = poked.clone();
                        let stop = acting.child_token();
                        running.spawn(async move { (identity, task.run(wake, stop).await) });
                    }
                } else if node.metadata.deletion_timestamp.is_none()
                    && shared.settings.manages(&node) != has_finalizer(&node)
                    && !in_bookkeeping.contains(&name)
                {
                    if in_bookkeeping.len() < FINALIZER_WRITES_IN_FLIGHT {
                        in_bookkeeping.insert(name.clone());
                        let client = shared.client.clone();
                        let add = shared.settings.manages(&node);
                        bookkeeping
                            .spawn(async move { set_finalizer(&client, identity, add).await });
                    } else {
                        deferred.insert(name.clone());
                    }
                }
                if let Some(timeout) = shared.settings.not_ready_timeout {
                    if let Some(key) = scheduled.remove(&name) {
                        checks.remove(&key);
                    }
                    let managed = shared.settings.manages(&node);
                    if let Some(due) = not_ready_due(&node, timeout, managed) {
                        let wait = Duration::try_from(due.duration_since(Timestamp::now()))
                            .unwrap_or(Duration::ZERO);
                        scheduled.insert(name.clone(), checks.insert(name, wait));
                    }
                }
            }
            if fractions_moved {
                for name in held.drain() {
                    if let Some(key) = scheduled.remove(&name) {
                        checks.remove(&key);
                    }
                    scheduled.insert(name.clone(), checks.insert(name, Duration::ZERO));
                }
            }
            shared.metrics.nodes_terminating.set(workers.len() as i64);
            if std::mem::take(&mut budgets_moved) {
                relevant.send_modify(|changes| *changes += 1);
            }
            if std::mem::take(&mut wake_tasks) {
                poke.send_replace(());
            }
            tokio::select! {
                () = acting.cancelled() => break,
                () = self.dirty.marked() => {}
                changed = budgets.changed() => {
                    if changed.is_err() { break }
                    budgets_moved = true;
                    wake_granted(shared);
                }
                changed = pdbs.changed() => {
                    if changed.is_err() { break }
                    wake_tasks = true;
                }
                changed = drain_rules.changed() => {
                    if changed.is_err() { break }
                    wake_tasks = true;
                }
                changed = namespaces.changed() => {
                    if changed.is_err() { break }
                    wake_tasks = true;
                }
                Some(finished) = running.join_next() => {
                    budgets_moved = true;
                    if let Ok((node, finished)) = finished {
                        workers.remove(node.uid());
                        if finished == Finished::Released {
                            released.insert(node.uid().to_owned(), node.name().to_owned());
                        }
                        self.dirty.mark(node.name());
                    }
                    // Forget released nodes once they are gone from the cache: a lookup each,
                    // not a scan of the cache per finished node.
                    released.retain(|uid, name| {
                        shared.nodes().get(None, name).is_some_and(|node| node.metadata.uid.as_deref() == Some(uid.as_str()))
                    });
                }
                Some(done) = bookkeeping.join_next() => {
                    if let Ok(name) = done {
                        in_bookkeeping.remove(&name);
                    }
                    if let Some(next) = deferred.pop_first() {
                        self.dirty.mark(&next);
                    }
                }
                Some(expired) = checks.next() => {
                    let name = expired.into_inner();
                    scheduled.remove(&name);
                    if let Some(node) = shared.nodes().get(None, &name) {
                        // A leader that loses its lease mid-request stops here too.
                        tokio::select! {
                            () = acting.cancelled() => break,
                            check = delete_not_ready(shared, &node) => {
                                if check == NotReadyCheck::Held {
                                    held.insert(name);
                                } else {
                                    shared.metrics.not_ready_deletions_held.set(0);
                                }
                            }
                        }
                    }
                }
            }
        }
        running.shutdown().await;
        bookkeeping.shutdown().await;
    }
}

/// Wakes the waiting nodes the budgets have granted: a grant the leader's pass wrote is seen
/// once the budget's watch delivers it.
fn wake_granted(shared: &Shared) {
    for budget in shared.budgets.cache.state() {
        let grants = budget
            .status
            .iter()
            .flat_map(|status| status.disrupted_nodes.values());
        for uid in grants.filter_map(|grant| grant.uid.as_deref()) {
            shared.turns.wake_for_grant(uid);
        }
    }
}

/// When a managed, not deleting node that is NotReady reaches the timeout.
fn not_ready_due(node: &Node, timeout: Duration, managed: bool) -> Option<Timestamp> {
    if !managed || node.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let ready = node_condition(node, "Ready")?;
    if ready.status == "True" {
        return None;
    }
    let since = ready.last_transition_time.as_ref()?.0;
    since
        .checked_add(jiff::SignedDuration::try_from(timeout).ok()?)
        .ok()
}

/// What a NotReady timeout check did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NotReadyCheck {
    Done,
    /// Held back by the partition guard.
    Held,
}

async fn delete_not_ready(shared: &Shared, node: &Node) -> NotReadyCheck {
    let Some(timeout) = shared.settings.not_ready_timeout else {
        return NotReadyCheck::Done;
    };
    let due = not_ready_due(node, timeout, shared.settings.manages(node));
    if due.is_none_or(|due| due > Timestamp::now()) {
        return NotReadyCheck::Done;
    }
    let name = node.metadata.name.as_deref().unwrap_or_default();
    let managed: Vec<Arc<Node>> = shared
        .nodes()
        .state()
        .into_iter()
        .filter(|node| shared.settings.manages(node))
        .collect();
    if let Some(partition) =
        partition::partitioned(&managed, node, shared.settings.not_ready_max_fraction)
    {
        shared.metrics.not_ready_deletions_held.set(1);
        tracing::warn!(node = name, %partition, "not deleting the NotReady node");
        shared.reporter.event(EventReport::warning(
            node_reference(name),
            "NotReadyDeletionHeld",
            "Delete",
            format!(
                "Not deleted although NotReady past --not-ready-timeout ({}s): {partition}; \
                 so many at once is taken for a partition, not dead machines",
                timeout.as_secs()
            ),
        ));
        return NotReadyCheck::Held;
    }
    let api: Api<Node> = Api::all(shared.client.clone());
    let params = DeleteParams {
        // The object judged NotReady, unchanged since: a node that reported again (or a
        // namesake) after the cache's view is not deleted on that view.
        preconditions: Some(Preconditions {
            uid: node.metadata.uid.clone(),
            resource_version: node.metadata.resource_version.clone(),
        }),
        ..DeleteParams::default()
    };
    match api.delete(name, &params).await {
        Ok(_) => shared.reporter.event(EventReport::warning(
            node_reference(name),
            "NotReadyTimeout",
            "Delete",
            format!(
                "Deleted: NotReady for longer than --not-ready-timeout ({}s); its termination starts",
                timeout.as_secs()
            ),
        )),
        Err(error) if matches!(status_code(&error), Some(404 | 409)) => {}
        Err(error) => {
            shared.metrics.error("api");
            tracing::warn!(node = name, error = %Chain(&error), "could not delete the NotReady node");
        }
    }
    NotReadyCheck::Done
}

/// Adds our finalizer to a managed node, or removes it from a node no longer managed: this
/// Node object (read fresh, written with its UID and resourceVersion), never other finalizers.
/// A failure is logged; the node's next change tries again. Returns the node's name.
async fn set_finalizer(client: &kube::Client, node: NodeIdentity, add: bool) -> String {
    let result = if add {
        node.update(client, |node| {
            let finalizers = node.metadata.finalizers.get_or_insert_with(Vec::new);
            if finalizers.iter().any(|finalizer| finalizer == FINALIZER) {
                return false;
            }
            finalizers.push(FINALIZER.to_owned());
            true
        })
        .await
        .map(drop)
        .map_err(crate::termination::StepError::from)
    } else {
        remove_finalizer(client, &node).await
    };
    if let Err(error) = result {
        tracing::warn!(node = %node, error = %Chain(&error), "could not update the node's finalizer; retried on its next change");
    }
    node.name().to_owned()
}

/// Keeps every NodeDisruptionBudget's status current while leading, and grants waiting nodes
/// what the budgets allow (the oldest deletion first, one status write per budget): after
/// budget changes and node changes that may move the numbers, and when an unused grant
/// expires. The pass wakes the waiting nodes whose verdict it changed (`Shared::set_waiting`).
async fn keep_statuses(
    shared: Arc<Shared>,
    mut node_changes: watch::Receiver<u64>,
    stop: CancellationToken,
) {
    let mut budgets: Watched<NodeDisruptionBudget> = shared.budgets.cache.clone();
    let mut failures = 0;
    let mut reported: HashSet<String> = HashSet::new();
    loop {
        let metrics = &shared.metrics;
        match refresh_statuses(&shared.budgets).await {
            Ok(refreshed) => {
                failures = 0;
                let present: HashSet<String> = refreshed
                    .allowed
                    .iter()
                    .map(|(name, _)| name.clone())
                    .collect();
                for (name, allowed) in refreshed.allowed {
                    let invalid = refreshed.invalid.contains(&name);
                    let label = NdbLabel { ndb: name };
                    metrics
                        .ndb_disruptions_allowed
                        .get_or_create(&label)
                        .set(i64::from(allowed));
                    metrics
                        .ndb_invalid
                        .get_or_create(&label)
                        .set(i64::from(invalid));
                }
                // A deleted budget's series goes with it, not stays at its last value.
                for gone in reported.difference(&present) {
                    let label = NdbLabel { ndb: gone.clone() };
                    metrics.ndb_disruptions_allowed.remove(&label);
                    metrics.ndb_invalid.remove(&label);
                }
                reported = present;
                for _ in 0..refreshed.conflicts {
                    metrics.error("conflict");
                }
                shared.set_waiting(refreshed.waiting);
            }
            Err(error) => {
                failures += 1;
                shared.metrics.error("api");
                let delay = nodegrace_core::backoff::Backoff::default().delay(failures);
                tracing::warn!(error = %Chain(&error), retry_in = ?delay, "could not update NodeDisruptionBudget status");
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(delay) => continue,
                }
            }
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(STATUS_REFRESH_PAUSE) => {}
        }
        let expiry = next_budget_change(&shared);
        tokio::select! {
            () = stop.cancelled() => return,
            changed = budgets.changed() => if changed.is_err() { return },
            changed = node_changes.changed() => if changed.is_err() { return },
            () = nodegrace_core::timers::sleep_or_forever(expiry) => {}
        }
    }
}

/// What of a node the budgets' numbers and the termination tasks depend on.
#[derive(Debug, Clone, PartialEq, Eq)]
struct NodeShape {
    uid: Option<String>,
    labels: Option<std::collections::BTreeMap<String, String>>,
    ready: bool,
    deleting: bool,
    finalizers: Option<Vec<String>>,
    taints: Vec<(String, String)>,
    unschedulable: Option<bool>,
    provider_id: Option<String>,
    /// Hook annotations (`pre-drain.nodegrace.io/…`, `pre-terminate.nodegrace.io/…`).
    hooks: Vec<String>,
}

impl NodeShape {
    fn of(node: &Node) -> Self {
        let spec = node.spec.as_ref();
        Self {
            uid: node.metadata.uid.clone(),
            labels: node.metadata.labels.clone(),
            ready: readiness(node) == Readiness::Ready,
            deleting: node.metadata.deletion_timestamp.is_some(),
            finalizers: node.metadata.finalizers.clone(),
            taints: nodegrace_core::k8s::nodes::taints(node)
                .iter()
                .map(|taint| (taint.key.clone(), taint.effect.clone()))
                .collect(),
            unschedulable: spec.and_then(|spec| spec.unschedulable),
            provider_id: spec.and_then(|spec| spec.provider_id.clone()),
            hooks: node
                .metadata
                .annotations
                .iter()
                .flatten()
                .map(|(key, _)| key)
                .filter(|key| crate::hooks::is_hook(key))
                .cloned()
                .collect(),
        }
    }
}

/// How long until some budget's numbers change with nothing watched changing: one of its
/// maintenance windows opens or closes, or the grant of a node not being deleted expires.
fn next_budget_change(shared: &Shared) -> Option<Duration> {
    let now = shared.budgets.clock.now();
    let not_deleting = |node: &str| {
        shared
            .nodes()
            .get(None, node)
            .is_some_and(|node| node.metadata.deletion_timestamp.is_none())
    };
    shared
        .budgets
        .cache
        .state()
        .iter()
        .flat_map(|budget| {
            let window = crate::windows::Windows::of(&budget.spec, now)
                .ok()
                .flatten()
                .and_then(|windows| windows.next_change(now))
                .map(|at| Duration::try_from(at.duration_since(now)).unwrap_or_default());
            let expiries = budget
                .grants()
                .into_iter()
                .flatten()
                .filter(|(node, _)| not_deleting(node))
                .map(|(_, granted)| {
                    let age = now.duration_since(granted.granted_at.0).unsigned_abs();
                    crate::grants::UNUSED_GRANT_EXPIRY.saturating_sub(age) + Duration::from_secs(1)
                });
            window.into_iter().chain(expiries)
        })
        .min()
}
