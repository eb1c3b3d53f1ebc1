//! Leader election for the cluster-wide controllers, on a coordination.k8s.io Lease managed by
//! kube-lease-manager (server-side apply, so two candidates can never both write the holder).
//!
//! The work runs under a child cancellation token that is cancelled the moment leadership is
//! lost: a deposed leader stops acting at once instead of finishing what it was doing.

use std::future::Future;

use kube::Client;
use kube_lease_manager::{LeaseCreateMode, LeaseManager, LeaseParams};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::error_chain::Chain;

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
}

impl Leadership {
    /// Joins the election; the lease is created if missing.
    pub async fn start(client: Client, config: &LeaderConfig) -> Result<Self, LeaderError> {
        let (duration, margin) = (config.lease_duration_seconds, config.renew_margin_seconds);
        if duration == 0 || margin == 0 || margin >= duration {
            return Err(LeaderError::Timing { duration, margin });
        }
        let params = LeaseParams::new(config.identity.clone(), duration, margin);
        let manager = LeaseManager::new(
            client,
            config.lease_name.clone(),
            config.namespace.clone(),
            params,
            LeaseCreateMode::AutoCreate,
        )
        .await
        .map_err(|source| LeaderError::Lease {
            namespace: config.namespace.clone(),
            name: config.lease_name.clone(),
            source,
        })?;
        let (leader, manager) = manager.watch().await;
        Ok(Self { leader, manager })
    }

    pub fn is_leader(&self) -> bool {
        *self.leader.borrow()
    }

    /// Runs `work` each time this candidate becomes leader, until `stop`. The token passed to
    /// `work` is cancelled as soon as leadership is lost (or `stop` fires); `work` should
    /// return promptly then. Returns when `stop` is cancelled.
    pub async fn run_while_leader<F, Fut>(&mut self, stop: &CancellationToken, mut work: F)
    where
        F: FnMut(CancellationToken) -> Fut,
        Fut: Future<Output = ()>,
    {
        loop {
            // Wait to become leader.
            while !self.is_leader() {
                tokio::select! {
                    () = stop.cancelled() => return,
                    changed = self.leader.changed() => if changed.is_err() { return },
                }
            }
            tracing::info!("became leader");
            let acting = stop.child_token();
            let run = work(acting.clone());
            tokio::pin!(run);
            loop {
                tokio::select! {
                    () = &mut run => break,
                    changed = self.leader.changed() => {
                        if changed.is_err() || !*self.leader.borrow() {
                            tracing::warn!("lost leadership; stopping at once");
                            acting.cancel();
                            run.as_mut().await;
                            break;
                        }
                    }
                }
            }
            if stop.is_cancelled() {
                return;
            }
        }
    }

    /// Gives the lease up so another candidate can take over without waiting for expiry.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn work_is_cancelled_the_moment_leadership_is_lost() {
        let (sender, leader) = watch::channel(false);
        let mut leadership = Leadership {
            leader,
            manager: tokio::spawn(async {
                Err(kube_lease_manager::LeaseManagerError::NonexistentLease(
                    "x".to_owned(),
                ))
            }),
        };
        let stop = CancellationToken::new();
        let (report, mut reports) = tokio::sync::mpsc::unbounded_channel();
        let runner = {
            let stop = stop.clone();
            async move {
                leadership
                    .run_while_leader(&stop, |acting| {
                        let report = report.clone();
                        async move {
                            report.send("started").unwrap();
                            acting.cancelled().await;
                            report.send("stopped").unwrap();
                        }
                    })
                    .await;
            }
        };
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
        tokio::time::timeout(std::time::Duration::from_secs(5), async {
            tokio::join!(runner, control);
        })
        .await
        .expect("the work stops on leadership loss and on stop");
    }

    #[test]
    fn bad_timings_are_rejected_before_the_crate_panics() {
        let error = LeaderError::Timing {
            duration: 5,
            margin: 5,
        };
        assert!(error.to_string().contains("greater than the renew margin"));
    }
}
