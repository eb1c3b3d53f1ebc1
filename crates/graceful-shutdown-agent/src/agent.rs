//! The agent's life: hold the delay inhibitor, and when logind announces a shutdown, terminate
//! the node's pods group by group and release the inhibitor the moment the last group is done.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::{Future, StreamExt};
use jiff::Timestamp;
use nodegrace_core::admin::ReadinessGate;
use nodegrace_core::error_chain::Chain;
use nodegrace_core::logind::{InhibitMode, InhibitorLock, Logind, ShutdownEvent};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

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
/// How long node markings may take before the pods' termination starts regardless: an
/// unreachable API server must not eat the pods' time.
const MARK_TIMEOUT: Duration = Duration::from_secs(3);

/// Everything the agent works with, assembled by `main` (or a test).
#[derive(Debug)]
pub struct Agent {
    pub logind: Logind,
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
    /// Set while the inhibitor is held (the agent is useful only then), and while a resumed
    /// shutdown runs without one because logind grants none during a shutdown.
    pub ready: ReadinessGate,
}

type Procedure = Pin<Box<dyn Future<Output = ShutdownSummary> + Send>>;

impl Agent {
    /// Runs until `stop` is cancelled. A shutdown in progress is finished (within its budget)
    /// before returning, since the node is going down anyway.
    pub async fn run(
        self,
        stop: CancellationToken,
        extra_events: Option<crate::app::ExtraEvents>,
    ) -> anyhow::Result<()> {
        let agent = Arc::new(self);
        let logind_events = agent.logind.shutdown_events().await?;
        let mut events: futures::stream::BoxStream<'static, ShutdownEvent> = match extra_events {
            Some(extra) => Box::pin(futures::stream::select(logind_events, extra)),
            None => Box::pin(logind_events),
        };
        agent.pods.synced().await;
        agent.publish_last_shutdown();

        let mut record = agent.state.load();
        let mut procedure: Option<Procedure> = None;
        // logind refuses new delay locks while it shuts down (OperationInProgress): asking
        // again every second would only keep the agent not ready.
        let logind_shutting_down = agent.logind.preparing_for_shutdown().await?;
        if record.in_progress_in(&agent.boot_id) || logind_shutting_down {
            // We crashed (or restarted) mid-shutdown: carry on, never undo it.
            let started = record
                .started_at
                .filter(|_| record.in_progress_in(&agent.boot_id));
            let started = started.unwrap_or_else(Timestamp::now);
            tracing::warn!(%started, "a shutdown is in progress; resuming it");
            record = agent.begin_record(started);
            let deadline = agent.deadline_from(started);
            procedure = Some(Box::pin(Arc::clone(&agent).shutdown(deadline, false)));
        } else {
            agent.marks.clear_stale().await;
        }

