//! Leader election for the cluster-wide controllers, on a coordination.k8s.io Lease managed by
//! kube-lease-manager (server-side apply, so two candidates can never both write the holder).
//!
//! The work runs under a child cancellation token that is cancelled the moment leadership is
//! lost: a deposed leader stops acting at once instead of finishing what it was doing.
//!
//! **Renew deadline.** kube-lease-manager keeps retrying a renewal that fails and still calls
//! itself leader, so a replica cut off from the API server would go on acting (its cloud calls
//! may still get through) after its lease expired and another replica took over. As client-go's
//! `RenewDeadline`, the work is also cancelled once the lease has not been seen renewed for
//! `duration − margin / 2`: the renewal is due at `duration − margin`, and the other replicas
//! may take over at `duration` (by their clocks, so `margin / 2` of clock skew is covered). A
//! renewal seen later starts the work again. Renewals are seen through a watch of the Lease on
//! the same client, so a replica that cannot reach the API server sees none.

use std::time::{Duration, SystemTime};

use std::future::Future;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use kube_lease_manager::{LeaseCreateMode, LeaseManager, LeaseParams};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use nodegrace_core::error_chain::Chain;
use nodegrace_core::k8s::api_errors::{ApiErrorClass, classify_write};

/// Backoff of a start that cannot reach the election Lease yet.
const START_RETRY_FIRST: Duration = Duration::from_millis(200);
const START_RETRY_MAX: Duration = Duration::from_secs(5);

#[derive(Debug, Clone)]
pub struct LeaderConfig {
    pub namespace: String,
    pub lease_name: String,
    /// Unique per candidate; the pod name is the usual choice.
    pub identity: String,
    /// How long a holder's claim lasts without renewal.
    pub lease_duration_seconds: u64,
    /// How long before expiry the holder renews; also the clock skew tolerated between nodes.
    pub renew_margin_seconds: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    #[error(
        "leader election: the lease duration ({duration}s) must be greater than the renew margin \
         ({margin}s), and both greater than zero"
    )]
    Timing { duration: u64, margin: u64 },
    #[error(
        "leader election: the lease task ended, so this replica can no longer tell whether it \
         leads; stopping rather than risk two replicas acting"
    )]
    LeaseTaskEnded,
    #[error(
        "the leader's work ended while it still led; stopping so another replica can take over"
    )]
    WorkEnded,
    #[error("leader election on lease {namespace}/{name}: {source}")]
    Lease {
        namespace: String,
        name: String,
        #[source]
        source: kube_lease_manager::LeaseManagerError,
    },
}

/// A running candidacy; dropping it (or [`Leadership::resign`]) gives the lease up.
#[derive(Debug)]
pub struct Leadership {
    leader: watch::Receiver<bool>,
    manager: JoinHandle<kube_lease_manager::Result<LeaseManager>>,
    /// Until when this candidate's work may go on: the renew deadline after the last renewal
    /// of its own seen on the Lease; `None` while it is not seen holding it.
    held_until: watch::Receiver<Option<SystemTime>>,
    _renewals: AbortOnDropHandle<()>,
}

