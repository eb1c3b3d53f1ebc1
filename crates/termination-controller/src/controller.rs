//! The leader's loop: the deleting nodes that carry our finalizer, each in the waiting room
//! until its budgets grant it and then with a termination task of its own; the finalizer
//! added to managed nodes on sight; budgets' status kept current; and, with
//! `--not-ready-timeout`, a timer per NotReady node. Watches report which node changed, so
//! the loop never rescans the cluster for one change.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use kube::Api;
use kube::api::{DeleteParams, Preconditions};
use nodegrace_controller::assembly::Lead;
use nodegrace_core::dirty::Dirty;
use nodegrace_core::error_chain::Chain;
use nodegrace_core::k8s::api_errors::status_code;
use nodegrace_core::k8s::cached_node::CachedNode;
use nodegrace_core::k8s::conditions::node_condition;
use nodegrace_core::k8s::events::EventReport;
use nodegrace_core::k8s::node_identity::NodeIdentity;
use nodegrace_core::k8s::node_timers::NodeTimers;
use nodegrace_core::k8s::nodes::{Readiness, node_reference, readiness};
use nodegrace_core::k8s::watched::Watched;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::allocation::refresh_statuses;
use crate::api::{FINALIZER, NodeDisruptionBudget};
use crate::metrics::NdbLabel;
use crate::shared::Shared;
use crate::step::Finished;
use crate::termination::{NodeTermination, cordoned, has_finalizer, ours};
use crate::waiting_room::WaitingRoom;
use crate::waits::Verdict;
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
        // Counts node changes that may move a budget's numbers (heartbeats do not).
        let (relevant, node_changes) = watch::channel(0u64);
        let statuses = tokio::spawn(keep_statuses(
            Arc::clone(&self.shared),
            node_changes,
            acting.child_token(),
        ));
        let sweep = self.shared.handover.clone().map(|handover| {
            tokio::spawn(crate::handover::sweep(
                self.shared.client.clone(),
                self.shared.metrics.clone(),
                handover,
                acting.child_token(),
            ))
        });
        Leading::new(self, &acting, relevant).run().await;
        acting.cancel();
        let _ = statuses.await;
        if let Some(sweep) = sweep {
            let _ = sweep.await;
        }
    }
}

/// The leader's loop: what it keeps between events, one field per kind of per-node work (each
/// keyed by [`NodeIdentity`]: a namesake is another node), and one method per kind of event.
struct Leading<'a> {
    shared: &'a Arc<Shared>,
    dirty: &'a Dirty,
    acting: &'a CancellationToken,
    /// Wakes the tasks past their grants on what every drain reads (PodDisruptionBudgets,
    /// drain rules, namespaces' labels); their own Node's changes wake them by their turns.
    poke: watch::Sender<()>,
    /// Counts node changes that may move a budget's numbers, for the granting pass.
    relevant: watch::Sender<u64>,
    /// Each node (by name, as the watch reports changes) as last seen, to tell a change of what
    /// the budgets and the tasks look at ([`NodeShape`]) from one of anything else (heartbeats,
    /// images, addresses), which wakes nothing. The cache's own objects, shared, not copies: a
    /// copy of every node's shape cost a 10,000-node cluster some 8 MiB.
    seen: HashMap<String, Arc<CachedNode>>,
    waiting: WaitingRoom,
    terminations: Terminations,
    finalizers: FinalizerWrites,
    not_ready: NotReadyChecks,
    budgets_moved: bool,
    wake_tasks: bool,
}

/// A termination task per granted deleting node that carries our finalizer.
#[derive(Default)]
struct Terminations {
    running: BTreeSet<NodeIdentity>,
    /// Nodes whose finalizer a task removed: the cache may still show them with it for a
    /// moment, and they must not get a second task.
    released: BTreeSet<NodeIdentity>,
    tasks: JoinSet<(NodeIdentity, Finished)>,
}

