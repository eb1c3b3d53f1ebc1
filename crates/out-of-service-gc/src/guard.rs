//! The liveness guard: a node whose kubelet still renews its Lease in `kube-node-lease` is
//! partitioned or rebooting, not shut down; force-detaching its volumes could corrupt data.
//!
//! Judged as the node lifecycle controller judges a node's health: by when *this process saw*
//! the Lease change, on its own monotonic clock. The kubelet's `renewTime` is only compared
//! with its previous value, never with our clock, so a kubelet whose clock is minutes off
//! neither looks silent while it renews nor alive after it stopped. After our own start we
//! have seen nothing yet: silence is trusted only after watching one full window of it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tokio::time::Instant;

/// The kubelet's default `leaseDurationSeconds`, used when the Lease does not say.
const DEFAULT_LEASE_SECONDS: u64 = 40;
use crate::api::NODE_LEASE_NAMESPACE;

/// What the node's heartbeat says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Heartbeat {
    /// A sign of life within the window: refuse for `left` more.
    Recent { evidence: Evidence, left: Duration },
    /// No change of the Lease seen for a whole window: the guard lets the cleanup go on.
    Silent,
}

/// Why the heartbeat counts as recent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Evidence {
    /// We saw the Lease change (renewTime or resourceVersion) this long ago.
    Changed { ago: Duration },
    /// We have been watching for only this long: not yet a window of silence.
    JustStarted { watching: Duration },
}

impl Evidence {
    /// Why the heartbeat is recent, for Events and conditions, as of `now`.
    pub fn explain(self, now: jiff::Timestamp) -> String {
        match self {
            Self::Changed { ago } => format!(
                "this controller saw the node's Lease in {NODE_LEASE_NAMESPACE} renewed at {} \
                 (by its own clock, {}s ago): its kubelet still heartbeats, so it is partitioned \
                 or rebooting, not shut down",
                now.checked_sub(ago)
                    .unwrap_or(now)
                    .round(jiff::Unit::Second)
                    .unwrap_or(now),
                ago.as_secs()
            ),
            Self::JustStarted { watching } => format!(
                "this controller has watched the node's Lease in {NODE_LEASE_NAMESPACE} for only \
                 {}s since it started: silence counts only after a whole liveness guard window \
                 of it",
                watching.as_secs()
            ),
        }
    }
}

/// The window: `--liveness-guard-window` when set, else twice the Lease's duration.
pub fn window(lease_seconds: Option<i32>, configured: Option<Duration>) -> Duration {
    configured.unwrap_or_else(|| {
        let seconds = lease_seconds
            .and_then(|seconds| u64::try_from(seconds).ok())
            .filter(|seconds| *seconds > 0)
            .unwrap_or(DEFAULT_LEASE_SECONDS);
        Duration::from_secs(2 * seconds)
    })
}

/// The parts of a Lease whose change is a sign of life.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Beat {
    resource_version: Option<String>,
    renew_time: Option<String>,
}

impl Beat {
    fn of(lease: &Lease) -> Self {
        let spec = lease.spec.as_ref();
        Self {
            resource_version: lease.metadata.resource_version.clone(),
            renew_time: spec
                .and_then(|spec| spec.renew_time.as_ref())
                .map(|time| time.0.to_string()),
        }
    }
}

#[derive(Debug)]
struct Seen {
    /// `None` once the Lease is gone.
    beat: Option<Beat>,
    lease_seconds: Option<i32>,
    changed_at: Instant,
}

/// Every node's heartbeat as this process saw it.
#[derive(Debug)]
pub struct Heartbeats {
    watching_since: Instant,
    seen: Mutex<HashMap<String, Seen>>,
}

impl Heartbeats {
    pub fn new(watching_since: Instant) -> Self {
        Self {
            watching_since,
            seen: Mutex::default(),
        }
    }