impl Leadership {
    /// Joins the election; the lease is created if missing.
    pub async fn start(client: Client, config: &LeaderConfig) -> Result<Self, LeaderError> {
        let (duration, margin) = (config.lease_duration_seconds, config.renew_margin_seconds);
        if duration == 0 || margin == 0 || margin >= duration {
            return Err(LeaderError::Timing { duration, margin });
        }
        let params = LeaseParams::new(config.identity.clone(), duration, margin);
        // A replica starting while the API server answers 5xx/429 or not at all waits for it
        // rather than exiting (`cargo xtask explore` saw a restart during injected 500s end the
        // process); a refusal that can never pass (403, 422) fails at once.
        let mut delay = START_RETRY_FIRST;
        let manager = loop {
            match LeaseManager::new(
                client.clone(),
                config.lease_name.clone(),
                config.namespace.clone(),
                params.clone(),
                LeaseCreateMode::AutoCreate,
            )
            .await
            {
                Ok(manager) => break manager,
                Err(kube_lease_manager::LeaseManagerError::KubeError(error))
                    if classify_write(&error) == ApiErrorClass::Retry =>
                {
                    tracing::warn!(error = %Chain(&error), retry_in = ?delay, "cannot read or create the election Lease yet; retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(START_RETRY_MAX);
                }
                Err(source) => {
                    return Err(LeaderError::Lease {
                        namespace: config.namespace.clone(),
                        name: config.lease_name.clone(),
                        source,
                    });
                }
            }
        };
        let (leader, manager) = manager.watch().await;
        let (held_until, renewals) = watch_renewals(client, config);
        Ok(Self {
            leader,
            manager,
            held_until,
            _renewals: AbortOnDropHandle::new(renewals),
        })
    }

    pub fn is_leader(&self) -> bool {
        *self.leader.borrow()
    }

    /// How long the work may still go on: leader, and its renew deadline not passed.
    fn may_act_for(&self) -> Option<Duration> {
        if !self.is_leader() {
            return None;
        }
        let until = (*self.held_until.borrow())?;
        until
            .duration_since(SystemTime::now())
            .ok()
            .filter(|left| !left.is_zero())
    }

    /// Runs `work` each time this candidate becomes leader, until `stop`. The token passed to
    /// `work` is cancelled as soon as leadership is lost (or `stop` fires); `work` should
    /// return promptly then. Returns `Ok` when `stop` is cancelled, and fails fast (like
    /// linkerd's runtime) when the lease task dies — a replica that cannot renew must not keep
    /// acting — or when `work` returns on its own while still leading.
    pub async fn run_while_leader<F, Fut>(
        &mut self,
        stop: &CancellationToken,
        mut work: F,
    ) -> Result<(), LeaderError>
    where
        F: FnMut(CancellationToken) -> Fut,
        Fut: Future<Output = ()>,
    {
        loop {
            while self.may_act_for().is_none() {
                tokio::select! {
                    () = stop.cancelled() => return Ok(()),
                    changed = self.leader.changed() => if changed.is_err() {
                        return Err(LeaderError::LeaseTaskEnded);
                    },
                    changed = self.held_until.changed() => if changed.is_err() {
                        return Err(LeaderError::LeaseTaskEnded);
                    },
                }
            }
            tracing::info!("became leader");
            let acting = stop.child_token();
            let run = work(acting.clone());
            tokio::pin!(run);
            let lost = loop {
                let Some(left) = self.may_act_for() else {
                    if self.is_leader() {
                        tracing::warn!(
                            "the lease was not seen renewed within the renew deadline; \
                             stopping all work before another replica may take over"
                        );
                    }
                    break None;
                };
                tokio::select! {
                    () = &mut run => {
                        if stop.is_cancelled() {
                            return Ok(());
                        }
                        return Err(LeaderError::WorkEnded);
                    }
                    changed = self.leader.changed() => {
                        if changed.is_err() {
                            break Some(LeaderError::LeaseTaskEnded);
                        }
                    }
                    changed = self.held_until.changed() => {
                        if changed.is_err() {
                            break Some(LeaderError::LeaseTaskEnded);
                        }
                    }
                    () = tokio::time::sleep(left) => {}
                }
            };
            tracing::warn!("lost leadership; stopping at once");
            acting.cancel();
            run.as_mut().await;
            if let Some(error) = lost {
                return Err(error);
            }
            if stop.is_cancelled() {
                return Ok(());
            }
        }
    }

    /// Gives the lease up, so that a candidate reading it next finds it free instead of held
    /// until expiry. (A kube-lease-manager follower reads it again only when the renewal it last
    /// saw would expire, so the handover to a running follower can still take up to a lease
    /// duration; a new candidate takes it at once.)
    pub async fn resign(self) {
        drop(self.leader);
        match self.manager.await {
            Ok(Ok(_)) => tracing::info!("lease released"),
            Ok(Err(error)) => {
                tracing::warn!(error = %Chain(&error), "could not release the lease cleanly");
            }
            Err(error) => tracing::warn!(error = %Chain(&error), "the lease manager task failed"),
        }
    }
}

/// Watches the Lease for this candidate's own renewals and publishes its renew deadline:
/// `renewTime + duration − margin / 2` while it is the holder. `renewTime` was written by this
/// process's own clock, so no skew enters.
fn watch_renewals(
    client: Client,
    config: &LeaderConfig,
) -> (watch::Receiver<Option<SystemTime>>, JoinHandle<()>) {
    let (sender, receiver) = watch::channel(None);
    let api: Api<Lease> = Api::namespaced(client, &config.namespace);
    let watching =
        watcher::Config::default().fields(&format!("metadata.name={}", config.lease_name));
    let identity = config.identity.clone();
    let deadline = Duration::from_secs(config.lease_duration_seconds)
        .saturating_sub(Duration::from_secs(config.renew_margin_seconds) / 2);
    let task = tokio::spawn(async move {
        let mut events = std::pin::pin!(watcher(api, watching).default_backoff());
        while let Some(event) = events.next().await {
            let lease = match event {
                Ok(watcher::Event::Apply(lease) | watcher::Event::InitApply(lease)) => Some(lease),
                Ok(watcher::Event::Delete(_)) => None,
                Ok(watcher::Event::Init | watcher::Event::InitDone) | Err(_) => continue,
            };
            let held_until = lease.and_then(|lease| {
                let spec = lease.spec?;
                if spec.holder_identity.as_deref() != Some(identity.as_str()) {
                    return None;
                }
                let renewed: SystemTime = spec.renew_time?.0.into();
                renewed.checked_add(deadline)
            });
            sender.send_replace(held_until);
        }
    });
    (receiver, task)
}

/// Runs `work` as a replicated controller does: with `election`, only while this candidate
/// leads (joining first, giving the lease up at the end); without one, at once until `stop`.
pub async fn run_elected<F, Fut>(
    client: Client,
    election: Option<&LeaderConfig>,
    stop: &CancellationToken,
    mut work: F,
) -> Result<(), LeaderError>
where
    F: FnMut(CancellationToken) -> Fut,
    Fut: Future<Output = ()>,
{
    let Some(config) = election else {
        work(stop.clone()).await;
        return Ok(());
    };
    let mut leadership = tokio::select! {
        () = stop.cancelled() => return Ok(()),
        started = Leadership::start(client, config) => started?,
    };
    let result = leadership.run_while_leader(stop, work).await;
    leadership.resign().await;
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::sync::mpsc;

    fn candidacy(leader: watch::Receiver<bool>) -> Leadership {
        let (renewed, held_until) =
            watch::channel(Some(SystemTime::now() + Duration::from_secs(3600)));
        // The renewals' sender lives as long as the candidacy, as the real watch task's does.
        let renewals = tokio::spawn(async move {
            let _renewed = renewed;
            std::future::pending::<()>().await;
        });
        candidacy_held(leader, held_until, renewals)
    }

    fn candidacy_held(
        leader: watch::Receiver<bool>,
        held_until: watch::Receiver<Option<SystemTime>>,
        renewals: JoinHandle<()>,
    ) -> Leadership {
        Leadership {
            leader,
            manager: tokio::spawn(async {
                Err(kube_lease_manager::LeaseManagerError::NonexistentLease(
                    "x".to_owned(),
                ))
            }),
            held_until,
            _renewals: AbortOnDropHandle::new(renewals),
        }
    }

    #[tokio::test]
    async fn work_stops_at_the_renew_deadline_and_starts_again_on_a_renewal() {
        let (_leader, leader) = watch::channel(true);
        let (renewed, held_until) =
            watch::channel(Some(SystemTime::now() + Duration::from_millis(300)));
        let mut leadership =
            candidacy_held(leader, held_until, tokio::spawn(std::future::pending()));
        let stop = CancellationToken::new();
        let (report, mut reports) = mpsc::unbounded_channel();
        let runner = leadership.run_while_leader(&stop, reporting_work(&report));
        let control = async {
            assert_eq!(reports.recv().await, Some("started"));
            // Still "leader" by the lease library, but no renewal seen: the work stops.
            assert_eq!(reports.recv().await, Some("stopped"));
            renewed.send_replace(Some(SystemTime::now() + Duration::from_secs(3600)));
            assert_eq!(reports.recv().await, Some("started"));
            stop.cancel();
            assert_eq!(reports.recv().await, Some("stopped"));
        };
        let result = within_5s(
            runner,
            control,
            "the work stops at the deadline and restarts on a renewal",
        )
        .await;
        assert!(result.is_ok(), "{result:?}");
    }

    /// Runs a candidacy and the test's control of it together, for at most 5 s.
    async fn within_5s(
        runner: impl Future<Output = Result<(), LeaderError>>,
        control: impl Future<Output = ()>,
        what: &str,
    ) -> Result<(), LeaderError> {
        let (result, ()) = tokio::time::timeout(Duration::from_secs(5), async {
            tokio::join!(runner, control)
        })
        .await
        .expect(what);
        result
    }

    /// Work that reports its start and stop, and runs until its token is cancelled.
    fn reporting_work(
        report: &mpsc::UnboundedSender<&'static str>,
    ) -> impl FnMut(CancellationToken) -> futures::future::BoxFuture<'static, ()> {
        let report = report.clone();
        move |acting| {
            let report = report.clone();
            Box::pin(async move {
                report.send("started").unwrap();
                acting.cancelled().await;
                report.send("stopped").unwrap();
            })
        }
    }

