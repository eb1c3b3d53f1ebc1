//! The controller's metrics, all `nodegrace_out_of_service_gc_…`.

use nodegrace_core::telemetry::ProgramRegistry;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: &'static str,
}

#[derive(Debug, Clone, Default)]
pub struct Metrics {
    pub provider: nodegrace_core::instances::ProviderMetrics,
    pub pods_force_deleted: Counter,
    pub volumes_force_detached: Counter,
    pub refusals: Counter,
    pub taints_added: Counter,
    pub taints_removed: Counter,
    /// Force actions not taken because the live read said the node no longer qualifies.
    pub stale_skips: Counter,
    pub errors: Family<KindLabel, Counter>,
    /// Nodes with the out-of-service taint being looked after now.
    pub nodes_tainted: Gauge,
}

impl Metrics {
    pub fn register(registry: &mut ProgramRegistry) -> Self {
        let metrics = Self::default();
        metrics.provider.register(registry);
        registry.register(
            "pods_force_deleted",
            "Pods force-deleted from out-of-service nodes",
            metrics.pods_force_deleted.clone(),
        );
        registry.register(
            "volumes_force_detached",
            "VolumeAttachments of out-of-service nodes deleted",
            metrics.volumes_force_detached.clone(),
        );
        registry.register(
            "refusals",
            "Cleanups refused because the node's Lease was renewed recently",
            metrics.refusals.clone(),
        );
        registry.register(
            "taints_added",
            "Out-of-service taints added (--auto-taint-after)",
            metrics.taints_added.clone(),
        );
        registry.register(
            "taints_removed",
            "Out-of-service taints removed (--auto-untaint)",
            metrics.taints_removed.clone(),
        );
        registry.register(
            "stale_skips",
            "Force actions skipped because a live read showed the node no longer qualifies",
            metrics.stale_skips.clone(),
        );
        registry.register(
            "errors",
            "Failed API calls, by kind (retried with backoff)",
            metrics.errors.clone(),
        );
        registry.register(
            "nodes_tainted",
            "Nodes with the out-of-service taint being looked after",
            metrics.nodes_tainted.clone(),
        );
        metrics
    }

    pub fn error(&self, kind: &'static str) {
        self.errors.get_or_create(&KindLabel { kind }).inc();
    }
}