    /// Records what a watch event or a fresh read showed of `node`'s Lease at `at`: any
    /// difference from what was seen before counts as a sign of life at `at` (the change
    /// happened no later, so the window can only end later than the truth, never sooner).
    pub fn observe(&self, node: &str, lease: Option<&Lease>, at: Instant) {
        let beat = lease.map(Beat::of);
        let lease_seconds = lease
            .and_then(|lease| lease.spec.as_ref())
            .and_then(|spec| spec.lease_duration_seconds);
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        match seen.get_mut(node) {
            Some(known) if known.beat == beat => {}
            Some(known) => {
                known.beat = beat;
                known.changed_at = at;
                known.lease_seconds = lease_seconds.or(known.lease_seconds);
            }
            // Never seen (and never seen gone): nothing to compare with, so this is as good as
            // a change now — at our start this is the start itself.
            None if beat.is_none() => {}
            None => {
                seen.insert(
                    node.to_owned(),
                    Seen {
                        beat,
                        lease_seconds,
                        changed_at: at,
                    },
                );
            }
        }
    }

    /// The heartbeat of `node` at `now`.
    pub fn judge(&self, node: &str, now: Instant, configured: Option<Duration>) -> Heartbeat {
        let seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        let known = seen.get(node);
        let window = window(known.and_then(|seen| seen.lease_seconds), configured);
        let (last, evidence) = match known {
            Some(seen) if seen.changed_at > self.watching_since => (
                seen.changed_at,
                Evidence::Changed {
                    ago: now.saturating_duration_since(seen.changed_at),
                },
            ),
            _ => (
                self.watching_since,
                Evidence::JustStarted {
                    watching: now.saturating_duration_since(self.watching_since),
                },
            ),
        };
        let left = (last + window).saturating_duration_since(now);
        if left.is_zero() {
            Heartbeat::Silent
        } else {
            Heartbeat::Recent { evidence, left }
        }
    }

    /// Reads `node`'s Lease fresh, records what it shows (a renewal the watch has not
    /// delivered yet still counts) and judges the heartbeat now.
    pub async fn read(
        &self,
        client: &Client,
        node: &str,
        configured: Option<Duration>,
    ) -> Result<Heartbeat, kube::Error> {
        let leases: Api<Lease> = Api::namespaced(client.clone(), NODE_LEASE_NAMESPACE);
        let lease = leases.get_opt(node).await?;
        let read_at = Instant::now();
        self.observe(node, lease.as_ref(), read_at);
        Ok(self.judge(node, read_at, configured))
    }

