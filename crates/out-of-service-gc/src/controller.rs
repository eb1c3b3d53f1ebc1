//! The leader's loop: one cleanup task per node with the out-of-service taint (each watching
//! only its node's pods while it has work), woken when its node (what a pass reads of it),
//! its pods or its VolumeAttachments change; and,
//! with `--auto-taint-after`, a timer per NotReady node for when it becomes a candidate.
//! Watches report *which* object changed, so the loop never rescans thousands of nodes.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use nodegrace_controller::assembly::Lead;
use nodegrace_core::backoff::Backoff;
use nodegrace_core::dirty::Dirty;
use nodegrace_core::error_chain::Chain;
use nodegrace_core::k8s::events::EventReport;
use nodegrace_core::k8s::node_identity::NodeIdentity;
use nodegrace_core::k8s::node_timers::NodeTimers;
use nodegrace_core::k8s::nodes::{node_reference, taint_with_key};
use nodegrace_core::k8s::watched::Watched;
use tokio::sync::{Semaphore, SemaphorePermit, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::api::OUT_OF_SERVICE_TAINT;
use crate::cleanup::{NodeCleanup, Outcome};
use crate::conditions::Reason;
use crate::fencing::{FenceOutcome, Fencer};
use crate::shared::{PassError, Shared};
use crate::tainting::{Attempt, AutoTaint, due_at};

/// How soon a node that could not be confirmed powered off is asked about again.
const RECHECK_UNCONFIRMED: Duration = Duration::from_secs(30);
/// Retry delays of a failing cleanup pass.
const BACKOFF: Backoff = Backoff {
    first: Duration::from_millis(500),
    longest: Duration::from_secs(30),
};

#[derive(Debug)]
pub struct Controller {
    pub shared: Arc<Shared>,
    pub nodes: Watched<Node>,
    pub dirty: Arc<Dirty>,
    /// The nodes whose VolumeAttachments changed.
    pub attachment_changes: Arc<Dirty>,
    pub auto_taint: Option<AutoTaint>,
    pub fencer: Option<Arc<Fencer>>,
}

struct Worker {
    poke: watch::Sender<()>,
    stop: CancellationToken,
    /// What of its Node the cleanup last heard of ([`cleanup_digest`]).
    node_digest: u64,
}

/// A digest of what of a Node a cleanup pass reads: its spec (the taint), annotations and
/// labels (the fence's marks), its deletion, and its Ready condition's status and transition.
/// The rest changes without calling for a pass: above all the pass's own condition, written
/// back, which used to start the next pass (and reopen a clean node's watch) by itself.
fn cleanup_digest(node: &Node) -> u64 {
    use std::hash::{Hash, Hasher};
    let ready = node
        .status
        .as_ref()
        .and_then(|status| status.conditions.as_ref())
        .and_then(|conditions| conditions.iter().find(|c| c.type_ == "Ready"))
        .map(|ready| (&ready.status, &ready.last_transition_time));
    let read = (
        &node.spec,
        &node.metadata.annotations,
        &node.metadata.labels,
        &node.metadata.deletion_timestamp,
        ready,
    );
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    serde_json::to_vec(&read)
        .unwrap_or_default()
        .hash(&mut hasher);
    hasher.finish()
}

impl Lead for Controller {
    fn lead(&self, acting: CancellationToken) -> impl Future<Output = ()> + Send {
        self.run(acting)
    }
}

impl Controller {
    /// Runs until `acting` is cancelled (leadership lost, or the program stopping); every
    /// cleanup task stops with it.
    pub async fn run(&self, acting: CancellationToken) {
        Leading {
            controller: self,
            acting: &acting,
            cleanups: Cleanups::default(),
            auto_taint: AutoTaintWork::default(),
            fencing: self.fencer.clone().map(FenceWork::new),
        }
        .run()
        .await;
    }
}

/// One term as leader: a field per kind of work, a method per event.
struct Leading<'a> {
    controller: &'a Controller,
    acting: &'a CancellationToken,
    cleanups: Cleanups,
    auto_taint: AutoTaintWork,
    fencing: Option<FenceWork>,
}

