//! One node's termination, from its deletion to the removal of our finalizer: budgets →
//! pre-drain hooks → cordon → drain → volumes → pre-terminate hooks → machine → finalizer
//! (the map of the steps is at the top of the crate). Every step starts by looking at what is
//! already done, so a restarted controller (or a new leader) picks a node up where it was:
//! grants are in the budgets' status, the cordon on the node, a terminate request in an
//! annotation, and the machine's state at the provider.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use nodegrace_controller::instances::{
    InstanceError, InstanceProvider, InstanceState, NodeMachine, ProviderId,
};
use nodegrace_core::backoff::{Backoff, Retry};
use nodegrace_core::error_chain::Chain;
use nodegrace_core::k8s::cached_node::CachedNode;
use nodegrace_core::k8s::conditions::ConditionSpec;
use nodegrace_core::k8s::events::EventReport;
use nodegrace_core::k8s::node_identity::{NodeIdentity, Updated};
use nodegrace_core::k8s::nodes::node_reference;
use nodegrace_core::k8s::nodes::{Readiness, has_condition, readiness};
use nodegrace_core::k8s::reporter::ConditionGuard;
use nodegrace_core::k8s::taints::{has_taint, put_taint};
use nodegrace_core::k8s::volumes::Staying;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::api::{DISRUPTED_TAINT, EXCLUDE_FROM_LOAD_BALANCERS, FINALIZER};
use crate::conditions::{DRAIN_IN_PROGRESS, DRAINED, MAINTENANCE_PLANNED, Reason, TERMINATING};
use crate::drain::{Drain, Waiting};
use crate::hooks::{self, Stage};
use crate::shared::Shared;
use crate::step::{Finished, Halt, Step};
use crate::tiers::disrupted_taint;
use crate::turns::Wake;

/// When the terminate request was accepted: a restarted controller waits for that request to
/// finish instead of sending a second one.
pub const TERMINATE_REQUESTED: &str = "nodegrace.io/terminate-requested-at";
/// How often the provider is asked while a machine shuts down (clouds have no watch).
const PROVIDER_POLL: Backoff = Backoff {
    first: Duration::from_millis(200),
    longest: Duration::from_secs(15),
};
/// A machine's failed provider calls (a refused terminate, an unreachable provider, a
/// providerID it cannot read): 1 s doubling to 5 min, plus up to a tenth.
pub const PROVIDER_FAILURES: Backoff = Backoff {
    first: Duration::from_secs(1),
    longest: Duration::from_secs(300),
};

/// What one look at the machine found.
enum Look {
    /// Terminated, or unknown for the whole confirmation: the node may go.
    Gone,
    /// A provider call failed: the machine's backoff says when to look again.
    Failed,
    /// The provider accepted a terminate request just now; the node as marked.
    Requested(Box<CachedNode>),
    /// A request is in progress.
    Waiting,
    /// The provider does not know the machine, not yet for the whole confirmation.
    Unknown,
}
/// Retry delays of failing API writes.
const WRITE_BACKOFF: Backoff = Backoff {
    first: Duration::from_millis(200),
    longest: Duration::from_secs(30),
};

/// One node's termination task.
#[derive(Debug)]
pub struct NodeTermination {
    shared: Arc<Shared>,
    /// The Node deleted: every step acts on this object, never on a namesake.
    node: NodeIdentity,
    /// The reason and message last written per condition type, so a wait that goes on
    /// writes nothing more.
    reported: HashMap<&'static str, (Reason, String)>,
    announced: HashSet<String>,
    /// Since when every provider answer said the machine is not found.
    not_found_since: Option<tokio::time::Instant>,
    /// The machine's failed provider calls, kept across a restart of the steps.
    machine_retry: Retry,
    /// What went as it should, told once in the Event that releases the node: a step that
    /// waited, failed or timed out has an Event of its own, one that did not has a line here.
    story: Vec<String>,
    /// The waiting room told the node `MaintenancePlanned`: its write may not show in the
    /// cache yet, and it turns False all the same.
    told_planned: bool,
}

