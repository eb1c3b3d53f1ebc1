//! The agent: watch this node's Leases, hold one logind block inhibitor while any is active,
//! and say so in the `ShutdownInhibited` node condition.

use std::collections::HashSet;
use std::time::Duration;

use futures::StreamExt;
use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use nodegrace_core::admin::ReadinessGate;
use nodegrace_core::error_chain::Chain;
use nodegrace_core::k8s::events::{EventReport, object_reference};
use nodegrace_core::k8s::nodes::node_reference;
use nodegrace_core::k8s::reporter::{ConditionGuard, Reporter};
use nodegrace_core::k8s::watched::{WatchCounters, Watched};
use nodegrace_logind::{InhibitMode, InhibitorLock, SharedLogind, ShutdownEvent};
use tokio_util::sync::CancellationToken;

use crate::alerts::{Alerts, oldest_age};
use crate::decide::{LockAction, condition, lock_action, root_passes_note, transition};
use crate::leases::{Activity, Holder, Scope, active_holders, activity, field_selector};
use crate::metrics::Metrics;

pub const INHIBITOR_WHO: &str = "nodegrace shutdown-inhibitor-agent";
const ACTION: &str = "Inhibit";

pub struct Agent {
    pub logind: SharedLogind,
    pub client: Client,
    pub node: String,
    /// Whose Leases count.
    pub scope: Scope,
    pub what: String,
    pub metrics: Metrics,
    pub reporter: Reporter,
    pub alerts: Alerts,
    /// Ready while the agent can do its job: the Leases are watched, logind is on the bus, and
    /// the block is held whenever an active Lease asks for it.
    pub ready: ReadinessGate,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("node", &self.node)
            .field("what", &self.what)
            .finish_non_exhaustive()
    }
}

struct State {
    lock: Option<InhibitorLock>,
    /// The lock held when logind left. A restarted logind restores it (from
    /// /run/systemd/inhibit) while its fd is open, so it keeps blocking until a fresh lock is
    /// held, then is closed: no gap, and never two locks for long.
    from_before_restart: Option<InhibitorLock>,
    why: String,
    shutting_down: bool,
    logind_up: bool,
    warned_incomplete: HashSet<(String, String)>,
    /// Root's shutdown requests go through a block lock on this node's logind.
    root_passes: bool,
}

type Leases = Watched<Lease>;