        // The lock is wanted until a shutdown completes (then the machine is going down), and
        // retried every second while wanted and missing: a failed Inhibit must not leave the
        // node unprotected for good.
        let mut want_lock = !logind_shutting_down;
        let mut lock = if want_lock {
            agent.take_lock().await
        } else {
            agent.resume_without_lock();
            None
        };
        let mut logind_up = true;
        // The lock held when logind left. A restarted logind restores it (from
        // /run/systemd/inhibit) while its fd is open, so it is closed only once a fresh lock is
        // held: no gap, and never two locks for long.
        let mut from_before_restart: Option<InhibitorLock> = None;
        let mut retry = tokio::time::interval(Duration::from_secs(1));
        loop {
            let shutting_down = procedure.is_some();
            let retrying = want_lock && logind_up && lock.is_none();
            tokio::select! {
                _ = retry.tick(), if retrying => {
                    lock = agent.take_fresh_lock(&mut from_before_restart).await;
                }
                summary = async { procedure.as_mut().expect("guarded by shutting_down").await }, if shutting_down => {
                    procedure = None;
                    want_lock = false;
                    drop(lock.take());
                    drop(from_before_restart.take());
                    agent.metrics.inhibitor_held.set(0);
                    agent.finish(&mut record, summary);
                    if stop.is_cancelled() {
                        return Ok(());
                    }
                }
                () = stop.cancelled(), if !shutting_down => return Ok(()),
                event = events.next() => match event {
                    Some(ShutdownEvent::PrepareForShutdown(true)) => {
                        if procedure.is_none() {
                            let started = Timestamp::now();
                            record = agent.begin_record(started);
                            let deadline = Instant::now() + *agent.budget.borrow();
                            procedure = Some(Box::pin(Arc::clone(&agent).shutdown(deadline, true)));
                        }
                    }
                    Some(ShutdownEvent::PrepareForShutdown(false)) => {
                        procedure = None;
                        record.cancelled_at = Some(Timestamp::now());
                        agent.store(&record);
                        agent.marks.shutdown_cancelled().await;
                        want_lock = true;
                        if lock.is_none() {
                            lock = agent.take_lock().await;
                        }
                    }
                    Some(ShutdownEvent::LogindStopped) => {
                        from_before_restart = lock.take().or(from_before_restart);
                        logind_up = false;
                        agent.metrics.inhibitor_held.set(0);
                        agent.ready.set(false);
                        tracing::warn!("logind left the bus; waiting for it to come back");
                    }
                    Some(ShutdownEvent::LogindStarted) => {
                        logind_up = true;
                        if want_lock {
                            tracing::info!("logind is back; taking the inhibitor again");
                            lock = agent.take_fresh_lock(&mut from_before_restart).await;
                        }
                    }
                    None => anyhow::bail!("lost the system bus connection"),
                },
            }
        }
    }

    /// The deadline of a shutdown that started at `started` (wall clock), on the monotonic clock.
    fn deadline_from(&self, started: Timestamp) -> Instant {
        let elapsed = Timestamp::now().duration_since(started).unsigned_abs();
        Instant::now() + self.budget.borrow().saturating_sub(elapsed)
    }

    fn resume_without_lock(&self) {
        tracing::warn!(
            "logind is already shutting down and grants no inhibitor now; finishing the pods' \
             termination without one"
        );
        self.metrics.resumed_without_inhibitor.set(1);
        self.ready.set(true);
        let marks = self.marks.clone();
        tokio::spawn(async move { marks.resumed_without_inhibitor().await });
    }

    /// Takes a lock; once it is held, the one from before a logind restart is closed.
    async fn take_fresh_lock(
        &self,
        from_before_restart: &mut Option<InhibitorLock>,
    ) -> Option<InhibitorLock> {
        let lock = self.take_lock().await;
        if lock.is_some() {
            drop(from_before_restart.take());
        }
        lock
    }

    async fn take_lock(&self) -> Option<InhibitorLock> {
        match self
            .logind
            .inhibit("shutdown", INHIBITOR_WHO, INHIBITOR_WHY, InhibitMode::Delay)
            .await
        {
            Ok(lock) => {
                self.metrics.inhibitor_held.set(1);
                self.ready.set(true);
                Some(lock)
            }
            Err(error) => {
                tracing::error!(error = %Chain(&error), "cannot take the logind delay inhibitor");
                self.metrics.inhibit_failures.inc();
                self.metrics.inhibitor_held.set(0);
                self.ready.set(false);
                None
            }
        }
    }

    /// Marks the node, then terminates the groups, each within its period and all within
    /// `deadline`, after which the inhibitor goes whatever is left undone.
    async fn shutdown(self: Arc<Self>, deadline: Instant, mark: bool) -> ShutdownSummary {
        if mark {
            let mark_deadline = deadline.min(Instant::now() + MARK_TIMEOUT);
            let marked = tokio::time::timeout_at(mark_deadline, self.marks.shutting_down()).await;
            if marked.is_err() {
                tracing::warn!("marking the node took too long; terminating pods regardless");
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
            if let Some(&finished) = summary.groups.last() {
                let marks = self.marks.clone();
                tokio::spawn(async move { marks.group_finished(&finished).await });
            }
            let now = Instant::now();
            let end = if now >= deadline {
                self.count_pods(group, "not_started", pods.len());
                GroupEnd::NotStarted { pods: pods.len() }
            } else {
                let cut = now + group.period > deadline;
                let group_deadline = deadline.min(now + group.period);
                // Events must not hold up the pods' time (the API may be slow or rate-limited).
                let (marks, announced, count) = (self.marks.clone(), *group, pods.len());
                tokio::spawn(async move { marks.group_started(&announced, count).await });
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
                let stopped = report.pods.len() - still_running;
                if cut && still_running > 0 {
                    GroupEnd::CutShort {
                        stopped,
                        still_running,
                    }
                } else {
                    GroupEnd::Finished {
                        stopped,
                        still_running,
                    }
                }
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

    fn finish(&self, record: &mut ShutdownRecord, summary: ShutdownSummary) {
        let ended = Timestamp::now();
        record.ended_at = Some(ended);
        self.store(record);
        self.metrics.end_time_seconds.set(seconds(ended));
        if let Some(started) = record.started_at {
            let took = ended.duration_since(started).as_secs_f64();
            self.metrics.duration_seconds.observe(took);
            tracing::info!(seconds = took, "graceful shutdown done; inhibitor released");
        }
        let marks = self.marks.clone();
        tokio::spawn(async move {
            if let Some(last) = summary.groups.last() {
                marks.group_finished(last).await;
            }
            marks.shutdown_finished(&summary).await;
        });
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
