//! Metrics, under `nodegrace_shutdown_inhibitor_agent_`.

use std::sync::atomic::AtomicU64;

use nodegrace_core::telemetry::ProgramRegistry;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;

#[derive(Debug, Clone, Default)]
pub struct Metrics {
    pub block_inhibitor_held: Gauge,
    pub active_leases: Gauge,
    pub oldest_active_lease_age_seconds: Gauge<f64, AtomicU64>,
    pub transitions: Counter,
    pub watch_restarts: Counter,
    /// Every Lease watch event received: with the field selector, other nodes' Leases add none.
    pub lease_watch_events: Counter,
    /// `ShutdownInhibitedTooLong` alerts raised (each published once, retried until it lands).
    pub alerts: Counter,
    /// 1 once logind announced the shutdown: Lease changes are ignored from then on.
    pub shutdown_in_progress: Gauge,
    /// 1 when root's shutdown requests pass a block lock on this node (logind before 257).
    pub root_passes_block: Gauge,
}

impl Metrics {
    pub fn register(registry: &mut ProgramRegistry) -> Self {
        let metrics = Self::default();
        nodegrace_core::register_metrics!(registry, metrics, {
            block_inhibitor_held: "1 while the logind block inhibitor is held",
            active_leases: "Active Leases named after this node",
            oldest_active_lease_age_seconds: "Time since the oldest active Lease's acquireTime",
            transitions: "Block/unblock transitions",
            watch_restarts: "Lease watch failures followed by a restart",
            lease_watch_events: "Lease watch events received",
            root_passes_block:
                "1 when this node's logind lets root shut down through a block inhibitor (older than systemd 257)",
            alerts: "Leases reported as held longer than the alert timeout",
            shutdown_in_progress:
                "1 once logind announced a shutdown; Lease changes are ignored from then on",
        });
        metrics
    }
}
