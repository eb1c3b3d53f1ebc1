//! The agent's life: hold the delay inhibitor, and when logind announces a shutdown, terminate
//! the node's pods group by group and release the inhibitor the moment the last group is done.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::{Future, StreamExt};
use jiff::Timestamp;
use nodegrace_core::admin::ReadinessGate;
use nodegrace_core::error_chain::Chain;
use nodegrace_logind::{InhibitMode, InhibitorLock, SharedLogind, ShutdownEvent};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::budget::remaining;
use crate::lifecycle::{Input, Lifecycle, Step};
use crate::metrics::{Metrics, PodLabels};
use crate::node_marks::NodeMarks;
use crate::node_pods::NodePods;
use crate::plan::{PriorityGroup, ShutdownPlan};
use crate::state::{ShutdownRecord, StateFile};
use crate::summary::{GroupEnd, GroupResult, ShutdownSummary};
use crate::terminate::{Terminator, group_pods};

pub const INHIBITOR_WHO: &str = "nodegrace graceful-shutdown-agent";
const INHIBITOR_WHY: &str =
    "Terminating the node's pods gracefully, in priority order, before shutdown";
/// How long the taint may take before the pods' termination starts regardless: an
/// unreachable API server must not eat the pods' time.
const MARK_TIMEOUT: Duration = Duration::from_secs(3);

/// Everything the agent works with, assembled by `app` (or a test).
#[derive(Debug)]
pub struct Agent {
    pub logind: SharedLogind,
    pub plan: ShutdownPlan,
    /// What logind grants: the deadline of a shutdown is its start plus this. It starts at
    /// what logind allows now and rises once logind applies the agent's drop-in.
    pub budget: watch::Receiver<Duration>,
    pub pods: NodePods,
    pub terminator: Terminator,
    pub marks: NodeMarks,
    pub state: StateFile,
    pub boot_id: String,
    pub own_pod: Option<(String, String)>,
    pub metrics: Metrics,
    /// Ready while the inhibitor is held (the agent is useful only then), and while a resumed
    /// shutdown runs without one because logind grants none during a shutdown.
    pub ready: ReadinessGate,
}

type Procedure = Pin<Box<dyn Future<Output = ShutdownSummary> + Send>>;

/// The locks the agent holds.
#[derive(Debug, Default)]
struct Locks {
    held: Option<InhibitorLock>,
    /// The lock held when logind left. A restarted logind restores it (from
    /// /run/systemd/inhibit) while its fd is open, so it is closed only once a fresh lock is
    /// held: no gap, and never two locks for long.
    parked: Option<InhibitorLock>,
}

/// What one run of the event loop carries between steps.
struct Run {
    locks: Locks,
    record: ShutdownRecord,
    procedure: Option<Procedure>,
    summary: Option<ShutdownSummary>,
}

impl From<ShutdownEvent> for Input {
    fn from(event: ShutdownEvent) -> Self {
        match event {
            ShutdownEvent::PrepareForShutdown(active) => Input::PrepareForShutdown(active),
            ShutdownEvent::LogindStopped => Input::LogindStopped,
            ShutdownEvent::LogindStarted => Input::LogindStarted,
        }
    }
}

impl Agent {
    /// Runs until `stop` is cancelled. A shutdown in progress is finished (within its budget)
    /// before returning, since the node is going down anyway. The decisions are
    /// [`Lifecycle`]'s; this loop only waits for inputs and carries out the steps.
    pub async fn run(self, stop: CancellationToken) -> anyhow::Result<()> {
        let agent = Arc::new(self);
        let mut events = agent.logind.shutdown_events().await?;
        agent.pods.synced().await;
        agent.publish_last_shutdown();
        let mut run = Run {
            locks: Locks::default(),
            record: agent.state.load(),
            procedure: None,
            summary: None,
        };
        let logind_preparing = agent.logind.preparing_for_shutdown().await?;
        let (mut lifecycle, steps) =
            Lifecycle::start(run.record.in_progress_in(&agent.boot_id), logind_preparing);
        if agent.carry_out(steps, &mut run).await {
            return Ok(());
        }
        // A failed Inhibit must not leave the node unprotected for good: retried every second
        // while the lock is wanted and missing.
        let mut retry = tokio::time::interval(Duration::from_secs(1));
        loop {
            let retrying = lifecycle.lock_wanted() && run.locks.held.is_none();
            let shutting_down = run.procedure.is_some();
            let input = tokio::select! {
                _ = retry.tick(), if retrying => {
                    agent.take_lock(&mut run.locks).await;
                    continue;
                }
                summary = async { run.procedure.as_mut().expect("guarded").await }, if shutting_down => {
                    run.procedure = None;
                    run.summary = Some(summary);
                    Input::ShutdownFinished
                }
                () = stop.cancelled(), if !lifecycle.stop_requested => Input::Stop,
                event = events.next() => match event {
                    Some(event) => Input::from(event),
                    None => anyhow::bail!("lost the system bus connection"),
                },
            };
            let steps = lifecycle.on(input);
            if agent.carry_out(steps, &mut run).await {
                return Ok(());
            }
        }
    }