/// One cleanup task per tainted Node object. By Node object: a namesake is another node. One
/// worker per name at a time: a namesake's starts once the old one has ended.
struct Cleanups {
    workers: BTreeMap<NodeIdentity, Worker>,
    running: JoinSet<NodeIdentity>,
    turns: Arc<Turns>,
}

impl Default for Cleanups {
    fn default() -> Self {
        Self {
            workers: BTreeMap::new(),
            running: JoinSet::new(),
            turns: Arc::new(Turns {
                open: Semaphore::new(OPEN_AT_ONCE),
                first: Semaphore::new(PASSES_AT_ONCE),
                later: Semaphore::new(PASSES_AT_ONCE),
            }),
        }
    }
}

/// Nodes whose cleanup starts its pod watch, or runs a pass, at once. A zone outage taints
/// hundreds of nodes together: started all at once, each node's first LIST of its pods and
/// its force-deletions in flight were held together, 0.6 MiB a node (651 MiB at 1,000).
/// The others wait their turn in a queue, in the order they were tainted.
const PASSES_AT_ONCE: usize = 16;

/// Nodes whose pod watch is open at once: a node's cleanup holds one of these from its watch's
/// opening to its closing, so the watches (a connection and a cache each) are bounded by the
/// work under way, not by the outage's size. With every node of a 1,000-node outage let start,
/// about all of them had their watch open at the peak (90 MiB).
const OPEN_AT_ONCE: usize = 64;

/// Room for [`OPEN_AT_ONCE`] open pod watches, and two queues of [`PASSES_AT_ONCE`] turns:
/// the nodes not started yet, and the passes of the nodes started. In one queue, a started
/// node's next pass (its own deletions seen, its condition written back) waited behind every
/// node tainted after it, and held its pod watch open all that while.
struct Turns {
    open: Semaphore,
    first: Semaphore,
    later: Semaphore,
}

/// `--auto-taint-after`'s timers and attempts.
#[derive(Default)]
struct AutoTaintWork {
    checks: NodeTimers,
    attempts: JoinSet<(NodeIdentity, Attempt)>,
    /// The Node objects told about (a namesake is told about afresh).
    told_unconfirmed: BTreeSet<NodeIdentity>,
}