/// Finalizers added to managed nodes and removed from the others, a few at a time.
#[derive(Default)]
struct FinalizerWrites {
    in_flight: BTreeSet<NodeIdentity>,
    /// Nodes (by name) whose write waits for a free slot, marked dirty again when one frees.
    deferred: BTreeSet<String>,
    /// Nodes whose write landed and whose watch event has yet to show it: a change of theirs
    /// seen meanwhile (a new node's first status) must not send the same write again.
    landed: BTreeSet<NodeIdentity>,
    writes: JoinSet<(NodeIdentity, bool)>,
}

impl FinalizerWrites {
    /// Forgets the landed writes of the Node objects named `name` other than `current`.
    fn forget_landed(&mut self, name: &str, current: Option<&CachedNode>) {
        let stale: Vec<NodeIdentity> = self
            .landed
            .range(NodeIdentity::all_named(name))
            .filter(|identity| current.is_none_or(|node| !identity.is(node)))
            .cloned()
            .collect();
        for identity in stale {
            self.landed.remove(&identity);
        }
    }
}

/// With `--not-ready-timeout`, a timer per managed NotReady node.
#[derive(Default)]
struct NotReadyChecks {
    timers: NodeTimers,
    /// Nodes the partition guard holds, checked again whenever some node's readiness changes
    /// or a node comes or goes (that moves the fractions).
    held: BTreeSet<NodeIdentity>,
}

impl<'a> Leading<'a> {
    fn new(
        controller: &'a Controller,
        acting: &'a CancellationToken,
        relevant: watch::Sender<u64>,
    ) -> Self {
        Self {
            shared: &controller.shared,
            dirty: &controller.dirty,
            acting,
            poke: watch::channel(()).0,
            relevant,
            seen: HashMap::new(),
            waiting: WaitingRoom::default(),
            terminations: Terminations::default(),
            finalizers: FinalizerWrites::default(),
            not_ready: NotReadyChecks::default(),
            budgets_moved: true,
            wake_tasks: false,
        }
    }

    async fn run(mut self) {
        let shared = self.shared;
        let mut budgets = shared.budgets.cache.clone();
        let mut pdbs = shared.pdbs.clone();
        let mut drain_rules = shared.drain_rules.clone();
        let mut namespaces = shared.namespaces.clone();
        let mut handover = shared.handover.clone();
        for node in shared.nodes.state() {
            self.dirty
                .mark(node.metadata.name.as_deref().unwrap_or_default());
        }
        let index = &shared.budgets.index;
        let mut indexed_budgets = shared.budgets.cache.state();
        index.sync_budgets(&indexed_budgets, || shared.nodes.state());
        loop {
            let mut fractions_moved = false;
            for name in self.dirty.take() {
                let node = shared.nodes.get(None, &name);
                index.node_changed(&name, node.clone(), &indexed_budgets);
                fractions_moved |= self.node_changed(&name, node);
            }
            if fractions_moved {
                self.recheck_held();
            }
            let terminating = self.terminations.running.len() + self.waiting.len();
            shared.metrics.nodes_terminating.set(terminating as i64);
            if std::mem::take(&mut self.budgets_moved) {
                self.relevant.send_modify(|changes| *changes += 1);
            }
            if std::mem::take(&mut self.wake_tasks) {
                self.poke.send_replace(());
            }
            tokio::select! {
                () = self.acting.cancelled() => break,
                () = self.dirty.marked() => {}
                () = shared.rejudged.marked() => {
                    for uid in shared.rejudged.take() {
                        self.look_at_waiting(&uid);
                    }
                }
                changed = budgets.changed() => {
                    if changed.is_err() { break }
                    indexed_budgets = shared.budgets.cache.state();
                    index.sync_budgets(&indexed_budgets, || shared.nodes.state());
                    self.budgets_changed();
                }
                changed = pdbs.changed() => {
                    if changed.is_err() { break }
                    self.wake_tasks = true;
                }
                changed = drain_rules.changed() => {
                    if changed.is_err() { break }
                    self.wake_tasks = true;
                }
                changed = namespaces.changed() => {
                    if changed.is_err() { break }
                    self.wake_tasks = true;
                }
                changed = handover_changed(&mut handover) => {
                    if changed.is_err() { break }
                    self.wake_tasks = true;
                }
                Some(finished) = self.terminations.tasks.join_next() => {
                    self.termination_finished(finished.ok());
                }
                Some(written) = self.finalizers.writes.join_next() => {
                    self.finalizer_written(written.ok());
                }
                Some(expired) = self.not_ready.timers.expired() => {
                    // A leader that loses its lease mid-request stops here too.
                    tokio::select! {
                        () = self.acting.cancelled() => break,
                        () = self.not_ready_expired(expired) => {}
                    }
                }
            }
        }
        self.terminations.tasks.shutdown().await;
        self.finalizers.writes.shutdown().await;
    }