    #[tokio::test]
    async fn work_is_cancelled_the_moment_leadership_is_lost() {
        let (sender, leader) = watch::channel(false);
        let mut leadership = candidacy(leader);
        let stop = CancellationToken::new();
        let (report, mut reports) = mpsc::unbounded_channel();
        let runner = leadership.run_while_leader(&stop, reporting_work(&report));
        let control = async {
            sender.send(true).unwrap();
            assert_eq!(reports.recv().await, Some("started"));
            // Losing leadership must end the work; becoming leader again restarts it.
            sender.send(false).unwrap();
            assert_eq!(reports.recv().await, Some("stopped"));
            sender.send(true).unwrap();
            assert_eq!(reports.recv().await, Some("started"));
            stop.cancel();
            assert_eq!(reports.recv().await, Some("stopped"));
        };
        let result = within_5s(
            runner,
            control,
            "the work stops on leadership loss and on stop",
        )
        .await;
        assert!(result.is_ok(), "{result:?}");
    }

    #[tokio::test]
    async fn a_dead_lease_task_stops_the_work_and_fails() {
        let (sender, leader) = watch::channel(true);
        let mut leadership = candidacy(leader);
        let stop = CancellationToken::new();
        let (report, mut reports) = mpsc::unbounded_channel();
        let runner = leadership.run_while_leader(&stop, reporting_work(&report));
        let control = async {
            assert_eq!(reports.recv().await, Some("started"));
            drop(sender);
            assert_eq!(reports.recv().await, Some("stopped"));
        };
        let result = within_5s(runner, control, "a dead lease task ends the candidacy").await;
        assert!(
            matches!(result, Err(LeaderError::LeaseTaskEnded)),
            "{result:?}"
        );

        // Not yet leading when the task dies: fails too, instead of returning as if stopped.
        let (sender, leader) = watch::channel(false);
        let mut waiting = candidacy(leader);
        drop(sender);
        let result = waiting.run_while_leader(&stop, |_| async {}).await;
        assert!(
            matches!(result, Err(LeaderError::LeaseTaskEnded)),
            "{result:?}"
        );
    }