impl Leading<'_> {
    async fn run(mut self) {
        let controller = self.controller;
        for node in controller.nodes.state() {
            controller
                .dirty
                .mark(&node.metadata.name.clone().unwrap_or_default());
        }
        loop {
            for name in controller.dirty.take() {
                self.node_changed(&name);
            }
            for name in controller.attachment_changes.take() {
                self.attachments_changed(&name);
            }
            let tainted = self.cleanups.workers.len() as i64;
            controller.shared.metrics.nodes_tainted.set(tainted);
            tokio::select! {
                () = self.acting.cancelled() => break,
                () = controller.dirty.marked() => {}
                () = controller.attachment_changes.marked() => {}
                Some(finished) = self.cleanups.running.join_next() => {
                    self.cleanup_finished(finished.ok());
                }
                Some(node) = self.auto_taint.checks.expired() => self.auto_taint_due(node),
                Some(done) = self.auto_taint.attempts.join_next() => {
                    self.auto_taint_tried(done.ok());
                }
                event = fence_event(&mut self.fencing) => self.fence_event(event),
            }
        }
        self.cleanups.running.shutdown().await;
        self.auto_taint.attempts.shutdown().await;
        if let Some(fencing) = &mut self.fencing {
            fencing.attempts.shutdown().await;
        }
        controller.shared.metrics.nodes_tainted.set(0);
    }

    /// A node the watch reported changed: its cleanup, its fence, its auto-taint timer.
    fn node_changed(&mut self, name: &str) {
        let node = self.controller.nodes.get(None, name);
        let identity = node.as_deref().and_then(NodeIdentity::of);
        self.cleanup_changed(name, node.as_deref(), identity.as_ref());
        if let Some(fencing) = &mut self.fencing {
            fencing.changed(&self.controller.shared, name, node.as_deref());
        }
        self.auto_taint_changed(name, node.as_deref(), identity);
    }

    /// Pokes the node's cleanup task, ends an old one a namesake replaced, or starts one for
    /// a node with the taint.
    fn cleanup_changed(
        &mut self,
        name: &str,
        node: Option<&Node>,
        identity: Option<&NodeIdentity>,
    ) {
        let tainted = node.is_some_and(|node| taint_with_key(node, OUT_OF_SERVICE_TAINT).is_some());
        let digest = node.map(cleanup_digest);
        let mut has_worker = false;
        for (started_for, worker) in self
            .cleanups
            .workers
            .range_mut(NodeIdentity::all_named(name))
        {
            has_worker = true;
            if identity.is_some_and(|id| id != started_for) {
                // A namesake took the name: the old task ends (its next read finds its node
                // gone), and its end marks the name for the new one.
                worker.stop.cancel();
            } else if digest != Some(worker.node_digest) {
                worker.node_digest = digest.unwrap_or_default();
                worker.poke.send_replace(());
            }
        }
        let Some(identity) = identity.filter(|_| tainted && !has_worker) else {
            return;
        };
        let (poke, poked) = watch::channel(());
        let stop = self.acting.child_token();
        let (shared, fencer, node) = (
            Arc::clone(&self.controller.shared),
            self.controller.fencer.clone(),
            identity.clone(),
        );
        let cleanup = move || NodeCleanup::new(shared, node, fencer);
        self.cleanups.running.spawn(look_after(
            cleanup,
            Arc::clone(&self.cleanups.turns),
            poked,
            stop.clone(),
            identity.clone(),
        ));
        self.cleanups.workers.insert(
            identity.clone(),
            Worker {
                poke,
                stop,
                node_digest: digest.unwrap_or_default(),
            },
        );
    }

    /// A VolumeAttachment of the node changed: its cleanup may be waiting for the detach.
    fn attachments_changed(&self, name: &str) {
        for worker in self
            .cleanups
            .workers
            .range(NodeIdentity::all_named(name))
            .map(|(_, worker)| worker)
        {
            worker.poke.send_replace(());
        }
    }

    fn cleanup_finished(&mut self, finished: Option<NodeIdentity>) {
        if let Some(node) = finished {
            self.cleanups.workers.remove(&node);
            // Tainted again since the task decided to finish, or a namesake's turn: look
            // again.
            self.controller.dirty.mark(node.name());
        }
    }

    /// Sets the node's `--auto-taint-after` timer, or clears it when it is no candidate.
    fn auto_taint_changed(
        &mut self,
        name: &str,
        node: Option<&Node>,
        identity: Option<NodeIdentity>,
    ) {
        let Some(auto) = &self.controller.auto_taint else {
            return;
        };
        let now = Timestamp::now();
        let due = node.and_then(|node| due_at(node, auto.after, now));
        let work = &mut self.auto_taint;
        if let Some((due, identity)) = due.zip(identity) {
            let wait = Duration::try_from(due.duration_since(now)).unwrap_or(Duration::ZERO);
            work.checks.set(identity, wait);
        } else {
            work.checks.clear(name);
            work.told_unconfirmed.retain(|told| told.name() != name);
        }
    }

    fn auto_taint_due(&mut self, node: NodeIdentity) {
        let Some(auto) = self.controller.auto_taint.clone() else {
            return;
        };
        let shared = Arc::clone(&self.controller.shared);
        self.auto_taint.attempts.spawn(async move {
            let attempt = match auto.attempt(&shared, &node).await {
                Ok(attempt) => attempt,
                Err(error) => {
                    shared.metrics.error(error.kind());
                    Attempt::Unconfirmed(Chain(&error).to_string())
                }
            };
            (node, attempt)
        });
    }

    /// An attempt that could not confirm the machine off: said once per Node object, and
    /// tried again later.
    fn auto_taint_tried(&mut self, done: Option<(NodeIdentity, Attempt)>) {
        let Some((node, Attempt::Unconfirmed(why))) = done else {
            return;
        };
        let name = node.name().to_owned();
        let work = &mut self.auto_taint;
        // The name's earlier Node objects are forgotten: one told about per name.
        work.told_unconfirmed
            .retain(|told| told.name() != name || *told == node);
        if work.told_unconfirmed.insert(node.clone()) {
            tracing::warn!(node = %name, %why, "not tainting: not confirmed powered off");
            self.controller.shared.reporter.event(EventReport::warning(
                node_reference(&name),
                Reason::OutOfServiceNotConfirmed.as_str(),
                "OutOfServiceTaint",
                format!("NotReady long enough for --auto-taint-after, but not tainted: {why}"),
            ));
        }
        if !work.checks.has(&name) {
            work.checks.set(node, RECHECK_UNCONFIRMED);
        }
    }

    fn fence_event(&mut self, event: FenceEvent) {
        let Some(fencing) = &mut self.fencing else {
            return;
        };
        let shared = &self.controller.shared;
        match event {
            FenceEvent::Due(node) => fencing.expired(shared, node),
            FenceEvent::Finished(node, outcome) => {
                let current = self.controller.nodes.get(None, node.name());
                fencing.finished(shared, node, outcome, current.as_deref());
            }
        }
    }
}