    /// A node the watch reported changed: its shape, its task, its finalizer, its timer.
    /// Returns whether the NotReady fractions may have moved.
    fn node_changed(&mut self, name: &str, current: Option<Arc<CachedNode>>) -> bool {
        // A landed finalizer write of an earlier Node of this name is not this one's.
        self.finalizers.forget_landed(name, current.as_deref());
        let Some(node) = current else {
            if let Some(handover) = &self.shared.handover {
                handover.ended.notify_one();
            }
            let gone = self.seen.remove(name);
            if let Some(uid) = gone.as_ref().and_then(|node| node.metadata.uid.as_deref()) {
                self.shared.turns.wake(uid);
                self.look_at_waiting(uid);
            }
            self.budgets_moved |= gone.is_some();
            return gone.is_some();
        };
        let shape = NodeShape::of(&node);
        let before = self.seen.insert(name.to_owned(), Arc::clone(&node));
        let before_shape = before.as_deref().map(NodeShape::of);
        // A namesake in the place of a waiting node: the waiting node is gone.
        if let Some(replaced) = before_shape.as_ref().and_then(|before| before.uid)
            && shape.uid != Some(replaced)
        {
            self.look_at_waiting(replaced);
        }
        if before_shape.as_ref() != Some(&shape) {
            self.budgets_moved = true;
            if let Some(uid) = shape.uid {
                self.shared.turns.wake(uid);
            }
        }
        let readiness_moved = before_shape.map(|before| before.ready) != Some(shape.ready);
        if let Some(identity) = NodeIdentity::of(node.as_ref()) {
            if ours(&node) {
                self.start_termination(identity.clone());
            } else {
                self.keep_finalizer(&node, identity.clone());
            }
            self.schedule_not_ready(&node, identity);
        }
        readiness_moved
    }

    /// A deleting node of ours: seated in the waiting room unless it has a task already, and
    /// looked at there.
    fn start_termination(&mut self, node: NodeIdentity) {
        let terminations = &self.terminations;
        if terminations.released.contains(&node) || terminations.running.contains(&node) {
            return;
        }
        let uid = node.uid().to_owned();
        self.waiting.seat(node);
        self.look_at_waiting(&uid);
    }

    /// The waiting node with `uid`, if one waits: gone or no longer ours, it leaves; granted by
    /// every budget covering it (or cordoned already), its task starts; else it is told what
    /// the granting pass judged it waits for (a node the pass has not judged yet waits for
    /// it: the pass judges every waiting node and marks those it judged anew).
    fn look_at_waiting(&mut self, uid: &str) {
        let Some(waiting) = self.waiting.get(uid) else {
            return;
        };
        let shared = self.shared;
        let Some(node) = waiting
            .identity
            .cached(&shared.nodes)
            .filter(|node| ours(node))
        else {
            if let Some((gone, _)) = self.waiting.leave(uid) {
                // Its conditions still queued would land on a namesake, or cost a read.
                drop(shared.reporter.forget_node(gone.name()));
            }
            return;
        };
        if cordoned(&node) || shared.budgets.granted(&node).is_some() {
            if let Some((node, told_planned)) = self.waiting.leave(uid) {
                self.spawn_termination(node, told_planned);
            }
        } else if let Some(Verdict::Waiting { budget, refusal }) = shared.budgets.waiting_on(uid) {
            self.waiting.tell(shared, uid, &budget, &refusal);
        }
    }