/// How a wait for hooks ended.
enum Cleared {
    /// A fresh read found none.
    Read(Box<CachedNode>),
    /// The cache's view has none; the next step's own fresh read confirms it.
    Unconfirmed,
    /// `--hook-timeout` passed: the steps go on whatever hooks remain.
    TimedOut,
}

impl NodeTermination {
    /// The task of `node`; `told_planned`: the waiting room told it `MaintenancePlanned`.
    pub fn new(shared: Arc<Shared>, node: NodeIdentity, told_planned: bool) -> Self {
        Self {
            shared,
            node,
            reported: HashMap::new(),
            announced: HashSet::new(),
            not_found_since: None,
            machine_retry: Retry::default(),
            story: Vec::new(),
            told_planned,
        }
    }

    /// The node as cached, if it is still this Node object.
    fn current(&self) -> Option<Arc<CachedNode>> {
        self.node.cached(&self.shared.nodes)
    }

    /// `Terminating=True` with `reason`, unless that is what this task last wrote.
    fn condition(&mut self, reason: Reason, message: String) {
        self.true_once(TERMINATING, reason, message);
    }

    /// Sets condition `type_` True with `reason` and `message`, unless that is what this task
    /// last wrote for it.
    fn true_once(&mut self, type_: &'static str, reason: Reason, message: String) {
        let key = (reason, message.clone());
        if self.reported.get(type_) == Some(&key) {
            return;
        }
        self.reported.insert(type_, key);
        self.write_condition(type_, "True", reason, message);
    }

    fn write_condition(&self, type_: &str, status: &str, reason: Reason, message: String) {
        self.shared.reporter.condition_of(
            &self.node,
            ConditionSpec::new(type_, status, reason.as_str(), message),
            ConditionGuard::Always,
        );
    }

    /// A condition whose reason always says the same ([`Reason::message`]).
    fn fixed_condition(&self, type_: &str, status: &str, reason: Reason, guard: ConditionGuard) {
        let message = reason.message().unwrap_or_default();
        self.shared.reporter.condition_of(
            &self.node,
            ConditionSpec::new(type_, status, reason.as_str(), message),
            guard,
        );
    }

    /// An Event about the node, once per `key` for this task.
    fn announce(&mut self, key: &str, warning: bool, reason: &str, note: String) {
        if !self.announced.insert(key.to_owned()) {
            return;
        }
        let reference = node_reference(self.node.name());
        self.shared.reporter.event(if warning {
            EventReport::warning(reference, reason, "Terminate", note)
        } else {
            EventReport::normal(reference, reason, "Terminate", note)
        });
    }

    /// Runs the termination until the finalizer is gone, it is not ours, or `stop`.
    pub async fn run(mut self, mut wake: watch::Receiver<()>, stop: CancellationToken) -> Finished {
        let mut failures = 0;
        loop {
            let halt = match self.attempt(&mut wake, &stop).await {
                Ok(()) => return Finished::Released,
                Err(halt) => halt,
            };
            let error = match halt.finished() {
                Ok(finished) => return finished,
                Err(error) => error,
            };
            failures += 1;
            self.shared.metrics.error(error.kind());
            let delay = WRITE_BACKOFF.delay(failures);
            tracing::warn!(node = %self.node, error = %Chain(&error), retry_in = ?delay, "node termination step failed");
            tokio::select! {
                () = stop.cancelled() => return Finished::Stopped,
                () = tokio::time::sleep(delay) => {}
            }
        }
    }