/// `--fence-after`'s timers and attempts: at most one attempt per node at a time, and what
/// comes after it decided by how it ended.
struct FenceWork {
    fencer: Arc<Fencer>,
    timers: NodeTimers,
    /// Nodes with an attempt under way.
    running: BTreeSet<NodeIdentity>,
    attempts: JoinSet<(NodeIdentity, FenceOutcome)>,
}

/// An attempt that found nothing to do is not repeated sooner than this, whatever a lagging
/// cache says.
const FENCE_REPEAT_MIN: Duration = Duration::from_secs(1);

impl FenceWork {
    fn new(fencer: Arc<Fencer>) -> Self {
        Self {
            fencer,
            timers: NodeTimers::default(),
            running: BTreeSet::new(),
            attempts: JoinSet::new(),
        }
    }

    /// The node changed: (re)schedule its look, unless an attempt is under way.
    fn changed(&mut self, shared: &Shared, name: &str, node: Option<&Node>) {
        if self
            .running
            .range(NodeIdentity::all_named(name))
            .next()
            .is_some()
        {
            return;
        }
        self.schedule_due(shared, name, node, Duration::ZERO);
    }

    fn schedule_due(&mut self, shared: &Shared, name: &str, node: Option<&Node>, least: Duration) {
        self.timers.clear(name);
        let Some(node) = node else { return };
        let Some(identity) = NodeIdentity::of(node) else {
            return;
        };
        let now = Timestamp::now();
        let Some(due) = self.fencer.due_at(node, now) else {
            return;
        };
        self.fencer.seen_not_ready(shared, node, due);
        let wait = Duration::try_from(due.duration_since(now)).unwrap_or(Duration::ZERO);
        // A change never brings a look forward past the node's backoff.
        let backing_off = self.fencer.retry_wait(&identity).unwrap_or_default();
        self.timers.set(identity, wait.max(least).max(backing_off));
    }

    fn expired(&mut self, shared: &Arc<Shared>, node: NodeIdentity) {
        self.running.insert(node.clone());
        let (fencer, shared) = (Arc::clone(&self.fencer), Arc::clone(shared));
        self.attempts.spawn(async move {
            let outcome = match fencer.attempt(&shared, &node).await {
                Ok(outcome) => outcome,
                Err(error) => {
                    let wait = fencer.failed(&node, BACKOFF);
                    tracing::warn!(node = %node.name(), error = %Chain(&error), retry_in = ?wait, "fence attempt failed");
                    shared.metrics.error(error.kind());
                    FenceOutcome::Retry(wait)
                }
            };
            (node, outcome)
        });
    }

    fn finished(
        &mut self,
        shared: &Shared,
        node: NodeIdentity,
        outcome: FenceOutcome,
        current: Option<&Node>,
    ) {
        self.running.remove(&node);
        match outcome {
            FenceOutcome::Retry(wait) => self.timers.set(node, wait),
            FenceOutcome::NotDue => {
                let name = node.name().to_owned();
                self.schedule_due(shared, &name, current, FENCE_REPEAT_MIN);
            }
            FenceOutcome::WaitForChange => {}
        }
    }
}

enum FenceEvent {
    Due(NodeIdentity),
    Finished(NodeIdentity, FenceOutcome),
}

/// The next timer or finished attempt of `--fence-after`; never, when it is off.
async fn fence_event(fencing: &mut Option<FenceWork>) -> FenceEvent {
    let Some(FenceWork {
        timers, attempts, ..
    }) = fencing
    else {
        return std::future::pending().await;
    };
    loop {
        tokio::select! {
            Some(node) = timers.expired() => return FenceEvent::Due(node),
            Some(done) = attempts.join_next() => {
                // A panicked attempt: its node is looked at again by its next change.
                if let Ok((node, outcome)) = done {
                    return FenceEvent::Finished(node, outcome);
                }
            }
            else => return std::future::pending().await,
        }
    }
}