    /// Carries out `steps` in order; true when the agent must exit.
    async fn carry_out(self: &Arc<Self>, steps: Vec<Step>, run: &mut Run) -> bool {
        for step in steps {
            match step {
                Step::StartShutdown => {
                    let started = Timestamp::now();
                    run.record = self.begin_record(started);
                    let deadline = Instant::now() + *self.budget.borrow();
                    run.procedure = Some(Box::pin(Arc::clone(self).shutdown(deadline, true)));
                }
                Step::ResumeShutdown => {
                    let recorded = run
                        .record
                        .started_at
                        .filter(|_| run.record.in_progress_in(&self.boot_id));
                    let started = recorded.unwrap_or_else(Timestamp::now);
                    tracing::warn!(%started, "a shutdown is in progress; resuming it");
                    run.record = self.begin_record(started);
                    let elapsed = Timestamp::now().duration_since(started).unsigned_abs();
                    let deadline = Instant::now() + remaining(*self.budget.borrow(), elapsed);
                    run.procedure = Some(Box::pin(Arc::clone(self).shutdown(deadline, false)));
                }
                Step::CancelShutdown => {
                    run.procedure = None;
                    run.record.cancelled_at = Some(Timestamp::now());
                    self.store(&run.record);
                    self.marks.shutdown_cancelled();
                }
                Step::TakeLock => {
                    if run.locks.held.is_none() {
                        self.take_lock(&mut run.locks).await;
                    }
                }
                Step::ParkLock => {
                    run.locks.parked = run.locks.held.take().or(run.locks.parked.take());
                    self.metrics.inhibitor_held.set(0);
                    self.ready.set(false);
                    tracing::warn!("logind left the bus; waiting for it to come back");
                }
                Step::ReleaseLock => {
                    drop(run.locks.held.take());
                    drop(run.locks.parked.take());
                    self.metrics.inhibitor_held.set(0);
                }
                Step::RecordFinish => {
                    let summary = run.summary.take().unwrap_or_default();
                    self.finish(&mut run.record, &summary);
                }
                Step::ClearStaleMarks => self.marks.clear_stale(),
                Step::ResumeWithoutLock => self.resume_without_lock(),
                Step::Exit => return true,
            }
        }
        false
    }

    fn resume_without_lock(&self) {
        tracing::warn!(
            "logind is already shutting down and grants no inhibitor now; finishing the pods' \
             termination without one"
        );
        self.metrics.resumed_without_inhibitor.set(1);
        self.ready.set(true);
        self.marks.resumed_without_inhibitor();
    }

    /// Takes a lock; once it is held, the one parked across a logind restart is closed.
    async fn take_lock(&self, locks: &mut Locks) {
        match self
            .logind
            .inhibit("shutdown", INHIBITOR_WHO, INHIBITOR_WHY, InhibitMode::Delay)
            .await
        {
            Ok(lock) => {
                locks.held = Some(lock);
                drop(locks.parked.take());
                self.metrics.inhibitor_held.set(1);
                self.ready.set(true);
            }
            Err(error) => {
                tracing::error!(error = %Chain(&error), "cannot take the logind delay inhibitor");
                self.metrics.inhibit_failures.inc();
                self.metrics.inhibitor_held.set(0);
                self.ready.set(false);
            }
        }
    }