    /// The steps in order, each skipped where what it does is already done. The steps that
    /// hold requests are boxed: a task waiting its turn then costs only the wait's memory.
    async fn attempt(&mut self, wake: &mut watch::Receiver<()>, stop: &CancellationToken) -> Step {
        // 2. Budgets (1, the finalizer, is the leader's).
        let shared = Arc::clone(&self.shared);
        let turn = shared.turns.wait(self.node.uid());
        let node = Box::pin(self.granted()).await?;
        // From here on the task wakes on its own Node's changes and on what every drain reads,
        // not on every node's change ([`Wake`]).
        let mut wake = Wake::new(turn, wake.clone());
        let wake = &mut wake;
        // The wait is over: `MaintenancePlanned` turns False where it was True (a node granted at
        // once never gets it). Only where it was set: a write per node would cost every rollout
        // a status request per node for a condition most nodes never had.
        if std::mem::take(&mut self.told_planned)
            || has_condition(node.as_ref(), MAINTENANCE_PLANNED, "True")
        {
            let only_if_true = ConditionGuard::OnlyReplacing("True");
            self.fixed_condition(
                MAINTENANCE_PLANNED,
                "False",
                Reason::DisruptionGranted,
                only_if_true,
            );
        }
        // 3. Pre-drain hooks and 4. the cordon, unless the drain has begun already (a restart
        // mid-drain).
        let deleted = node.metadata.deletion_timestamp.as_ref().map(|time| time.0);
        // A Ready node is drained (below): its pods are listed before the cordon's fresh
        // read, which then confirms them bound to this Node object, with no read of the
        // drain's own.
        let mut early_drain = None;
        if !cordoned(&node) {
            loop {
                let hooks = Box::pin(self.await_hooks(Stage::PreDrain, wake, false, stop)).await?;
                let timed_out = matches!(hooks, Cleared::TimedOut);
                let mut listed = None;
                if readiness(node.as_ref()) == Readiness::Ready {
                    let mut drain =
                        Drain::start(Arc::clone(&self.shared), self.node.clone(), deleted);
                    listed = Some(Box::pin(drain.listed()).await?);
                    early_drain = Some(drain);
                }
                if Box::pin(self.cordon(timed_out)).await? {
                    if let (Some(drain), Some(listed)) = (early_drain.as_mut(), listed) {
                        drain.confirm(listed);
                    }
                    break;
                }
                // A hook the cordon's read found and the cache has yet to show: its watch
                // event is on its way.
                tokio::select! {
                    () = stop.cancelled() => return Err(Halt::Stopped),
                    changed = wake.changed() => if changed.is_err() { return Err(Halt::Stopped) },
                }
            }
        }
        // 5.–7. Drain, unless nothing can run there any more.
        let staying = match Box::pin(self.stopped_machine(&node)).await {
            Some(why) => {
                let why = format!("{why}: the drain and the volume wait are skipped");
                self.announce("drain-skipped", false, "DrainSkipped", why.clone());
                self.condition(Reason::TerminatingInstance, why);
                None
            }
            None => Some(Box::pin(self.drain(wake, stop, deleted, early_drain)).await?),
        };
        // 8. Volumes.
        if let Some(staying) = staying {
            Box::pin(self.volumes_detached(wake, stop, &staying)).await?;
        }
        // 9. Pre-terminate hooks, then 10. the machine.
        let hooks = Box::pin(self.await_hooks(Stage::PreTerminate, wake, true, stop)).await?;
        let fresh = match hooks {
            Cleared::Read(node) => Some(*node),
            Cleared::Unconfirmed | Cleared::TimedOut => None,
        };
        Box::pin(self.terminate_instance(stop, fresh)).await?;
        // 11. Release.
        Box::pin(self.release(deleted)).await
    }

    /// Step 2: every budget covering the node has granted its disruption. The leader's
    /// granting pass writes the grants (oldest deletion first) and starts the task of a node it
    /// sees granted ([`crate::waiting_room`]); a grant given back since, or given back here
    /// on a fresh read, returns the node to the waiting room. A node already cordoned has begun
    /// its disruption and counts as disrupted everywhere.
    async fn granted(&mut self) -> Step<Arc<CachedNode>> {
        let node = self.current().ok_or(Halt::NodeGone)?;
        if !ours(&node) {
            return Err(Halt::NotOurs);
        }
        if cordoned(&node) {
            return Ok(node);
        }
        let budgets = self.shared.budgets.granted(&node).ok_or(Halt::Ungranted)?;
        if Box::pin(self.gave_back_overspent(&node, &budgets)).await? {
            return Err(Halt::Ungranted);
        }
        if !budgets.is_empty() && !self.announced.contains("granted") {
            self.announced.insert("granted".to_owned());
            self.story.push(format!(
                "granted by NodeDisruptionBudget(s) {}",
                budgets.join(", ")
            ));
        }
        Ok(node)
    }