    fn spawn_termination(&mut self, node: NodeIdentity, told_planned: bool) {
        let terminations = &mut self.terminations;
        terminations.running.insert(node.clone());
        let task = NodeTermination::new(Arc::clone(self.shared), node.clone(), told_planned);
        let wake = self.poke.subscribe();
        let stop = self.acting.child_token();
        terminations
            .tasks
            .spawn(async move { (node.clone(), task.run(wake, stop).await) });
    }

    /// Adds our finalizer to a managed node that lacks it, or removes it from a node no
    /// longer managed.
    fn keep_finalizer(&mut self, node: &CachedNode, identity: NodeIdentity) {
        let add = self.shared.settings.manages(node);
        let finalizers = &mut self.finalizers;
        if add == has_finalizer(node) {
            finalizers.landed.remove(&identity);
            return;
        }
        if node.metadata.deletion_timestamp.is_some()
            || finalizers.in_flight.contains(&identity)
            || finalizers.landed.contains(&identity)
        {
            return;
        }
        if finalizers.in_flight.len() >= FINALIZER_WRITES_IN_FLIGHT {
            finalizers.deferred.insert(identity.name().to_owned());
            return;
        }
        finalizers.in_flight.insert(identity.clone());
        let client = self.shared.client.clone();
        finalizers
            .writes
            .spawn(async move { set_finalizer(&client, identity, add).await });
    }

    fn schedule_not_ready(&mut self, node: &CachedNode, identity: NodeIdentity) {
        let Some(timeout) = self.shared.settings.not_ready_timeout else {
            return;
        };
        let managed = self.shared.settings.manages(node);
        match not_ready_due(node, timeout, managed) {
            Some(due) => {
                let wait = Duration::try_from(due.duration_since(Timestamp::now()))
                    .unwrap_or(Duration::ZERO);
                self.not_ready.timers.set(identity, wait);
            }
            None => self.not_ready.timers.clear(identity.name()),
        }
    }

    /// The nodes the partition guard holds are checked again.
    fn recheck_held(&mut self) {
        for node in std::mem::take(&mut self.not_ready.held) {
            self.not_ready.timers.set(node, Duration::ZERO);
        }
    }

    fn budgets_changed(&mut self) {
        self.budgets_moved = true;
        for uid in granted_uids(self.shared) {
            self.look_at_waiting(&uid);
        }
    }

    fn termination_finished(&mut self, finished: Option<(NodeIdentity, Finished)>) {
        self.budgets_moved = true;
        if let Some(handover) = &self.shared.handover {
            handover.ended.notify_one();
        }
        let terminations = &mut self.terminations;
        if let Some((node, finished)) = finished {
            terminations.running.remove(&node);
            match finished {
                Finished::Released => {
                    terminations.released.insert(node.clone());
                    self.dirty.mark(node.name());
                }
                // Its grant was given back (or never seen): it waits again, and is looked at
                // on the next change of its budgets or its Node. Looked at now, the cache
                // could still show the grant it gave back.
                Finished::Ungranted => self.waiting.seat(node),
                Finished::NotOurs | Finished::Stopped => self.dirty.mark(node.name()),
            }
        }
        // Forget released nodes once they are gone from the cache: a lookup each, not a scan
        // of the cache per finished node.
        let nodes = &self.shared.nodes;
        terminations
            .released
            .retain(|node| node.cached(nodes).is_some());
    }

    fn finalizer_written(&mut self, written: Option<(NodeIdentity, bool)>) {
        if let Some((node, landed)) = written {
            self.finalizers.in_flight.remove(&node);
            if landed {
                self.finalizers.landed.insert(node);
            }
        }
        if let Some(next) = self.finalizers.deferred.pop_first() {
            self.dirty.mark(&next);
        }
    }

    async fn not_ready_expired(&mut self, identity: NodeIdentity) {
        let Some(node) = identity.cached(&self.shared.nodes) else {
            return;
        };
        if delete_not_ready(self.shared, &node).await == NotReadyCheck::Held {
            self.not_ready.held.insert(identity);
        } else {
            self.shared.metrics.not_ready_deletions_held.set(0);
        }
    }
}