    /// Watches every Lease in `kube-node-lease` until the returned task is aborted, feeding
    /// what it sees into `observe`. A broken watch only makes the fresh read before each
    /// force action the one to notice a renewal, which it also records.
    pub fn watch(self: &Arc<Self>, client: Client) -> tokio::task::JoinHandle<()> {
        let heartbeats = Arc::clone(self);
        let leases: Api<Lease> = Api::namespaced(client, NODE_LEASE_NAMESPACE);
        tokio::spawn(async move {
            let mut events = watcher(leases, watcher::Config::default())
                .default_backoff()
                .boxed();
            while let Some(event) = events.next().await {
                match event {
                    Ok(watcher::Event::Apply(lease) | watcher::Event::InitApply(lease)) => {
                        let name = lease.metadata.name.clone().unwrap_or_default();
                        heartbeats.observe(&name, Some(&lease), Instant::now());
                    }
                    Ok(watcher::Event::Delete(lease)) => {
                        let name = lease.metadata.name.clone().unwrap_or_default();
                        heartbeats.observe(&name, None, Instant::now());
                    }
                    Ok(watcher::Event::Init | watcher::Event::InitDone) => {}
                    Err(error) => {
                        tracing::warn!(%error, "watch of the nodes' heartbeat Leases failed; retrying");
                    }
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn lease(version: &str, spec: &serde_json::Value) -> Lease {
        serde_json::from_value(
            json!({"metadata": {"name": "n", "resourceVersion": version}, "spec": spec}),
        )
        .unwrap()
    }

    #[test]
    fn the_window_is_twice_the_lease_unless_configured() {
        assert_eq!(window(Some(40), None), Duration::from_secs(80));
        assert_eq!(window(Some(15), None), Duration::from_secs(30));
        assert_eq!(window(None, None), Duration::from_secs(80));
        assert_eq!(window(Some(0), None), Duration::from_secs(80));
        assert_eq!(
            window(Some(40), Some(Duration::from_secs(5))),
            Duration::from_secs(5)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn renewals_count_by_when_we_saw_them_whatever_the_kubelets_clock_says() {
        let start = Instant::now();
        let heartbeats = Heartbeats::new(start);
        let window = Some(Duration::from_secs(10));
        let seconds = Duration::from_secs;
        // A kubelet ten minutes behind, renewing every second.
        let behind = |version: u32, second: u32| {
            lease(
                &version.to_string(),
                &json!({"renewTime": format!("2026-01-01T00:00:{second:02}.000000Z"), "leaseDurationSeconds": 40}),
            )
        };
        heartbeats.observe("n", Some(&behind(1, 0)), start);
        assert!(matches!(
            heartbeats.judge("n", start + seconds(3), window),
            Heartbeat::Recent {
                evidence: Evidence::JustStarted { .. },
                ..
            }
        ));
        for second in 1..=20 {
            heartbeats.observe(
                "n",
                Some(&behind(second + 1, second)),
                start + seconds(second.into()),
            );
        }
        assert_eq!(
            heartbeats.judge("n", start + seconds(21), window),
            Heartbeat::Recent {
                evidence: Evidence::Changed { ago: seconds(1) },
                left: seconds(9),
            }
        );
        // The same Lease seen again (a relist, a fresh read) is no sign of life.
        heartbeats.observe("n", Some(&behind(21, 20)), start + seconds(25));
        assert_eq!(
            heartbeats.judge("n", start + seconds(29), window),
            Heartbeat::Recent {
                evidence: Evidence::Changed { ago: seconds(9) },
                left: seconds(1),
            }
        );
        // Renewals stopped at 20 s: silent one window later.
        assert_eq!(
            heartbeats.judge("n", start + seconds(30), window),
            Heartbeat::Silent
        );
        // A resourceVersion change alone (same renewTime) is a sign of life too.
        heartbeats.observe("n", Some(&behind(22, 20)), start + seconds(31));
        assert!(matches!(
            heartbeats.judge("n", start + seconds(31), window),
            Heartbeat::Recent { .. }
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn after_a_start_silence_counts_only_from_the_start() {
        let start = Instant::now();
        let heartbeats = Heartbeats::new(start);
        let seconds = Duration::from_secs;
        // An old renewal, seen in the first list: it tells nothing of the time before us.
        let old = lease(
            "7",
            &json!({"renewTime": "2020-01-01T00:00:00.000000Z", "leaseDurationSeconds": 5}),
        );
        heartbeats.observe("n", Some(&old), start);
        assert_eq!(
            heartbeats.judge("n", start + seconds(4), None),
            Heartbeat::Recent {
                evidence: Evidence::JustStarted {
                    watching: seconds(4)
                },
                left: seconds(6),
            }
        );
        assert_eq!(
            heartbeats.judge("n", start + seconds(10), None),
            Heartbeat::Silent
        );
        // No Lease at all: the same wait, with the default duration.
        assert!(matches!(
            heartbeats.judge("absent", start + seconds(79), None),
            Heartbeat::Recent {
                evidence: Evidence::JustStarted { .. },
                ..
            }
        ));
        assert_eq!(
            heartbeats.judge("absent", start + seconds(80), None),
            Heartbeat::Silent
        );
        // A Lease deleted is a change.
        heartbeats.observe("n", None, start + seconds(11));
        assert!(matches!(
            heartbeats.judge("n", start + seconds(12), None),
            Heartbeat::Recent {
                evidence: Evidence::Changed { .. },
                ..
            }
        ));
    }
}