    /// Whether a grant of `budgets` was given back: on a fresh read, one of them is now
    /// over-spent with this node counted (a node of it turned NotReady since the grant).
    async fn gave_back_overspent(&mut self, node: &CachedNode, budgets: &[String]) -> Step<bool> {
        let Some((budget, numbers)) = Box::pin(self.shared.budgets.overspent(node)).await? else {
            return Ok(false);
        };
        self.announce(
            &format!("regranted:{budget}"),
            false,
            Reason::AwaitingBudget.as_str(),
            format!(
                "Grant of NodeDisruptionBudget {budget} given back before the cordon: {numbers}, with this node counted (a node of it turned NotReady since the grant)"
            ),
        );
        Box::pin(self.shared.budgets.release(node, budgets)).await?;
        Ok(true)
    }

    /// Step 11: lets the node go.
    async fn release(&mut self, deleted: Option<Timestamp>) -> Step {
        // Its conditions still queued would land after it is gone: on a namesake registered
        // since, or as a wasted read. Dropped before the object can go, and a write of them
        // under way (read by name) finished first.
        self.shared
            .reporter
            .forget_node(self.node.name())
            .wait()
            .await;
        remove_finalizer(&self.shared.client, &self.node).await?;
        let took = deleted.map(|deleted| {
            Timestamp::now()
                .duration_since(deleted)
                .as_secs_f64()
                .max(0.0)
        });
        if let Some(seconds) = took {
            self.shared.metrics.termination_duration.observe(seconds);
        }
        let mut note =
            format!("Removed {FINALIZER}: the node is drained and its machine terminated");
        if !self.story.is_empty() {
            note = format!("{note} ({})", self.story.join("; "));
        }
        if let Some(seconds) = took {
            note = format!("{note}, {seconds:.0} s after its deletion");
        }
        self.shared.reporter.event(EventReport::normal(
            node_reference(self.node.name()),
            "FinalizerRemoved",
            "Terminate",
            note,
        ));
        Ok(())
    }

    /// Steps 3 and 9: waits while hooks of `stage` hold the node, for at most --hook-timeout.
    /// The wait ends on a fresh read that finds none (a cache behind a hook added since must
    /// not let it pass): this one's with `confirm`, else the next step's (the cordon reads the
    /// node fresh anyway, and one read serves both). The timeout counts from this task's start
    /// of the wait: a restarted controller waits its full length again, erring on the side of
    /// the hook.
    async fn await_hooks(
        &mut self,
        stage: Stage,
        wake: &mut Wake<'_>,
        confirm: bool,
        stop: &CancellationToken,
    ) -> Step<Cleared> {
        let timeout = self.shared.settings.hook_timeout;
        let deadline = timeout.map(|timeout| tokio::time::Instant::now() + timeout);
        loop {
            let node = self.current().ok_or(Halt::NodeGone)?;
            let mut waiting = hooks::pending(&node, stage);
            if waiting.is_empty() {
                if !confirm {
                    return Ok(Cleared::Unconfirmed);
                }
                let fresh = self
                    .node
                    .read(&self.shared.client)
                    .await?
                    .ok_or(Halt::NodeGone)?;
                waiting = hooks::pending(&fresh, stage);
                if waiting.is_empty() {
                    return Ok(Cleared::Read(Box::new(fresh)));
                }
            }
            let names = waiting.join(", ");
            if let (Some(deadline), Some(timeout)) = (deadline, timeout)
                && tokio::time::Instant::now() >= deadline
            {
                self.announce(
                    &format!("hook-timeout:{}", stage.label()),
                    true,
                    "HookTimeout",
                    format!(
                        "The {} hook(s) {names} still hold the node after --hook-timeout ({}s); going on without them",
                        stage.label(),
                        timeout.as_secs()
                    ),
                );
                return Ok(Cleared::TimedOut);
            }
            let message = format!(
                "Waiting for {} hook(s) {names}: each is released by removing its annotation {}<name>",
                stage.label(),
                stage.prefix()
            );
            self.announce(
                &format!("hooks:{}:{names}", stage.label()),
                false,
                stage.reason().as_str(),
                message.clone(),
            );
            self.condition(stage.reason(), message);
            tokio::select! {
                () = stop.cancelled() => return Err(Halt::Stopped),
                changed = wake.changed() => if changed.is_err() { return Err(Halt::Stopped) },
                () = nodegrace_core::timers::sleep_until_or_forever(deadline) => {}
            }
        }
    }