impl Agent {
    pub async fn run(mut self, stop: CancellationToken) -> anyhow::Result<()> {
        let mut events = self.logind.shutdown_events().await?;
        let mut leases = Watched::start(
            Api::<Lease>::all(self.client.clone()),
            watcher::Config::default()
                .fields(&field_selector(&self.node))
                .labels(&self.scope.selector_text),
            WatchCounters {
                events: Some(self.metrics.lease_watch_events.clone()),
                restarts: Some(self.metrics.watch_restarts.clone()),
            },
        );
        tokio::select! {
            () = stop.cancelled() => return Ok(()),
            synced = leases.synced() => synced?,
        }
        let mut state = State {
            lock: None,
            from_before_restart: None,
            why: String::new(),
            shutting_down: self.logind.preparing_for_shutdown().await.unwrap_or(false),
            logind_up: true,
            warned_incomplete: HashSet::new(),
            root_passes: self.root_passes_block().await,
        };
        if state.shutting_down {
            self.metrics.shutdown_in_progress.set(1);
            tracing::warn!(
                "a shutdown is in progress; Lease changes are ignored until the agent restarts"
            );
        }
        self.reconcile(&leases, &mut state).await;
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                () = stop.cancelled() => return Ok(()),
                changed = leases.changed() => {
                    changed?;
                    self.reconcile(&leases, &mut state).await;
                }
                _ = tick.tick() => {
                    self.tick(&leases, state.shutting_down);
                    // A failed Inhibit is retried here, not only on the next Lease change.
                    if state.lock.is_none() && state.logind_up && !state.shutting_down && !self.holders(&leases).is_empty() {
                        self.reconcile(&leases, &mut state).await;
                    }
                }
                event = events.next() => match event {
                    Some(ShutdownEvent::PrepareForShutdown(true)) => {
                        // As the KEP says: once shutdown has begun, Lease changes no longer matter.
                        state.shutting_down = true;
                        self.metrics.shutdown_in_progress.set(1);
                        tracing::warn!("shutdown started; ignoring Lease changes until the agent restarts");
                    }
                    Some(ShutdownEvent::PrepareForShutdown(false)) => tracing::info!("shutdown cancelled; Lease changes stay ignored until the agent restarts"),
                    Some(ShutdownEvent::LogindStopped) => {
                        state.from_before_restart = state.lock.take().or(state.from_before_restart.take());
                        state.logind_up = false;
                        self.metrics.block_inhibitor_held.set(0);
                        self.ready.set(false);
                        tracing::warn!("logind left the bus; the block is taken again when it is back");
                    }
                    Some(ShutdownEvent::LogindStarted) => {
                        state.logind_up = true;
                        // A restarted logind needs the block again even during a shutdown.
                        let shutting_down = std::mem::replace(&mut state.shutting_down, false);
                        self.reconcile(&leases, &mut state).await;
                        state.shutting_down = shutting_down;
                    }
                    None => anyhow::bail!("lost the system bus connection"),
                },
            }
        }
    }

    /// Whether root's shutdown requests pass a block lock here, said once at start (metric and
    /// Warning Event). A logind that cannot be asked counts as one root passes: the warning is
    /// the safe side.
    async fn root_passes_block(&self) -> bool {
        let passes = match self.logind.block_binds_root().await {
            Ok(binds) => !binds,
            Err(error) => {
                tracing::warn!(error = %Chain(&error), "cannot tell whether root passes a block inhibitor here; assuming it does");
                true
            }
        };
        self.metrics.root_passes_block.set(i64::from(passes));
        if passes {
            self.reporter.event(EventReport::warning(
                node_reference(&self.node),
                "BlockBypassableByRoot",
                ACTION,
                root_passes_note(),
            ));
        }
        passes
    }

    fn holders(&self, leases: &Leases) -> Vec<Holder> {
        let all = leases.state();
        active_holders(&self.node, &self.scope, all.iter().map(|lease| &**lease))
    }

    async fn reconcile(&mut self, leases: &Leases, state: &mut State) {
        if state.shutting_down {
            return;
        }
        self.warn_incomplete(leases, state);
        let holders = self.holders(leases);
        self.metrics
            .active_leases
            .set(i64::try_from(holders.len()).unwrap_or(i64::MAX));
        let was_blocked = state.lock.is_some();
        let held_why = state.lock.is_some().then_some(state.why.as_str());
        let mut inhibit_failed = false;
        match lock_action(&holders, held_why, state.shutting_down) {
            LockAction::Keep | LockAction::Frozen => {}
            LockAction::Release => {
                drop(state.lock.take());
                drop(state.from_before_restart.take());
                state.why.clear();
            }
            LockAction::Take { why } => match self
                .logind
                .inhibit(&self.what, INHIBITOR_WHO, &why, InhibitMode::Block)
                .await
            {
                Ok(lock) => {
                    state.lock = Some(lock);
                    drop(state.from_before_restart.take());
                    state.why = why;
                }
                Err(error) => {
                    inhibit_failed = true;
                    tracing::error!(error = %Chain(&error), "cannot take the logind block inhibitor");
                }
            },
        }
        // Not ready while a Lease asks for a block the agent cannot hold.
        self.ready.set(state.logind_up && !inhibit_failed);
        let blocked = state.lock.is_some();
        self.metrics.block_inhibitor_held.set(i64::from(blocked));
        if let Some((reason, note)) = transition(was_blocked, blocked, &holders) {
            self.metrics.transitions.inc();
            self.reporter.event(EventReport::normal(
                node_reference(&self.node),
                reason,
                ACTION,
                note,
            ));
        }
        self.reporter.condition(
            &self.node,
            condition(&holders, state.root_passes),
            ConditionGuard::Always,
        );
    }

    fn warn_incomplete(&self, leases: &Leases, state: &mut State) {
        for lease in leases
            .state()
            .iter()
            .filter(|lease| self.scope.admits(lease))
        {
            if let Activity::Incomplete { holder } = activity(lease) {
                let key = (lease.namespace().unwrap_or_default(), holder.clone());
                if state.warned_incomplete.insert(key) {
                    let note = format!(
                        "Lease has holder {holder:?} but no acquireTime; it does not block shutdown until acquireTime is set"
                    );
                    self.reporter.event(EventReport::warning(
                        object_reference(lease.as_ref()),
                        "IncompleteLease",
                        ACTION,
                        note,
                    ));
                }
            }
        }
    }

    fn tick(&mut self, leases: &Leases, shutting_down: bool) {
        let holders = self.holders(leases);
        let now = Timestamp::now();
        self.metrics
            .oldest_active_lease_age_seconds
            .set(oldest_age(&holders, now).as_secs_f64());
        let due = self.alerts.due(&holders, now, shutting_down);
        let lease_of = |holder: &Holder| {
            leases
                .state()
                .into_iter()
                .find(|l| l.namespace().as_deref() == Some(holder.namespace.as_str()))
        };
        for holder in due.acquired_in_future {
            let note = format!(
                "Lease {}/{} held by {} has acquireTime {} in the future (clock skew?); \
                 it blocks shutdown and counts as just acquired",
                holder.namespace, self.node, holder.holder, holder.acquired
            );
            if let Some(lease) = lease_of(&holder) {
                self.reporter.event(EventReport::warning(
                    object_reference(lease.as_ref()),
                    "LeaseAcquireTimeInFuture",
                    ACTION,
                    note,
                ));
            }
        }
        for holder in due.held_too_long {
            self.metrics.alerts.inc();
            let note = format!(
                "Lease {}/{} held by {} has blocked shutdown since {}",
                holder.namespace, self.node, holder.holder, holder.acquired
            );
            if let Some(lease) = lease_of(&holder) {
                self.reporter.event(EventReport::warning(
                    object_reference(lease.as_ref()),
                    "ShutdownInhibitedTooLong",
                    ACTION,
                    note.clone(),
                ));
            }
            self.reporter.event(EventReport::warning(
                node_reference(&self.node),
                "ShutdownInhibitedTooLong",
                ACTION,
                note,
            ));
        }
    }
}
