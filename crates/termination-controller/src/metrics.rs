//! The controller's metrics, all `nodegrace_termination_controller_…`; names follow
//! Karpenter's where it has one (`nodes_eviction_requests_total{code}`, `pods_drained_total
//! {reason}`, `nodes_drained_total`, `nodes_termination_duration_seconds`).

use nodegrace_core::telemetry::ProgramRegistry;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CodeLabel {
    /// The HTTP status, or `error` when no answer came.
    pub code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PdbLabel {
    /// `namespace/name`, or `none` for pods no budget covers.
    pub pdb: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NdbLabel {
    pub ndb: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReviewLabels {
    pub operation: &'static str,
    /// `allowed`, `queued` (admitted with a warning) or `denied`.
    pub verdict: &'static str,
}

#[derive(Debug, Clone)]
pub struct Metrics {
    pub eviction_requests: Family<CodeLabel, Counter>,
    pub pods_drained: Family<ReasonLabel, Counter>,
    pub nodes_drained: Counter,
    pub instances_terminated: Counter,
    pub termination_duration: Histogram,
    pub queue_depth: Family<PdbLabel, Gauge>,
    pub ndb_disruptions_allowed: Family<NdbLabel, Gauge>,
    pub nodes_terminating: Gauge,
    pub errors: Family<KindLabel, Counter>,
    pub webhook_reviews: Family<ReviewLabels, Counter>,
    pub webhook_duration: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            eviction_requests: Family::default(),
            pods_drained: Family::default(),
            nodes_drained: Counter::default(),
            instances_terminated: Counter::default(),
            // 1 s … ~4.5 h
            termination_duration: Histogram::new(exponential_buckets(1.0, 2.0, 15)),
            queue_depth: Family::default(),
            ndb_disruptions_allowed: Family::default(),
            nodes_terminating: Gauge::default(),
            errors: Family::default(),
            webhook_reviews: Family::default(),
            // 0.5 ms … ~2 s
            webhook_duration: Histogram::new(exponential_buckets(0.0005, 2.0, 13)),
        }
    }
}

impl Metrics {
    pub fn register(registry: &mut ProgramRegistry) -> Self {
        let metrics = Self::default();
        registry.register(
            "nodes_eviction_requests",
            "Eviction requests sent, by the answer's HTTP status",
            metrics.eviction_requests.clone(),
        );
        registry.register(
            "pods_drained",
            "Pods drained from terminating nodes, by how (evicted, or deleted at the drain deadline)",
            metrics.pods_drained.clone(),
        );
        registry.register(
            "nodes_drained",
            "Nodes whose drain completed",
            metrics.nodes_drained.clone(),
        );
        registry.register(
            "instances_terminated",
            "Machines whose termination the instance provider confirmed",
            metrics.instances_terminated.clone(),
        );
        registry.register(
            "nodes_termination_duration_seconds",
            "From a node's deletion to the removal of its finalizer",
            metrics.termination_duration.clone(),
        );
        registry.register(
            "eviction_queue_depth",
            "Pods waiting in each PodDisruptionBudget's eviction queue",
            metrics.queue_depth.clone(),
        );
        registry.register(
            "ndb_disruptions_allowed",
            "Node disruptions each NodeDisruptionBudget allows now",
            metrics.ndb_disruptions_allowed.clone(),
        );
        registry.register(
            "nodes_terminating",
            "Nodes being terminated now",
            metrics.nodes_terminating.clone(),
        );
        registry.register(
            "errors",
            "Failed API or provider calls, by kind (retried with backoff)",
            metrics.errors.clone(),
        );
        registry.register(
            "webhook_reviews",
            "Admission reviews answered, by operation and verdict",
            metrics.webhook_reviews.clone(),
        );
        registry.register(
            "webhook_review_duration_seconds",
            "Time to answer one admission review, from its first byte read",
            metrics.webhook_duration.clone(),
        );
        metrics
    }

    pub fn webhook_review(&self, operation: &'static str, verdict: &'static str) {
        self.webhook_reviews
            .get_or_create(&ReviewLabels { operation, verdict })
            .inc();
    }

    pub fn error(&self, kind: &'static str) {
        self.errors.get_or_create(&KindLabel { kind }).inc();
    }
}