    /// Why the drain can be skipped: the node is NotReady and its machine already stopped or
    /// terminated, so no pod of it runs, and no kubelet will ever confirm an eviction.
    async fn stopped_machine(&self, node: &CachedNode) -> Option<String> {
        if readiness(node) == Readiness::Ready {
            return None;
        }
        let provider = self.shared.provider.as_ref()?;
        let id = self.node.machine(node).ok()?;
        match provider.state(&id).await {
            Ok(state) if state.powered_off() => Some(format!(
                "Node is NotReady and its machine {id} is {state} (instance provider {})",
                provider.name()
            )),
            // Not found may be a cloud's eventual consistency: drain as for a live machine.
            Ok(_) => None,
            Err(error) => {
                tracing::warn!(node = %self.node, error = %error, "cannot ask the provider whether the NotReady node's machine is stopped; draining");
                None
            }
        }
    }

    /// Steps 5–7: drains the node. Returns the volumes of the pods that stay on it.
    async fn drain(
        &mut self,
        wake: &mut Wake<'_>,
        stop: &CancellationToken,
        deleted: Option<Timestamp>,
        started: Option<Drain>,
    ) -> Step<Staying> {
        let mut drain = started
            .unwrap_or_else(|| Drain::start(Arc::clone(&self.shared), self.node.clone(), deleted));
        self.fixed_condition(
            DRAIN_IN_PROGRESS,
            "True",
            Reason::NodeDeleted,
            ConditionGuard::Always,
        );
        drain
            .run(wake, stop, |waiting| {
                let (reason, message) = match waiting {
                    Waiting::DoNotEvict(message) => (Reason::BlockedByDoNotEvict, message),
                    Waiting::Pods { message, .. } => (Reason::Draining, message),
                    Waiting::Completion(message) => (Reason::AwaitingPodCompletion, message),
                };
                self.condition(reason, message.clone());
            })
            .await?;
        if self.announced.insert("drained".to_owned()) {
            self.shared.metrics.nodes_drained.inc();
            self.story.push(drain.summary());
        }
        let done = Reason::DrainCompleted;
        self.fixed_condition(DRAIN_IN_PROGRESS, "False", done, ConditionGuard::Always);
        self.fixed_condition(DRAINED, "True", done, ConditionGuard::Always);
        Ok(Staying::of(&self.shared.client, &drain.left_alone()).await?)
    }

    /// Step 4: cordons this Node object (a fresh read, written back with its UID and
    /// resourceVersion). The read confirms the pre-drain hooks' wait too: with a hook on it
    /// (and `--hook-timeout` not passed), nothing is written and the answer is `false`.
    async fn cordon(&mut self, hooks_timed_out: bool) -> Step<bool> {
        let mut held_by_hook = false;
        let updated = self
            .node
            .update(&self.shared.client, |node| {
                held_by_hook =
                    !hooks_timed_out && !hooks::pending(node, Stage::PreDrain).is_empty();
                if held_by_hook || cordoned(node) {
                    return false;
                }
                node.spec.get_or_insert_with(Default::default).unschedulable = Some(true);
                put_taint(node, &disrupted_taint());
                node.metadata
                    .labels
                    .get_or_insert_with(Default::default)
                    .insert(EXCLUDE_FROM_LOAD_BALANCERS.to_owned(), "true".to_owned());
                true
            })
            .await?;
        if updated == Updated::Gone {
            return Err(Halt::NodeGone);
        }
        if held_by_hook {
            return Ok(false);
        }
        if self.announced.insert("cordoned".to_owned()) {
            self.story.push(format!(
                "cordoned: taint {DISRUPTED_TAINT}:NoSchedule, unschedulable, excluded from external load balancers"
            ));
        }
        Ok(true)
    }