/// A turn from `slots`, or none once the task is stopped.
async fn take_slot<'a>(
    slots: &'a Semaphore,
    stop: &CancellationToken,
) -> Option<SemaphorePermit<'a>> {
    tokio::select! {
        () = stop.cancelled() => None,
        permit = slots.acquire() => permit.ok(),
    }
}

/// One node's cleanup task: passes until the node needs nothing more, waiting between them for
/// a change of its pods, a poke (its node or attachments changed), or a timer. Its pod watch
/// opens in room of its own and each pass runs in a turn of its own ([`Turns`]). A node with
/// nothing to do for longer than [`LINGER`] rests: its watch closes once quiet for [`LINGER`]
/// (at once when other nodes wait for room), and a poke, its timer or `--clean-node-recheck`
/// opens it again.
async fn look_after(
    cleanup: impl FnOnce() -> NodeCleanup,
    turns: Arc<Turns>,
    mut poked: watch::Receiver<()>,
    stop: CancellationToken,
    node: NodeIdentity,
) -> NodeIdentity {
    let Some(mut room) = take_slot(&turns.open, &stop).await else {
        return node;
    };
    let Some(slot) = take_slot(&turns.first, &stop).await else {
        return node;
    };
    let cleanup = cleanup();
    let recheck = cleanup.shared().settings.clean_node_recheck;
    let mut first_slot = Some(slot);
    let mut pods = None;
    let mut failures = 0;
    loop {
        let slot = match first_slot.take() {
            Some(slot) => slot,
            None => match take_slot(&turns.later, &stop).await {
                Some(slot) => slot,
                None => return node,
            },
        };
        let watched = pods.get_or_insert_with(|| cleanup.pods());
        tokio::select! {
            () = stop.cancelled() => return node,
            synced = watched.synced() => if synced.is_err() { return node },
        }
        watched.mark_seen();
        // Boxed: inline, a pass's state (its deletions in flight) sized every waiting task.
        let passed = Box::pin(cleanup.pass()).await;
        drop(slot);
        let outcome = match passed {
            Ok(Outcome::Finished) => return node,
            Ok(outcome) => {
                failures = 0;
                outcome
            }
            Err(error) => {
                failures = match error {
                    PassError::Partial(_) => 1,
                    PassError::Api { .. } | PassError::Contended { .. } => failures + 1,
                };
                let delay = BACKOFF.delay(failures);
                tracing::warn!(node = %node.name(), error = %Chain(&error), retry_in = ?delay, "cleanup pass failed");
                cleanup.shared().metrics.error(error.kind());
                // Backing off: changes do not cut the wait short.
                tokio::select! {
                    () = stop.cancelled() => return node,
                    () = tokio::time::sleep(delay) => continue,
                }
            }
        };
        let passed_at = Instant::now();
        let (timer, rests) = match between(outcome, turns.open.available_permits()) {
            Between::Watch(wait) => (wait, false),
            Between::Rest { linger } => (Some(linger), true),
        };
        let quiet = tokio::select! {
            () = stop.cancelled() => return node,
            changed = watched.changed() => if changed.is_err() { return node } else { false },
            changed = poked.changed() => if changed.is_err() { return node } else { false },
            () = nodegrace_core::timers::sleep_or_forever(timer) => rests,
        };
        if quiet {
            pods = None;
            cleanup.close_pods();
            drop(room);
            let until = rest_until(outcome, passed_at, recheck);
            tokio::select! {
                () = stop.cancelled() => return node,
                changed = poked.changed() => if changed.is_err() { return node },
                () = nodegrace_core::timers::sleep_until_or_forever(until) => {}
            }
            room = match take_slot(&turns.open, &stop).await {
                Some(room) => room,
                None => return node,
            };
        }
    }
}

