//! One node's termination, from its deletion to the removal of our finalizer: budgets →
//! pre-drain hooks → cordon → drain → volumes → pre-terminate hooks → machine → finalizer. Every step starts by looking at what is
//! already done, so a restarted controller (or a new leader) picks a node up where it was:
//! grants are in the budgets' status, the cordon on the node, a terminate request in an
//! annotation, and the machine's state at the provider.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use nodegrace_core::backoff::Backoff;
use nodegrace_core::error_chain::Chain;
use nodegrace_core::instances::{InstanceError, InstanceState};
use nodegrace_core::k8s::conditions::ConditionSpec;
use nodegrace_core::k8s::events::EventReport;
use nodegrace_core::k8s::node_identity::{NodeIdentity, UpdateError, Updated};
use nodegrace_core::k8s::nodes::node_reference;
use nodegrace_core::k8s::nodes::{Readiness, has_condition, readiness};
use nodegrace_core::k8s::reporter::ConditionGuard;
use nodegrace_core::k8s::volumes::Staying;
use nodegrace_core::k8s::watched::WatchEnded;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::api::{DISRUPTED_TAINT, EXCLUDE_FROM_LOAD_BALANCERS, FINALIZER};
use crate::drain::{self, Drain, Waiting};
use crate::grants::{Refusal, Verdict};
use crate::hooks::{self, Stage};
use crate::shared::Shared;
use crate::tiers::disrupted_taint;
use crate::turns::Wake;

pub const TERMINATING: &str = "Terminating";
pub const DRAIN_IN_PROGRESS: &str = "DrainInProgress";
pub const DRAINED: &str = "Drained";
/// KEP-5683's condition for a node expected to undergo maintenance: True while the node waits
/// for its NodeDisruptionBudgets or their maintenance windows.
pub const MAINTENANCE_PLANNED: &str = "MaintenancePlanned";
/// KEP-5683's reason for a drain that met its criteria.
const DRAIN_COMPLETED: &str = "DrainCompleted";
/// When the terminate request was accepted: a restarted controller waits for that request to
/// finish instead of sending a second one.
pub const TERMINATE_REQUESTED: &str = "nodegrace.io/terminate-requested-at";
/// A request the provider accepted but never carried out is sent again after this long.
const TERMINATE_RESEND: Duration = Duration::from_secs(300);
/// How often the provider is asked while a machine shuts down (clouds have no watch).
const PROVIDER_POLL: Backoff = Backoff {
    first: Duration::from_millis(200),
    longest: Duration::from_secs(15),
};
/// Retry delays of failing API writes.
const WRITE_BACKOFF: Backoff = Backoff {
    first: Duration::from_millis(200),
    longest: Duration::from_secs(30),
};

/// How a node's termination ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finished {
    /// Our finalizer is removed, or the Node (by UID) is gone: someone else let it go, and a
    /// namesake that may have taken its name is none of this task's business.
    Released,
    /// Not ours to do (not deleting, or no finalizer of ours).
    NotOurs,
    /// Leadership lost or the program stopping.
    Stopped,
}

/// One node's termination task.
#[derive(Debug)]
pub struct NodeTermination {
    shared: Arc<Shared>,
    /// The Node deleted: every step acts on this object, never on a namesake.
    node: NodeIdentity,
    /// The reason and message last written per condition type, so a wait that goes on
    /// writes nothing more.
    reported: HashMap<&'static str, (String, String)>,
    announced: HashSet<String>,
    /// Since when every provider answer said the machine is not found.
    not_found_since: Option<tokio::time::Instant>,
}

impl NodeTermination {
    pub fn new(shared: Arc<Shared>, node: NodeIdentity) -> Self {
        Self {
            shared,
            node,
            reported: HashMap::new(),
            announced: HashSet::new(),
            not_found_since: None,
        }
    }

    /// The node as cached, if it is still this Node object.
    fn current(&self) -> Option<Arc<Node>> {
        self.node.cached(self.shared.nodes())
    }