    /// Step 8: waits for the node's VolumeAttachments to go, except those of pods left on it,
    /// for at most --volume-detach-timeout.
    async fn volumes_detached(
        &mut self,
        wake: &mut Wake<'_>,
        stop: &CancellationToken,
        staying: &Staying,
    ) -> Step {
        let deadline = tokio::time::Instant::now() + self.shared.settings.volume_detach_timeout;
        let mut attachments = self.shared.attachments.clone();
        loop {
            let waiting: Vec<String> = self
                .shared
                .attachments
                .state()
                .iter()
                .filter(|attachment| attachment.spec.node_name == self.node.name())
                .filter(|attachment| !staying.keeps(attachment))
                .filter_map(|attachment| attachment.metadata.name.clone())
                .collect();
            if waiting.is_empty() {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                self.announce(
                    "volume-timeout",
                    true,
                    "VolumeDetachTimeout",
                    format!(
                        "VolumeAttachments {} still exist after --volume-detach-timeout ({}s); terminating the machine anyway",
                        waiting.join(", "),
                        self.shared.settings.volume_detach_timeout.as_secs()
                    ),
                );
                return Ok(());
            }
            self.condition(
                Reason::AwaitingVolumeDetachment,
                format!(
                    "VolumeAttachments {} are still attached",
                    waiting.join(", ")
                ),
            );
            tokio::select! {
                () = stop.cancelled() => return Err(Halt::Stopped),
                changed = attachments.changed() => changed?,
                changed = wake.changed() => if changed.is_err() { return Err(Halt::Stopped) },
                () = tokio::time::sleep_until(deadline) => {}
            }
        }
    }

    /// Step 10: asks the provider to terminate the machine unless it is already gone or a request is
    /// in progress, then waits for it to be gone. The machine is the one the deleted Node
    /// object names, read fresh before every terminate request: once that object is gone (its
    /// finalizer removed by someone else) or replaced by a namesake, none is sent. The polls
    /// while a request is in progress ask the provider only: they change nothing, and a read
    /// of the Node per poll was most of the step's cost.
    ///
    /// Two schedules: the polls of a machine on its way out (200 ms doubling to 15 s, begun
    /// again by each accepted request), and the failures' backoff ([`PROVIDER_FAILURES`]),
    /// kept by the task across a restart of the steps, which nothing cuts short.
    async fn terminate_instance(
        &mut self,
        stop: &CancellationToken,
        fresh: Option<CachedNode>,
    ) -> Step {
        let Some(provider) = self.shared.provider.clone() else {
            return Ok(());
        };
        let mut polls = 0;
        let mut last_read: Option<CachedNode> = None;
        // The hooks' fresh read serves as this step's first, unless a backoff makes it old.
        let mut fresh = fresh;
        loop {
            if let Some(wait) = self.machine_retry.wait(tokio::time::Instant::now()) {
                fresh = None;
                tokio::select! {
                    () = stop.cancelled() => return Err(Halt::Stopped),
                    () = tokio::time::sleep(wait) => {}
                }
            }
            let (node, read_this_round) = match (fresh.take(), last_read.take()) {
                (Some(node), _) => (node, true),
                (None, Some(node)) if !self.resend_due(&node) => (node, false),
                _ => (
                    self.node
                        .read(&self.shared.client)
                        .await?
                        .ok_or(Halt::NodeGone)?,
                    true,
                ),
            };
            let id = match self.node.machine(&node) {
                Ok(id) => id,
                Err(error) => {
                    self.machine_failed(&error, "TerminationBlocked");
                    continue;
                }
            };
            let look = self
                .look_at_machine(&*provider, &id, &node, read_this_round)
                .await?;
            let pause = match look {
                Look::Gone => return Ok(()),
                Look::Failed => continue,
                Look::Requested(marked) => {
                    // The node as the mark left it: the polls need no read to know a request
                    // is in progress.
                    last_read = Some(*marked);
                    polls = 0;
                    PROVIDER_POLL.first
                }
                Look::Waiting => {
                    last_read = Some(node);
                    polls += 1;
                    PROVIDER_POLL.delay(polls)
                }
                Look::Unknown => {
                    polls += 1;
                    PROVIDER_POLL.delay(polls)
                }
            };
            let pause = match self.not_found_since {
                // The confirmation is read when it is due, not a poll later.
                Some(since) => pause.min(
                    (since + self.shared.settings.instance_not_found_confirm)
                        .saturating_duration_since(tokio::time::Instant::now())
                        .max(Duration::from_millis(100)),
                ),
                None => pause,
            };
            tokio::select! {
                () = stop.cancelled() => return Err(Halt::Stopped),
                () = tokio::time::sleep(pause) => {}
            }
        }
    }

