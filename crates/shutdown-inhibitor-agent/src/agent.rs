//! The agent: watch this node's Leases, hold one logind block inhibitor while any is active,
//! and say so in the `ShutdownInhibited` node condition.

use std::collections::HashSet;
use std::time::Duration;

use futures::StreamExt;
use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use nodegrace_core::admin::ReadinessGate;
use nodegrace_core::error_chain::Chain;
use nodegrace_core::logind::{InhibitMode, InhibitorLock, Logind, ShutdownEvent};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::alerts::{Alerts, oldest_age};
use crate::leases::{Activity, Holder, active_holders, activity, describe, field_selector};
use crate::metrics::Metrics;

pub const INHIBITOR_WHO: &str = "nodegrace shutdown-inhibitor-agent";
pub use crate::reporter::CONDITION_TYPE;

/// Extra shutdown events merged into logind's (tests inject what elogind cannot send).
pub type ExtraEvents = futures::stream::BoxStream<'static, ShutdownEvent>;

pub struct Agent {
    pub logind: Logind,
    pub client: Client,
    pub node: String,
    pub what: String,
    pub metrics: Metrics,
    pub reporter: crate::reporter::Reporter,
    pub alerts: Alerts,
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
    warned_incomplete: HashSet<(String, String)>,
}

fn node_reference(node: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(node.into()),
        uid: Some(node.into()),
        ..ObjectReference::default()
    }
}

fn lease_reference(lease: &Lease) -> ObjectReference {
    ObjectReference {
        api_version: Some("coordination.k8s.io/v1".into()),
        kind: Some("Lease".into()),
        name: lease.metadata.name.clone(),
        namespace: lease.metadata.namespace.clone(),
        uid: lease.metadata.uid.clone(),
        ..ObjectReference::default()
    }
}

