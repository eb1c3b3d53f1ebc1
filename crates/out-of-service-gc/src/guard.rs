//! The liveness guard: a node whose kubelet still renews its Lease in `kube-node-lease` is
//! partitioned or rebooting, not shut down; force-detaching its volumes could corrupt data.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;

/// The kubelet's default `leaseDurationSeconds`, used when the Lease does not say.
const DEFAULT_LEASE_SECONDS: u64 = 40;

/// What the node's heartbeat says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Heartbeat {
    /// Renewed within the window: refuse until `until`.
    Recent {
        renewed: Timestamp,
        until: Timestamp,
    },
    /// Not renewed within the window (or there is no Lease): the guard lets the cleanup go on.
    Silent,
}

/// The window: `--liveness-guard-window` when set, else twice the Lease's duration.
pub fn window(lease: Option<&Lease>, configured: Option<Duration>) -> Duration {
    configured.unwrap_or_else(|| {
        let seconds = lease
            .and_then(|lease| lease.spec.as_ref())
            .and_then(|spec| spec.lease_duration_seconds)
            .and_then(|seconds| u64::try_from(seconds).ok())
            .filter(|seconds| *seconds > 0)
            .unwrap_or(DEFAULT_LEASE_SECONDS);
        Duration::from_secs(2 * seconds)
    })
}

/// Whether the Lease was renewed within `window` before `now`. A renewal in the future (clock
/// skew) counts as recent.
pub fn heartbeat(lease: Option<&Lease>, now: Timestamp, window: Duration) -> Heartbeat {
    let Some(renewed) = lease
        .and_then(|lease| lease.spec.as_ref())
        .and_then(|spec| spec.renew_time.as_ref().or(spec.acquire_time.as_ref()))
        .map(|time| time.0)
    else {
        return Heartbeat::Silent;
    };
    let until = renewed.checked_add(window).unwrap_or(Timestamp::MAX);
    if until > now {
        Heartbeat::Recent { renewed, until }
    } else {
        Heartbeat::Silent
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn lease(spec: &serde_json::Value) -> Lease {
        serde_json::from_value(json!({"metadata": {"name": "n"}, "spec": spec})).unwrap()
    }

    #[test]
    fn the_window_is_twice_the_lease_unless_configured() {
        let forty = lease(&json!({"leaseDurationSeconds": 40}));
        assert_eq!(window(Some(&forty), None), Duration::from_secs(80));
        let fifteen = lease(&json!({"leaseDurationSeconds": 15}));
        assert_eq!(window(Some(&fifteen), None), Duration::from_secs(30));
        assert_eq!(
            window(Some(&lease(&json!({}))), None),
            Duration::from_secs(80)
        );
        assert_eq!(window(None, None), Duration::from_secs(80));
        let zero = lease(&json!({"leaseDurationSeconds": 0}));
        assert_eq!(window(Some(&zero), None), Duration::from_secs(80));
        assert_eq!(
            window(Some(&forty), Some(Duration::from_secs(5))),
            Duration::from_secs(5)
        );
    }

    #[test]
    fn a_renewal_inside_the_window_refuses_until_it_ends() {
        let now: Timestamp = "2026-01-01T00:01:00Z".parse().unwrap();
        let window = Duration::from_secs(80);
        let renewed = lease(&json!({"renewTime": "2026-01-01T00:00:10.000000Z"}));
        assert_eq!(
            heartbeat(Some(&renewed), now, window),
            Heartbeat::Recent {
                renewed: "2026-01-01T00:00:10Z".parse().unwrap(),
                until: "2026-01-01T00:01:30Z".parse().unwrap(),
            }
        );
        // Exactly at the end of the window the heartbeat is over.
        let edge = lease(&json!({"renewTime": "2025-12-31T23:59:40.000000Z"}));
        assert_eq!(heartbeat(Some(&edge), now, window), Heartbeat::Silent);
        let old = lease(&json!({"renewTime": "2025-12-31T23:00:00.000000Z"}));
        assert_eq!(heartbeat(Some(&old), now, window), Heartbeat::Silent);
        let skewed = lease(&json!({"renewTime": "2026-01-01T00:05:00.000000Z"}));
        assert!(matches!(
            heartbeat(Some(&skewed), now, window),
            Heartbeat::Recent { .. }
        ));
        let acquired_only = lease(&json!({"acquireTime": "2026-01-01T00:00:30.000000Z"}));
        assert!(matches!(
            heartbeat(Some(&acquired_only), now, window),
            Heartbeat::Recent { .. }
        ));
        assert_eq!(
            heartbeat(Some(&lease(&json!({}))), now, window),
            Heartbeat::Silent
        );
        assert_eq!(heartbeat(None, now, window), Heartbeat::Silent);
    }
}