    /// One look at the machine: its state, and a terminate request when one is due on a read
    /// of this round (never on the one a poll kept: should it fall due meanwhile, the next
    /// round reads again).
    async fn look_at_machine(
        &mut self,
        provider: &dyn InstanceProvider,
        id: &ProviderId,
        node: &CachedNode,
        read_this_round: bool,
    ) -> Step<Look> {
        let state = provider.state(id).await;
        if !matches!(state, Ok(InstanceState::NotFound)) {
            self.not_found_since = None;
        }
        let through = provider.name();
        let state = match state {
            Ok(state) => state,
            Err(error) => {
                self.machine_failed(&error, "InstanceTerminationFailed");
                return Ok(Look::Failed);
            }
        };
        if state == provider.terminated_as() {
            if self.announced.insert("terminated".to_owned()) {
                self.shared.metrics.instances_terminated.inc();
                self.story.push(format!(
                    "machine {id} is {state}: terminated (instance provider {through})"
                ));
            }
            return Ok(Look::Gone);
        }
        if state == InstanceState::NotFound {
            return Ok(self.not_found(id, through));
        }
        if !(read_this_round && self.resend_due(node)) {
            // A request in progress, and this answer a good one: failures start over.
            self.machine_retry.succeeded();
            self.condition(
                Reason::TerminatingInstance,
                format!("Waiting for machine {id} to be terminated (instance provider {through})"),
            );
            return Ok(Look::Waiting);
        }
        self.condition(
            Reason::TerminatingInstance,
            format!("Terminating machine {id} through instance provider {through}"),
        );
        match provider.terminate(id).await {
            Ok(()) => {
                self.machine_retry.succeeded();
                Ok(Look::Requested(self.mark_requested().await?))
            }
            Err(error) => {
                self.machine_failed(&error, "InstanceTerminationFailed");
                Ok(Look::Failed)
            }
        }
    }

    /// Whether a terminate request is due: none was made, or the last is older than
    /// `--terminate-resend-after`.
    fn resend_due(&self, node: &CachedNode) -> bool {
        let resend = self.shared.settings.terminate_resend_after;
        requested_at(node)
            .is_none_or(|at| Timestamp::now().duration_since(at).unsigned_abs() >= resend)
    }

    /// The provider does not know the machine: gone once that has held for
    /// `--instance-not-found-confirm`, since a machine just launched can read as unknown.
    fn not_found(&mut self, id: &ProviderId, through: &str) -> Look {
        let since = *self
            .not_found_since
            .get_or_insert_with(tokio::time::Instant::now);
        let confirm = self.shared.settings.instance_not_found_confirm;
        let shown = format!("{} s", confirm.as_secs_f64());
        if since.elapsed() >= confirm {
            self.announce(
                "not-found",
                false,
                "InstanceNotFound",
                format!(
                    "Machine {id} is not known to instance provider {through} (every answer for \
                     {shown} said so); released as gone"
                ),
            );
            return Look::Gone;
        }
        self.condition(
            Reason::TerminatingInstance,
            format!(
                "Machine {id} is not known to instance provider {through}; released as gone \
                 once that holds for {shown} (a machine just launched can read as unknown)"
            ),
        );
        Look::Unknown
    }