    /// Marks the node, then terminates the groups, each within its period and all within
    /// `deadline`, after which the inhibitor goes whatever is left undone.
    async fn shutdown(self: Arc<Self>, deadline: Instant, mark: bool) -> ShutdownSummary {
        if mark {
            let mark_deadline = deadline.min(Instant::now() + MARK_TIMEOUT);
            let tainted =
                tokio::time::timeout_at(mark_deadline, self.marks.shutting_down().wait()).await;
            if tainted.is_err() {
                tracing::warn!("tainting the node takes too long; terminating pods regardless");
            }
        }
        let snapshot = self.pods.snapshot();
        let own = self
            .own_pod
            .as_ref()
            .map(|(ns, name)| (ns.as_str(), name.as_str()));
        let groups = group_pods(&self.plan, &snapshot, own);
        let mut summary = ShutdownSummary::default();
        for (group, pods) in self.plan.groups().iter().zip(groups) {
            if pods.is_empty() {
                continue;
            }
            // A group's end is told when the next one starts; the last group's after the
            // inhibitor is released (in `finish`), so no API write competes with the release.
            if let Some(finished) = summary.groups.last() {
                self.marks.group_finished(finished);
            }
            let now = Instant::now();
            let end = if now >= deadline {
                self.count_pods(group, "not_started", pods.len());
                GroupEnd::NotStarted { pods: pods.len() }
            } else {
                let cut = now + group.period > deadline;
                let group_deadline = deadline.min(now + group.period);
                self.marks.group_started(group, pods.len());
                let report = self
                    .terminator
                    .run_group(*group, &pods, group_deadline)
                    .await;
                for (pod, outcome) in &report.pods {
                    tracing::info!(
                        pod,
                        outcome = outcome.as_str(),
                        priority = group.priority,
                        "pod terminated"
                    );
                    self.count_pods(group, outcome.as_str(), 1);
                }
                let still_running = report.still_running();
                GroupEnd::of(cut, report.pods.len() - still_running, still_running)
            };
            summary.groups.push(GroupResult {
                priority: group.priority,
                period: group.period,
                end,
            });
        }
        if summary.budget_ran_out() {
            tracing::warn!(
                "the shutdown budget ran out before every group finished; releasing the inhibitor"
            );
        }
        summary
    }

    fn count_pods(&self, group: &PriorityGroup, outcome: &str, pods: usize) {
        self.metrics
            .pods_terminated
            .get_or_create(&PodLabels {
                group_priority: group.priority.to_string(),
                outcome: outcome.to_owned(),
            })
            .inc_by(pods as u64);
    }

    fn begin_record(&self, started: Timestamp) -> ShutdownRecord {
        let record = ShutdownRecord {
            boot_id: self.boot_id.clone(),
            started_at: Some(started),
            ended_at: None,
            cancelled_at: None,
        };
        self.store(&record);
        self.metrics.start_time_seconds.set(seconds(started));
        record
    }

    fn finish(&self, record: &mut ShutdownRecord, summary: &ShutdownSummary) {
        let ended = Timestamp::now();
        record.ended_at = Some(ended);
        self.store(record);
        self.metrics.end_time_seconds.set(seconds(ended));
        if let Some(started) = record.started_at {
            let took = ended.duration_since(started).as_secs_f64();
            self.metrics.duration_seconds.observe(took);
            tracing::info!(seconds = took, "graceful shutdown done; inhibitor released");
        }
        if let Some(last) = summary.groups.last() {
            self.marks.group_finished(last);
        }
        self.marks.shutdown_finished(summary);
    }

    fn store(&self, record: &ShutdownRecord) {
        if let Err(error) = self.state.store(record) {
            tracing::error!(error = %Chain(&error), "cannot record the shutdown state");
        }
    }

    fn publish_last_shutdown(&self) {
        let record = self.state.load();
        if let Some(started) = record.started_at {
            self.metrics.start_time_seconds.set(seconds(started));
        }
        if let Some(ended) = record.ended_at {
            self.metrics.end_time_seconds.set(seconds(ended));
        }
    }
}

fn seconds(at: Timestamp) -> f64 {
    at.as_millisecond() as f64 / 1000.0
}