impl Agent {
    /// Starts the Lease watch; the returned receiver ticks on every change to the cache.
    fn watch_leases(&self, stop: &CancellationToken) -> (Store<Lease>, watch::Receiver<u64>) {
        let (store, writer) = reflector::store();
        let (notify, changes) = watch::channel(0u64);
        let config = watcher::Config::default().fields(&field_selector(&self.node));
        let stream = reflector::reflector(
            writer,
            watcher(Api::<Lease>::all(self.client.clone()), config),
        )
        .default_backoff();
        let metrics = self.metrics.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            loop {
                let event = tokio::select! {
                    () = stop.cancelled() => return,
                    event = stream.next() => event,
                };
                match event {
                    Some(Ok(
                        watcher::Event::Apply(_)
                        | watcher::Event::Delete(_)
                        | watcher::Event::InitApply(_),
                    )) => {
                        metrics.lease_watch_events.inc();
                        notify.send_modify(|generation| *generation += 1);
                    }
                    Some(Ok(_)) => notify.send_modify(|generation| *generation += 1),
                    Some(Err(error)) => {
                        // The cache keeps the last known Leases: a failed watch must not unblock.
                        metrics.watch_restarts.inc();
                        tracing::warn!(error = %Chain(&error), "lease watch failed; keeping the last known state and retrying");
                    }
                    None => return,
                }
            }
        });
        (store, changes)
    }

    pub async fn run(
        mut self,
        stop: CancellationToken,
        extra_events: Option<ExtraEvents>,
    ) -> anyhow::Result<()> {
        let logind_events = self.logind.shutdown_events().await?;
        let mut events: futures::stream::BoxStream<'static, ShutdownEvent> = match extra_events {
            Some(extra) => Box::pin(futures::stream::select(logind_events, extra)),
            None => Box::pin(logind_events),
        };
        let (leases, mut changes) = self.watch_leases(&stop);
        tokio::select! {
            () = stop.cancelled() => return Ok(()),
            _ = leases.wait_until_ready() => {}
        }
        let mut state = State {
            lock: None,
            from_before_restart: None,
            why: String::new(),
            shutting_down: self.logind.preparing_for_shutdown().await.unwrap_or(false),
            warned_incomplete: HashSet::new(),
        };
        if state.shutting_down {
            self.metrics.shutdown_in_progress.set(1);
            tracing::warn!(
                "a shutdown is in progress; Lease changes are ignored until the agent restarts"
            );
        }
        self.reconcile(&leases, &mut state).await;
        self.ready.set(true);
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                () = stop.cancelled() => return Ok(()),
                changed = changes.changed() => {
                    if changed.is_err() {
                        anyhow::bail!("the lease watch ended");
                    }
                    self.reconcile(&leases, &mut state).await;
                }
                _ = tick.tick() => {
                    self.tick(&leases, state.shutting_down);
                    // A failed Inhibit is retried here, not only on the next Lease change.
                    if state.lock.is_none() && !state.shutting_down && !self.holders(&leases).is_empty() {
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
                        self.metrics.block_inhibitor_held.set(0);
                        tracing::warn!("logind left the bus; the block is taken again when it is back");
                    }
                    Some(ShutdownEvent::LogindStarted) => {
                        let shutting_down = std::mem::replace(&mut state.shutting_down, false);
                        self.reconcile(&leases, &mut state).await;
                        state.shutting_down = shutting_down;
                    }
                    None => anyhow::bail!("lost the system bus connection"),
                },
            }
        }
    }

    fn holders(&self, leases: &Store<Lease>) -> Vec<Holder> {
        let all = leases.state();
        active_holders(&self.node, all.iter().map(|lease| &**lease))
    }

    async fn reconcile(&mut self, leases: &Store<Lease>, state: &mut State) {
        if state.shutting_down {
            return;
        }
        self.warn_incomplete(leases, state);
        let holders = self.holders(leases);
        self.metrics
            .active_leases
            .set(i64::try_from(holders.len()).unwrap_or(i64::MAX));
        let was_blocked = state.lock.is_some();
        if holders.is_empty() {
            drop(state.lock.take());
            drop(state.from_before_restart.take());
            state.why.clear();
        } else {
            let why = format!("Active Leases: {}", describe(&holders));
            if state.lock.is_none() || why != state.why {
                match self
                    .logind
                    .inhibit(&self.what, INHIBITOR_WHO, &why, InhibitMode::Block)
                    .await
                {
                    // The new lock is held before the old one goes, so the block never lapses.
                    Ok(lock) => {
                        state.lock = Some(lock);
                        drop(state.from_before_restart.take());
                        state.why = why;
                    }
                    Err(error) => {
                        tracing::error!(error = %Chain(&error), "cannot take the logind block inhibitor");
                    }
                }
            }
        }
        let blocked = state.lock.is_some();
        self.metrics.block_inhibitor_held.set(i64::from(blocked));
        if was_blocked != blocked {
            self.metrics.transitions.inc();
            let (reason, note) = if blocked {
                (
                    "ShutdownBlocked",
                    format!("Shutdown blocked by Leases: {}", describe(&holders)),
                )
            } else {
                (
                    "ShutdownUnblocked",
                    "No active Lease blocks shutdown any more".to_owned(),
                )
            };
            self.reporter
                .event(node_reference(&self.node), false, reason, note);
        }
        self.reporter.condition(holders);
    }

    fn warn_incomplete(&self, leases: &Store<Lease>, state: &mut State) {
        for lease in leases.state() {
            if let Activity::Incomplete { holder } = activity(&lease) {
                let key = (lease.namespace().unwrap_or_default(), holder.clone());
                if state.warned_incomplete.insert(key) {
                    let note = format!(
                        "Lease has holder {holder:?} but no acquireTime; it does not block shutdown until acquireTime is set"
                    );
                    self.reporter
                        .event(lease_reference(&lease), true, "IncompleteLease", note);
                }
            }
        }
    }

    fn tick(&mut self, leases: &Store<Lease>, shutting_down: bool) {
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
                self.reporter.event(
                    lease_reference(&lease),
                    true,
                    "LeaseAcquireTimeInFuture",
                    note,
                );
            }
        }
        for holder in due.held_too_long {
            self.metrics.alerts.inc();
            let note = format!(
                "Lease {}/{} held by {} has blocked shutdown since {}",
                holder.namespace, self.node, holder.holder, holder.acquired
            );
            if let Some(lease) = lease_of(&holder) {
                self.reporter.event(
                    lease_reference(&lease),
                    true,
                    "ShutdownInhibitedTooLong",
                    note.clone(),
                );
            }
            self.reporter.event(
                node_reference(&self.node),
                true,
                "ShutdownInhibitedTooLong",
                note,
            );
        }
    }
}