    fn condition(&mut self, reason: &str, message: String) {
        self.true_once(TERMINATING, reason, message);
    }

    /// Sets condition `type_` True with `reason` and `message`, unless that is what this task
    /// last wrote for it.
    fn true_once(&mut self, type_: &'static str, reason: &str, message: String) {
        let key = (reason.to_owned(), message.clone());
        if self.reported.get(type_) == Some(&key) {
            return;
        }
        self.reported.insert(type_, key);
        self.shared.reporter.condition(
            self.node.name(),
            ConditionSpec::new(type_, "True", reason, message),
            ConditionGuard::Always,
        );
    }

    /// `MaintenancePlanned=True` while the node waits for a budget: reason `MaintenanceWindow`
    /// when it waits for a window, `AwaitingBudget` otherwise.
    fn maintenance_planned(&mut self, reason: &str, message: String) {
        self.true_once(MAINTENANCE_PLANNED, reason, message);
    }

    /// The wait is over: `MaintenancePlanned` turns False where it was True (a node granted at
    /// once never gets it).
    fn maintenance_started(&self) {
        self.shared.reporter.condition(
            self.node.name(),
            ConditionSpec::new(
                MAINTENANCE_PLANNED,
                "False",
                "DisruptionGranted",
                "Its NodeDisruptionBudgets granted the disruption; the node is being terminated",
            ),
            ConditionGuard::OnlyReplacing("True"),
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
            let result = self.attempt(&mut wake, &stop).await;
            match result {
                Ok(finished) => return finished,
                Err(error) => {
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
        }
    }

    async fn attempt(
        &mut self,
        wake: &mut watch::Receiver<()>,
        stop: &CancellationToken,
    ) -> Result<Finished, StepError> {
        // 1. Every budget covering the node grants its disruption. The leader's allocation
        // pass writes the grants (oldest deletion first); this task waits to see them, woken
        // only when its own verdict, Node or grant changes (`turns`). A node already cordoned
        // has begun its disruption and counts as disrupted everywhere.
        let shared = Arc::clone(&self.shared);
        let mut turn = shared.turns.wait(self.node.uid());
        let node = loop {
            let Some(node) = self.current() else {
                return Ok(Finished::Released);
            };
            if !ours(&node) {
                return Ok(Finished::NotOurs);
            }
            if cordoned(&node) {
                break node;
            }
            if let Some(budgets) = self.shared.budgets.granted(&node) {
                if let Some((budget, numbers)) =
                    Box::pin(self.shared.budgets.overspent(&node)).await?
                {
                    self.announce(
                        &format!("regranted:{budget}"),
                        false,
                        "AwaitingBudget",
                        format!(
                            "Grant of NodeDisruptionBudget {budget} given back before the cordon: {numbers}, with this node counted (a node of it turned NotReady since the grant)"
                        ),
                    );
                    Box::pin(self.shared.budgets.release(&node, &budgets)).await?;
                    tokio::select! {
                        () = stop.cancelled() => return Ok(Finished::Stopped),
                        () = turn.woken() => {}
                    }
                    continue;
                }
                if !budgets.is_empty() {
                    self.announce(
                        "granted",
                        false,
                        "DisruptionGranted",
                        format!("Granted by NodeDisruptionBudget(s) {}", budgets.join(", ")),
                    );
                }
                break node;
            }
            // A node the leader's pass has not judged yet waits for it: the pass judges every
            // waiting node and wakes those it judged anew. Judging here instead costs a scan of
            // every cached node per waiting node — a rollout of 5,000 spent three quarters of
            // its CPU on it.
            if let Some(Verdict::Waiting { budget, refusal }) =
                self.shared.waiting_on(self.node.uid())
            {
                let invalid = matches!(refusal, Refusal::Invalid(_));
                self.announce(
                    &format!("waiting:{budget}:{invalid}"),
                    invalid,
                    "AwaitingBudget",
                    format!("Waiting for NodeDisruptionBudget {budget}: {refusal}"),
                );
                // Without the budget's numbers, which change with every node that comes or
                // goes: one write per waiting node, not one per change.
                let planned = match &refusal {
                    Refusal::Exhausted(_) => format!(
                        "NodeDisruptionBudget {budget}: too few of its nodes are available now"
                    ),
                    Refusal::Invalid(_) => {
                        format!("NodeDisruptionBudget {budget}: the budget is invalid")
                    }
                    Refusal::OutsideWindows { .. } | Refusal::WindowSpent { .. } => {
                        format!("NodeDisruptionBudget {budget}: {refusal}")
                    }
                };
                let reason = if refusal.is_window() {
                    "MaintenanceWindow"
                } else {
                    "AwaitingBudget"
                };
                // Nor the condition: it is written when the wait changes, not at every node of
                // the budget that comes or goes (the budget's status has the numbers).
                let waiting = match &refusal {
                    Refusal::Exhausted(_) => planned.clone(),
                    _ => format!("NodeDisruptionBudget {budget}: {refusal}"),
                };
                self.maintenance_planned(reason, planned);
                self.condition("AwaitingBudget", waiting);
            }
            tokio::select! {
                () = stop.cancelled() => return Ok(Finished::Stopped),
                () = turn.woken() => {}
            }
        };
        // From here on the task wakes on its own Node's changes and on what every drain reads,
        // not on every node's change ([`Wake`]).
        let mut wake = Wake::new(turn, wake.clone());
        let wake = &mut wake;
        // Only where it was set: a write per node would cost every rollout a status request
        // per node for a condition most nodes never had.
        if self.reported.contains_key(MAINTENANCE_PLANNED)
            || has_condition(&node, MAINTENANCE_PLANNED, "True")
        {
            self.maintenance_started();
        }
        // 2. Pre-drain hooks, unless the drain has begun already (a restart mid-drain).
        if !cordoned(&node)
            && let Some(finished) = Box::pin(self.await_hooks(Stage::PreDrain, wake, stop))
                .await?
                .finished()
        {
            return Ok(finished);
        }
        // 3. Cordon.
        if !cordoned(&node) {
            if Box::pin(self.cordon()).await? == Updated::Gone {
                return Ok(Finished::Released);
            }
            self.announce(
                "cordoned",
                false,
                "Cordoned",
                format!("Cordoned: taint {DISRUPTED_TAINT}:NoSchedule, unschedulable, excluded from external load balancers"),
            );
        }
        // 4. Drain, unless nothing can run there any more.
        let deleted = node.metadata.deletion_timestamp.as_ref().map(|time| time.0);
        let stopped_machine = Box::pin(self.stopped_machine(&node)).await;
        let staying = if let Some(why) = stopped_machine {
            self.announce(
                "drain-skipped",
                false,
                "DrainSkipped",
                format!("{why}: the drain and the volume wait are skipped"),
            );
            self.condition(
                "TerminatingInstance",
                format!("{why}: the drain and the volume wait are skipped"),
            );
            None
        } else {
            match Box::pin(self.drain(wake, stop, deleted)).await? {
                DrainEnd::Drained(staying) => Some(staying),
                DrainEnd::Stopped => return Ok(Finished::Stopped),
                DrainEnd::NodeGone => return Ok(Finished::Released),
            }
        };
        // 5. Volumes.
        if let Some(staying) = staying
            && !Box::pin(self.volumes_detached(wake, stop, &staying)).await?
        {
            return Ok(Finished::Stopped);
        }
        // 6. Pre-terminate hooks, then the machine.
        if let Some(finished) = Box::pin(self.await_hooks(Stage::PreTerminate, wake, stop))
            .await?
            .finished()
        {
            return Ok(finished);
        }
        if let Some(finished) = Box::pin(self.terminate_instance(stop)).await?.finished() {
            return Ok(finished);
        }
        // 7. Release the node. Its conditions still queued would land after it is gone: on a
        // namesake registered since, or as a wasted read. Dropped before the object can go.
        self.shared.reporter.forget_node(self.node.name());
        Box::pin(remove_finalizer(&self.shared.client, &self.node)).await?;
        if let Some(deleted) = deleted {
            let seconds = Timestamp::now()
                .duration_since(deleted)
                .as_secs_f64()
                .max(0.0);
            self.shared.metrics.termination_duration.observe(seconds);
        }
        self.shared.reporter.event(EventReport::normal(
            node_reference(self.node.name()),
            "FinalizerRemoved",
            "Terminate",
            format!("Removed {FINALIZER}: the node is drained and its machine terminated"),
        ));
        Ok(Finished::Released)
    }

    /// Waits while hooks of `stage` hold the node, for at most --hook-timeout. The wait ends on
    /// a fresh read that finds none (a cache behind a hook added since must not let it pass).
    /// The timeout counts from this task's start of the wait: a restarted controller waits
    /// its full length again, erring on the side of the hook.
    async fn await_hooks(
        &mut self,
        stage: Stage,
        wake: &mut Wake<'_>,
        stop: &CancellationToken,
    ) -> Result<StepEnd, StepError> {
        let timeout = self.shared.settings.hook_timeout;
        let deadline = timeout.map(|timeout| tokio::time::Instant::now() + timeout);
        loop {
            let Some(node) = self.current() else {
                return Ok(StepEnd::NodeGone);
            };
            let mut waiting = hooks::pending(&node, stage);
            if waiting.is_empty() {
                let Some(fresh) = self.node.read(&self.shared.client).await? else {
                    return Ok(StepEnd::NodeGone);
                };
                waiting = hooks::pending(&fresh, stage);
                if waiting.is_empty() {
                    return Ok(StepEnd::Done);
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
                return Ok(StepEnd::Done);
            }
            let message = format!(
                "Waiting for {} hook(s) {names}: each is released by removing its annotation {}<name>",
                stage.label(),
                stage.prefix()
            );
            self.announce(
                &format!("hooks:{}:{names}", stage.label()),
                false,
                stage.reason(),
                message.clone(),
            );
            self.condition(stage.reason(), message);
            tokio::select! {
                () = stop.cancelled() => return Ok(StepEnd::Stopped),
                changed = wake.changed() => if changed.is_err() { return Ok(StepEnd::Stopped) },
                    () = nodegrace_core::timers::sleep_until_or_forever(deadline) => {}
            }
        }
    }

    /// Why the drain can be skipped: the node is NotReady and its machine already stopped or
    /// terminated, so no pod of it runs, and no kubelet will ever confirm an eviction.
    async fn stopped_machine(&self, node: &Node) -> Option<String> {
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

    /// Drains the node; `Drained` carries the volumes of the pods that stay on it.
    async fn drain(
        &mut self,
        wake: &mut Wake<'_>,
        stop: &CancellationToken,
        deleted: Option<Timestamp>,
    ) -> Result<DrainEnd, StepError> {
        let mut drain = Drain::start(Arc::clone(&self.shared), self.node.clone(), deleted);
        self.shared.reporter.condition(
            self.node.name(),
            ConditionSpec::new(
                DRAIN_IN_PROGRESS,
                "True",
                "NodeDeleted",
                "The node is deleted; its pods are evicted tier by tier",
            ),
            ConditionGuard::Always,
        );
        let ended = drain
            .run(wake, stop, |waiting| match waiting {
                Waiting::DoNotEvict(message) => {
                    self.condition("BlockedByDoNotEvict", message.clone());
                }
                Waiting::Pods { message, .. } => self.condition("Draining", message.clone()),
                Waiting::Completion(message) => {
                    self.condition("AwaitingPodCompletion", message.clone());
                }
            })
            .await?;
        match ended {
            drain::Ended::Stopped => return Ok(DrainEnd::Stopped),
            drain::Ended::NodeGone => return Ok(DrainEnd::NodeGone),
            drain::Ended::Drained => {}
        }
        if self.announced.insert("drained".to_owned()) {
            self.shared.metrics.nodes_drained.inc();
            self.shared.reporter.event(EventReport::normal(
                node_reference(self.node.name()),
                "Drained",
                "Drain",
                "Every pod that had to go is gone".to_owned(),
            ));
        }
        self.shared.reporter.condition(
            self.node.name(),
            ConditionSpec::new(
                DRAIN_IN_PROGRESS,
                "False",
                DRAIN_COMPLETED,
                "The drain completed",
            ),
            ConditionGuard::Always,
        );
        self.shared.reporter.condition(
            self.node.name(),
            ConditionSpec::new(
                DRAINED,
                "True",
                DRAIN_COMPLETED,
                "Every pod that had to go is gone",
            ),
            ConditionGuard::Always,
        );
        Ok(DrainEnd::Drained(
            Staying::of(&self.shared.client, &drain.left_alone()).await?,
        ))
    }

    /// Cordons this Node object (a fresh read, written back with its UID and resourceVersion).
    async fn cordon(&self) -> Result<Updated, StepError> {
        Ok(self
            .node
            .update(&self.shared.client, |node| {
                if cordoned(node) {
                    return false;
                }
                let spec = node.spec.get_or_insert_with(Default::default);
                spec.unschedulable = Some(true);
                let taints = spec.taints.get_or_insert_with(Vec::new);
                if !taints
                    .iter()
                    .any(|taint| taint.key == DISRUPTED_TAINT && taint.effect == "NoSchedule")
                {
                    taints.push(disrupted_taint());
                }
                node.metadata
                    .labels
                    .get_or_insert_with(Default::default)
                    .insert(EXCLUDE_FROM_LOAD_BALANCERS.to_owned(), "true".to_owned());
                true
            })
            .await?)
    }

    /// Waits for the node's VolumeAttachments to go, except those of pods left on it, for at
    /// most --volume-detach-timeout. Returns false when stopped.
    async fn volumes_detached(
        &mut self,
        wake: &mut Wake<'_>,
        stop: &CancellationToken,
        staying: &Staying,
    ) -> Result<bool, StepError> {
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
                return Ok(true);
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
                return Ok(true);
            }
            self.condition(
                "AwaitingVolumeDetachment",
                format!(
                    "VolumeAttachments {} are still attached",
                    waiting.join(", ")
                ),
            );
            tokio::select! {
                () = stop.cancelled() => return Ok(false),
                changed = attachments.changed() => changed.map_err(|_| StepError::WatchEnded)?,
                changed = wake.changed() => if changed.is_err() { return Ok(false) },
                () = tokio::time::sleep_until(deadline) => {}
            }
        }
    }

    /// Asks the provider to terminate the machine unless it is already gone or a request is
    /// in progress, then waits for it to be gone. The machine is the one the deleted Node
    /// object names, read fresh before every terminate request: once that object is gone (its
    /// finalizer removed by someone else) or replaced by a namesake, none is sent. The polls
    /// while a request is in progress ask the provider only: they change nothing, and a read
    /// of the Node per poll was most of the step's cost.
    async fn terminate_instance(&mut self, stop: &CancellationToken) -> Result<StepEnd, StepError> {
        let Some(provider) = self.shared.provider.clone() else {
            return Ok(StepEnd::Done);
        };
        let mut polls = 0;
        let mut last_read: Option<Node> = None;
        loop {
            let (node, read_this_round) = match last_read.take() {
                Some(node) if !resend_due(requested_at(&node)) => (node, false),
                _ => match self.node.read(&self.shared.client).await? {
                    Some(node) => (node, true),
                    None => return Ok(StepEnd::NodeGone),
                },
            };
            let id = match self.node.machine(&node) {
                Ok(id) => id,
                Err(error) => {
                    self.announce(
                        "no-provider-id",
                        true,
                        "TerminationBlocked",
                        error.to_string(),
                    );
                    self.condition("TerminatingInstance", error.to_string());
                    polls += 1;
                    tokio::select! {
                        () = stop.cancelled() => return Ok(StepEnd::Stopped),
                        () = tokio::time::sleep(PROVIDER_POLL.delay(polls)) => {}
                    }
                    continue;
                }
            };
            let state = provider.state(&id).await;
            if !matches!(state, Ok(InstanceState::NotFound)) {
                self.not_found_since = None;
            }
            let through = provider.name();
            match state {
                Ok(state) if state == provider.terminated_as() => {
                    if !self.announced.contains("terminated") {
                        self.shared.metrics.instances_terminated.inc();
                    }
                    self.announce(
                        "terminated",
                        false,
                        "InstanceTerminated",
                        format!(
                            "Machine {id} is {state}: terminated (instance provider {through})"
                        ),
                    );
                    return Ok(StepEnd::Done);
                }
                Ok(InstanceState::NotFound) => {
                    let since = *self
                        .not_found_since
                        .get_or_insert_with(tokio::time::Instant::now);
                    let confirm = self.shared.settings.instance_not_found_confirm;
                    if since.elapsed() >= confirm {
                        self.announce(
                            "not-found",
                            false,
                            "InstanceNotFound",
                            format!(
                                "Machine {id} is not known to instance provider {through} (every \
                                 answer for {} said so); released as gone",
                                format_args!("{} s", confirm.as_secs_f64())
                            ),
                        );
                        return Ok(StepEnd::Done);
                    }
                    self.condition(
                        "TerminatingInstance",
                        format!(
                            "Machine {id} is not known to instance provider {through}; released \
                             as gone once that holds for {} (a machine just launched can read \
                             as unknown)",
                            format_args!("{} s", confirm.as_secs_f64())
                        ),
                    );
                }
                Ok(_) => {
                    // A request is sent on a read of this round, never on the one a poll kept
                    // (should it fall due meanwhile, the next round reads again).
                    if read_this_round && resend_due(requested_at(&node)) {
                        self.condition(
                            "TerminatingInstance",
                            format!("Terminating machine {id} through instance provider {through}"),
                        );
                        match provider.terminate(&id).await {
                            Ok(()) => {
                                if self.mark_requested().await? == Updated::Gone {
                                    return Ok(StepEnd::NodeGone);
                                }
                                // The mark is not in the read kept; the next round reads it.
                            }
                            Err(error) => self.provider_failed(&error),
                        }
                    } else {
                        last_read = Some(node);
                        self.condition(
                            "TerminatingInstance",
                            format!(
                                "Waiting for machine {id} to be terminated (instance provider \
                                 {through})"
                            ),
                        );
                    }
                }
                Err(error) => self.provider_failed(&error),
            }
            polls += 1;
            let pause = PROVIDER_POLL.delay(polls);
            let pause = match self.not_found_since {
                // The confirmation is read when it is due, not a backoff step later.
                Some(since) => pause.min(
                    (since + self.shared.settings.instance_not_found_confirm)
                        .saturating_duration_since(tokio::time::Instant::now())
                        .max(Duration::from_millis(100)),
                ),
                None => pause,
            };
            tokio::select! {
                () = stop.cancelled() => return Ok(StepEnd::Stopped),
                () = tokio::time::sleep(pause) => {}
            }
        }
    }

    fn provider_failed(&mut self, error: &InstanceError) {
        self.shared.metrics.error("provider");
        let through = self
            .shared
            .provider
            .as_ref()
            .map_or("none", |provider| provider.name());
        tracing::warn!(node = %self.node, provider = through, error = %error, "instance provider call failed; retrying");
        self.condition(
            "TerminatingInstance",
            format!("Instance provider {through} failed: {error}; the node is held, retrying"),
        );
        // One Warning per kind of failure, not per text: a request ID in the provider's
        // message would make one per poll.
        self.announce(
            &format!("provider-error:{}", error.kind()),
            true,
            "InstanceTerminationFailed",
            format!(
                "Instance provider {through} failed: {error}; the node is held, retrying with \
                 backoff"
            ),
        );
    }

    async fn mark_requested(&self) -> Result<Updated, StepError> {
        let now = Timestamp::now().to_string();
        Ok(self
            .node
            .update(&self.shared.client, |node| {
                node.metadata
                    .annotations
                    .get_or_insert_with(Default::default)
                    .insert(TERMINATE_REQUESTED.to_owned(), now.clone());
                true
            })
            .await?)
    }
}

/// How the drain step ended.
enum DrainEnd {
    /// With the volumes of the pods that stay.
    Drained(Staying),
    Stopped,
    NodeGone,
}

/// How a step that may outlast the task ended (a wait for hooks, the machine's end).
enum StepEnd {
    Done,
    Stopped,
    NodeGone,
}

impl StepEnd {
    /// How the termination ends here, unless the step is done and it goes on.
    fn finished(self) -> Option<Finished> {
        match self {
            Self::Done => None,
            Self::Stopped => Some(Finished::Stopped),
            Self::NodeGone => Some(Finished::Released),
        }
    }
}

/// Removes our finalizer from this Node object by an update carrying its UID and the
/// resourceVersion read, so a namesake is never released and a concurrent change of the list
/// (another controller's finalizer) is a 409 and a re-read, never lost.
pub async fn remove_finalizer(client: &kube::Client, node: &NodeIdentity) -> Result<(), StepError> {
    node.update(client, |node| {
        let Some(finalizers) = node.metadata.finalizers.as_mut() else {
            return false;
        };
        let before = finalizers.len();
        finalizers.retain(|finalizer| finalizer != FINALIZER);
        finalizers.len() != before
    })
    .await?;
    Ok(())
}

/// Deleting, with our finalizer.
pub fn ours(node: &Node) -> bool {
    node.metadata.deletion_timestamp.is_some() && has_finalizer(node)
}

pub fn has_finalizer(node: &Node) -> bool {
    node.metadata
        .finalizers
        .iter()
        .flatten()
        .any(|finalizer| finalizer == FINALIZER)
}

fn cordoned(node: &Node) -> bool {
    let spec = node.spec.as_ref();
    let unschedulable = spec.and_then(|spec| spec.unschedulable) == Some(true);
    let tainted = spec
        .and_then(|spec| spec.taints.as_deref())
        .is_some_and(|taints| {
            taints
                .iter()
                .any(|taint| taint.key == DISRUPTED_TAINT && taint.effect == "NoSchedule")
        });
    let excluded = node
        .metadata
        .labels
        .as_ref()
        .is_some_and(|labels| labels.contains_key(EXCLUDE_FROM_LOAD_BALANCERS));
    unschedulable && tainted && excluded
}

/// Whether a terminate request is due: none was made, or the last is older than
/// [`TERMINATE_RESEND`].
fn resend_due(requested: Option<Timestamp>) -> bool {
    requested
        .is_none_or(|at| Timestamp::now().duration_since(at).unsigned_abs() >= TERMINATE_RESEND)
}

fn requested_at(node: &Node) -> Option<Timestamp> {
    node.metadata
        .annotations
        .as_ref()?
        .get(TERMINATE_REQUESTED)?
        .parse()
        .ok()
}

#[derive(Debug, thiserror::Error)]
pub enum StepError {
    #[error(transparent)]
    Api(#[from] kube::Error),
    #[error(transparent)]
    Update(#[from] UpdateError),
    #[error("a watch ended")]
    WatchEnded,
}

impl From<WatchEnded> for StepError {
    fn from(_: WatchEnded) -> Self {
        Self::WatchEnded
    }
}

impl StepError {
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Api(_) | Self::Update(UpdateError::Api(_)) => "api",
            Self::Update(UpdateError::Contended(_)) => "conflict",
            Self::WatchEnded => "watch",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn output_size<A, B, C, F>(_: impl Fn(A, B, C) -> F) -> usize {
        std::mem::size_of::<F>()
    }

    /// A rollout of thousands of nodes holds a task per node, most of them waiting for their
    /// turn: each task's state is the largest of its steps', so the steps that hold requests
    /// are boxed and cost memory only while they run (7,176 bytes a task before).
    #[test]
    fn a_waiting_node_costs_little_memory() {
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