    /// A provider call (or the providerID) failed: the node is held, the failure counted in
    /// the machine's backoff, and said in the condition and in one Event per kind of failure
    /// whose series counts the repeats.
    fn machine_failed(&mut self, error: &InstanceError, reason: &str) {
        let wait = self
            .machine_retry
            .failed(PROVIDER_FAILURES, tokio::time::Instant::now());
        self.shared.metrics.error("provider");
        let through = self
            .shared
            .provider
            .as_ref()
            .map_or("none", |provider| provider.name());
        let failures = self.machine_retry.failures();
        tracing::warn!(node = %self.node, provider = through, error = %error, retry_in = ?wait, failures, "instance provider call failed");
        let said = format!(
            "Instance provider {through} failed: {error}; the node is held, tried again in {} \
             ({failures} failure(s) in a row)",
            format_args!("{:.0} s", wait.as_secs_f64())
        );
        self.condition(Reason::TerminatingInstance, said.clone());
        // Keyed by kind, not text: a request ID in the provider's message would make a new
        // series per try.
        let reference = node_reference(self.node.name());
        let series = format!("{}/{reason}/{}", self.node.uid(), error.kind());
        self.shared
            .reporter
            .event(EventReport::warning(reference, reason, "Terminate", said).in_series(series));
    }

    /// Marks the request on this Node object (a patch by its UID: no read). Returns the
    /// node as marked.
    async fn mark_requested(&self) -> Step<Box<CachedNode>> {
        let now = Timestamp::now().to_string();
        self.node
            .annotate(&self.shared.client, TERMINATE_REQUESTED, &now)
            .await?
            .map(Box::new)
            .ok_or(Halt::NodeGone)
    }
}

/// Removes our finalizer from this Node object: a patch naming its UID, so a namesake is never
/// released, and merged on the server, so another controller's finalizer (added meanwhile or
/// not) is never lost. No read: what decides the release is this program's own work on the
/// node, not a state of the object.
pub async fn remove_finalizer(
    client: &kube::Client,
    node: &NodeIdentity,
) -> Result<(), kube::Error> {
    node.patch_finalizer::<CachedNode>(client, FINALIZER, false)
        .await?;
    Ok(())
}

/// Deleting, with our finalizer.
pub fn ours(node: &CachedNode) -> bool {
    node.metadata.deletion_timestamp.is_some() && has_finalizer(node)
}

pub fn has_finalizer(node: &CachedNode) -> bool {
    node.metadata
        .finalizers
        .iter()
        .flatten()
        .any(|finalizer| finalizer == FINALIZER)
}

pub fn cordoned(node: &CachedNode) -> bool {
    let spec = node.spec.as_ref();
    let unschedulable = spec.and_then(|spec| spec.unschedulable) == Some(true);
    let tainted = has_taint(node, &disrupted_taint());
    let excluded = node
        .metadata
        .labels
        .as_ref()
        .is_some_and(|labels| labels.contains_key(EXCLUDE_FROM_LOAD_BALANCERS));
    unschedulable && tainted && excluded
}

fn requested_at(node: &CachedNode) -> Option<Timestamp> {
    node.metadata
        .annotations
        .as_ref()?
        .get(TERMINATE_REQUESTED)?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn output_size<A, B, C, F>(_: impl Fn(A, B, C) -> F) -> usize {
        std::mem::size_of::<F>()
    }

    /// A task's state is the largest of its steps', so the steps that hold requests are boxed
    /// and cost memory only while they run (7,176 bytes a task before). Nodes waiting for their
    /// grants have no task at all ([`crate::waiting_room`]).
    #[test]
    fn a_task_holds_little_memory_between_its_steps() {
        let run = |task: NodeTermination, wake: watch::Receiver<()>, stop: CancellationToken| {
            task.run(wake, stop)
        };
        let bytes = output_size(run);
        assert!(
            bytes <= 2048,
            "a termination task's future is {bytes} bytes"
        );
    }
}