    #[tokio::test]
    async fn work_that_returns_while_leading_is_not_rerun() {
        let (_sender, leader) = watch::channel(true);
        let mut leadership = candidacy(leader);
        let stop = CancellationToken::new();
        let runs = std::sync::atomic::AtomicUsize::new(0);
        let result = tokio::time::timeout(
            Duration::from_secs(5),
            leadership.run_while_leader(&stop, |_| {
                runs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                async {}
            }),
        )
        .await
        .expect("returns at once");
        assert!(matches!(result, Err(LeaderError::WorkEnded)), "{result:?}");
        assert_eq!(runs.load(std::sync::atomic::Ordering::Relaxed), 1);
    }

    #[tokio::test]
    async fn bad_timings_are_rejected_before_the_crate_panics() {
        // kube-lease-manager panics on a zero or inverted margin; the check runs before any
        // API call, so a client that can reach nothing is enough.
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        let client = Client::try_from(config).unwrap();
        for (duration, margin) in [(5, 5), (0, 0), (5, 0), (3, 10)] {
            let error = Leadership::start(
                client.clone(),
                &LeaderConfig {
                    namespace: "default".into(),
                    lease_name: "l".into(),
                    identity: "a".into(),
                    lease_duration_seconds: duration,
                    renew_margin_seconds: margin,
                },
            )
            .await
            .unwrap_err();
            assert!(
                matches!(error, LeaderError::Timing { .. }),
                "{duration}/{margin}: {error}"
            );
        }
    }
}
