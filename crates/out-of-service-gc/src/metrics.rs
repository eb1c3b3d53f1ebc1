//! The controller's metrics, all `nodegrace_out_of_service_gc_…`.

use nodegrace_core::telemetry::{ErrorsByKind, KindLabel, ProgramRegistry};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GuardLabel {
    pub guard: &'static str,
}

/// Seconds from 1 to about 4.5 hours: fences take seconds to minutes, a recovery a boot.
fn step_seconds() -> Histogram {
    Histogram::new(exponential_buckets(1.0, 2.0, 15))
}

/// `--fence-after` and `--recover-after-cleanup`.
#[derive(Debug, Clone)]
pub struct FenceMetrics {
    /// Fences by how they ended: fenced, failed, cancelled (the node came back first).
    pub fences: Family<ResultLabel, Counter>,
    /// Fences held back, by the guard that held them.
    pub holds: Family<GuardLabel, Counter>,
    /// Recoveries by how they ended: recovered, failed.
    pub recoveries: Family<ResultLabel, Counter>,
    /// From the node's turn to NotReady to its machine confirmed off.
    pub not_ready_to_fenced: Histogram,
    /// From the power-off request to the provider reporting the machine off.
    pub power_off: Histogram,
    /// From the power-on request to the node Ready.
    pub recovery: Histogram,
}

impl Default for FenceMetrics {
    fn default() -> Self {
        Self {
            fences: Family::default(),
            holds: Family::default(),
            recoveries: Family::default(),
            not_ready_to_fenced: step_seconds(),
            power_off: step_seconds(),
            recovery: step_seconds(),
        }
    }
}

impl FenceMetrics {
    pub fn fence(&self, result: &'static str) {
        self.fences.get_or_create(&ResultLabel { result }).inc();
    }

    pub fn hold(&self, guard: &'static str) {
        self.holds.get_or_create(&GuardLabel { guard }).inc();
    }

    pub fn recovery(&self, result: &'static str) {
        self.recoveries.get_or_create(&ResultLabel { result }).inc();
    }

    fn register(&self, registry: &mut ProgramRegistry) {
        nodegrace_core::register_metrics!(registry, self, {
            fences:
                "Machines fenced by --fence-after, by result (fenced, failed, cancelled: the node came back first)",
            holds as "fence_holds":
                "Fences held back, by guard (heartbeat, partition, max-fenced, do-not-fence, not-found, provider)",
            recoveries:
                "Fenced machines powered on again by --recover-after-cleanup, by result (recovered, failed)",
            not_ready_to_fenced as "fence_not_ready_to_fenced_seconds":
                "From a node's turn to NotReady to its machine confirmed off",
            power_off as "fence_power_off_seconds":
                "From the power-off request to the provider reporting the machine off",
            recovery as "recovery_seconds": "From the power-on request to the node Ready",
        });
    }
}

#[derive(Debug, Clone, Default)]
pub struct Metrics {
    pub fence: FenceMetrics,
    pub provider: nodegrace_controller::instances::ProviderMetrics,
    pub pods_force_deleted: Counter,
    pub volumes_force_detached: Counter,
    pub refusals: Counter,
    pub taints_added: Counter,
    pub taints_removed: Counter,
    /// Force actions not taken because the live read said the node no longer qualifies.
    pub stale_skips: Counter,
    pub errors: ErrorsByKind,
    /// Nodes with the out-of-service taint being looked after now.
    pub nodes_tainted: Gauge,
}

impl Metrics {
    pub fn register(registry: &mut ProgramRegistry) -> Self {
        let metrics = Self::default();
        metrics.provider.register(registry);
        metrics.fence.register(registry);
        nodegrace_core::register_metrics!(registry, metrics, {
            pods_force_deleted: "Pods force-deleted from out-of-service nodes",
            volumes_force_detached: "VolumeAttachments of out-of-service nodes deleted",
            refusals: "Cleanups refused because the node's Lease was renewed recently",
            taints_added: "Out-of-service taints added (--auto-taint-after)",
            taints_removed: "Out-of-service taints removed (--auto-untaint)",
            stale_skips:
                "Force actions skipped because a live read showed the node no longer qualifies",
            errors: "Failed API calls, by kind (retried with backoff)",
            nodes_tainted: "Nodes with the out-of-service taint being looked after",
        });
        metrics
    }

    pub fn error(&self, kind: &'static str) {
        self.errors.get_or_create(&KindLabel { kind }).inc();
    }
}