/// The nodes (by UID) the budgets have granted: a grant the leader's pass wrote is seen once
/// the budget's watch delivers it.
fn granted_uids(shared: &Shared) -> Vec<String> {
    let mut uids = Vec::new();
    for budget in shared.budgets.cache.state() {
        let grants = budget
            .status
            .iter()
            .flat_map(|status| status.disrupted_nodes.values());
        uids.extend(grants.filter_map(|grant| grant.uid.clone()));
    }
    uids
}

/// When a managed, not deleting node that is NotReady reaches the timeout.
fn not_ready_due(node: &CachedNode, timeout: Duration, managed: bool) -> Option<Timestamp> {
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

async fn delete_not_ready(shared: &Shared, node: &CachedNode) -> NotReadyCheck {
    let Some(timeout) = shared.settings.not_ready_timeout else {
        return NotReadyCheck::Done;
    };
    let due = not_ready_due(node, timeout, shared.settings.manages(node));
    if due.is_none_or(|due| due > Timestamp::now()) {
        return NotReadyCheck::Done;
    }
    let name = node.metadata.name.as_deref().unwrap_or_default();
    let managed: Vec<Arc<CachedNode>> = shared
        .nodes
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
    let api: Api<CachedNode> = Api::all(shared.client.clone());
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
/// Node object (a patch by its UID, merged on the server: no read, never other finalizers).
/// A failure is logged; the node's next change tries again. Returns the node, and whether the
/// write landed.
async fn set_finalizer(
    client: &kube::Client,
    node: NodeIdentity,
    add: bool,
) -> (NodeIdentity, bool) {
    match node
        .patch_finalizer::<CachedNode>(client, FINALIZER, add)
        .await
    {
        Ok(written) => (node, written.is_some()),
        Err(error) => {
            tracing::warn!(node = %node, error = %Chain(&error), "could not update the node's finalizer; retried on its next change");
            (node, false)
        }
    }
}

/// Keeps every NodeDisruptionBudget's status current while leading, and grants waiting nodes
/// what the budgets allow (the oldest deletion first, one status write per budget): after
/// budget changes and node changes that may move the numbers, and when an unused grant
/// expires. The pass wakes the waiting nodes whose verdict it changed (`Waits::record`).
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
                for uid in &refreshed.rejudged {
                    shared.rejudged.mark(uid);
                }
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
#[derive(Debug, PartialEq, Eq)]
struct NodeShape<'a> {
    uid: Option<&'a str>,
    labels: Option<&'a std::collections::BTreeMap<String, String>>,
    ready: bool,
    deleting: bool,
    finalizers: Option<&'a [String]>,
    taints: Vec<(&'a str, &'a str)>,
    unschedulable: Option<bool>,
    provider_id: Option<&'a str>,
    /// Hook annotations (`pre-drain.nodegrace.io/…`, `pre-terminate.nodegrace.io/…`).
    hooks: Vec<&'a str>,
}

impl<'a> NodeShape<'a> {
    fn of(node: &'a CachedNode) -> Self {
        let spec = node.spec.as_ref();
        Self {
            uid: node.metadata.uid.as_deref(),
            labels: node.metadata.labels.as_ref(),
            ready: readiness(node) == Readiness::Ready,
            deleting: node.metadata.deletion_timestamp.is_some(),
            finalizers: node.metadata.finalizers.as_deref(),
            taints: nodegrace_core::k8s::nodes::taints(node)
                .iter()
                .map(|taint| (taint.key.as_str(), taint.effect.as_str()))
                .collect(),
            unschedulable: spec.and_then(|spec| spec.unschedulable),
            provider_id: spec.and_then(|spec| spec.provider_id.as_deref()),
            hooks: node
                .metadata
                .annotations
                .iter()
                .flatten()
                .map(|(key, _)| key.as_str())
                .filter(|key| crate::hooks::is_hook(key))
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
            .nodes
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

/// A change of our EvictionRequests or their Evictions; never, without the EvictionRequest API.
async fn handover_changed(
    handover: &mut Option<crate::handover::Handover>,
) -> Result<(), nodegrace_core::k8s::watched::WatchEnded> {
    match handover {
        Some(handover) => tokio::select! {
            changed = handover.requests.changed() => changed,
            changed = handover.evictions.changed() => changed,
        },
        None => std::future::pending().await,
    }
}