/// When a resting node's next pass is due at the latest: its own wait's end, or the recheck
/// from now. A wait or recheck past any `Instant` (a toleration of years) is no deadline.
fn rest_until(outcome: Outcome, passed_at: Instant, recheck: Duration) -> Option<Instant> {
    let due = match outcome {
        Outcome::Wait(Some(wait)) => passed_at.checked_add(wait),
        _ => None,
    };
    match (due, Instant::now().checked_add(recheck)) {
        (Some(due), Some(recheck)) => Some(due.min(recheck)),
        (due, recheck) => due.or(recheck),
    }
}

/// What a node's task does with its pod watch after a pass, with `room_left` watches still
/// free to open.
#[derive(Debug, PartialEq, Eq)]
enum Between {
    /// Keeps its watch, and its room, for a change of its pods or the next pass due this soon.
    Watch(Option<Duration>),
    /// Closes its watch after `linger` without a change, giving its room back; a poke, its due
    /// time or the recheck opens it again. A node whose next pass is far off (a toleration
    /// running out, an attachment or a Ready node to wait for) held its room all that while,
    /// and enough of them would have kept every other node from starting.
    Rest { linger: Duration },
}

fn between(outcome: Outcome, room_left: usize) -> Between {
    let linger = if room_left == 0 {
        // Others wait for room: it is theirs at once.
        Duration::ZERO
    } else {
        LINGER
    };
    match outcome {
        Outcome::Wait(None) => Between::Watch(None),
        Outcome::Wait(Some(wait)) if wait <= LINGER => Between::Watch(Some(wait)),
        Outcome::Wait(Some(_)) | Outcome::Rest | Outcome::Finished => Between::Rest { linger },
    }
}

/// How long a clean node's pod watch stays open without a change. Its own last condition
/// write comes back as a Node change within it, and is looked at with the watch still open.
const LINGER: Duration = Duration::from_secs(10);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_with_nothing_soon_to_do_gives_its_room_back() {
        let soon = Duration::from_secs(3);
        let toleration = Outcome::Wait(Some(Duration::from_secs(300)));
        assert_eq!(
            between(Outcome::Wait(Some(soon)), 0),
            Between::Watch(Some(soon))
        );
        assert_eq!(
            between(Outcome::Wait(Some(LINGER)), 5),
            Between::Watch(Some(LINGER))
        );
        // Waiting for its pods to change needs the watch.
        assert_eq!(between(Outcome::Wait(None), 0), Between::Watch(None));
        let lingers = Between::Rest { linger: LINGER };
        assert_eq!(between(Outcome::Rest, 5), lingers);
        assert_eq!(between(toleration, 5), lingers);
        // Other nodes wait for room: no lingering.
        let at_once = Between::Rest {
            linger: Duration::ZERO,
        };
        assert_eq!(between(Outcome::Rest, 0), at_once);
        assert_eq!(between(toleration, 0), at_once);
    }

    #[test]
    fn a_resting_node_is_due_at_its_wait_or_the_recheck_and_a_wait_of_years_is_no_deadline() {
        let now = Instant::now();
        let recheck = Duration::from_secs(300);
        let toleration = Outcome::Wait(Some(Duration::from_secs(60)));
        assert_eq!(
            rest_until(toleration, now, recheck),
            Some(now + Duration::from_secs(60))
        );
        let later = rest_until(Outcome::Rest, now, recheck).expect("a recheck");
        assert!(later >= now + recheck);
        let years = Outcome::Wait(Some(Duration::MAX));
        assert!(rest_until(years, now, recheck).is_some_and(|due| due >= now + recheck));
        assert_eq!(rest_until(years, now, Duration::MAX), None);
    }

    /// What a resting node's task holds between passes, whatever a pass needs while it runs.
    #[test]
    fn a_cleanup_task_between_passes_is_small() {
        let (_poke, poked) = watch::channel(());
        let turns = Arc::new(Turns {
            open: Semaphore::new(1),
            first: Semaphore::new(1),
            later: Semaphore::new(1),
        });
        let task = look_after(
            || -> NodeCleanup { unreachable!("never started") },
            turns,
            poked,
            CancellationToken::new(),
            NodeIdentity::new("node-1", "uid-1"),
        );
        // 5.3 KiB before the pass was boxed; 1,000 nodes of an outage each have one.
        let size = std::mem::size_of_val(&task);
        assert!(
            size < 2048,
            "a cleanup task holds {size} bytes between passes"
        );
    }
}
