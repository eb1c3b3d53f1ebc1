//! The controller's metrics, all `nodegrace_termination_controller_…`; names follow
//! Karpenter's where it has one (`nodes_eviction_requests_total{code}`, `pods_drained_total
//! {reason}`, `nodes_drained_total`, `nodes_termination_duration_seconds`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use nodegrace_core::telemetry::{ErrorsByKind, KindLabel, ProgramRegistry};
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
pub struct ActionLabel {
    /// `created` or `withdrawn`.
    pub action: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResponderLabels {
    pub responder: String,
    /// The responder's final state: `Completed`, `Interrupted` (passed over for a missed
    /// heartbeat) or `Canceled`.
    pub outcome: String,
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
pub struct ReviewLabels {
    pub operation: &'static str,
    /// `allowed`, `queued` (admitted with a warning) or `denied`.
    pub verdict: &'static str,
}

#[derive(Debug, Clone)]
pub struct Metrics {
    pub provider: nodegrace_controller::instances::ProviderMetrics,
    pub eviction_requests: Family<CodeLabel, Counter>,
    pub handover_requests: Family<ActionLabel, Counter>,
    pub responder_outcomes: Family<ResponderLabels, Counter>,
    pub pods_drained: Family<ReasonLabel, Counter>,
    pub nodes_drained: Counter,
    pub instances_terminated: Counter,
    pub termination_duration: Histogram,
    pub queue_depth: QueueDepths,
    pub ndb_disruptions_allowed: Family<NdbLabel, Gauge>,
    pub ndb_invalid: Family<NdbLabel, Gauge>,
    pub nodes_terminating: Gauge,
    pub not_ready_deletions_held: Gauge,
    pub errors: ErrorsByKind,
    pub webhook_reviews: Family<ReviewLabels, Counter>,
    pub webhook_duration: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            provider: nodegrace_controller::instances::ProviderMetrics::default(),
            eviction_requests: Family::default(),
            handover_requests: Family::default(),
            responder_outcomes: Family::default(),
            pods_drained: Family::default(),
            nodes_drained: Counter::default(),
            instances_terminated: Counter::default(),
            // 1 s … ~4.5 h
            termination_duration: Histogram::new(exponential_buckets(1.0, 2.0, 15)),
            queue_depth: QueueDepths::default(),
            ndb_disruptions_allowed: Family::default(),
            ndb_invalid: Family::default(),
            nodes_terminating: Gauge::default(),
            not_ready_deletions_held: Gauge::default(),
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
        metrics.provider.register(registry);
        nodegrace_core::register_metrics!(registry, metrics, {
            eviction_requests as "nodes_eviction_requests":
                "Eviction requests sent, by the answer's HTTP status",
            handover_requests as "eviction_request_objects":
                "EvictionRequests (lifecycle.k8s.io, --eviction-api=eviction-request) created and withdrawn",
            responder_outcomes as "eviction_responder_outcomes":
                "Eviction responders of pods this controller requested, by their final state",
            pods_drained:
                "Pods drained from terminating nodes, by how (evicted, or deleted at the drain deadline)",
            nodes_drained: "Nodes whose drain completed",
            instances_terminated: "Machines whose termination the instance provider confirmed",
            termination_duration as "nodes_termination_duration_seconds":
                "From a node's deletion to the removal of its finalizer",
            queue_depth.gauges as "eviction_queue_depth":
                "Pods waiting in each PodDisruptionBudget's eviction queue",
            ndb_disruptions_allowed: "Node disruptions each NodeDisruptionBudget allows now",
            ndb_invalid:
                "1 for each NodeDisruptionBudget whose spec is invalid (it holds every node it may cover)",
            nodes_terminating: "Nodes being terminated now",
            not_ready_deletions_held:
                "1 while --not-ready-timeout deletes nothing because too many managed nodes are NotReady at once (a partition)",
            errors: "Failed API or provider calls, by kind (retried with backoff)",
            webhook_reviews: "Admission reviews answered, by operation and verdict",
            webhook_duration as "webhook_review_duration_seconds":
                "Time to answer one admission review, from its first byte read",
        });
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

/// The eviction queue depth per PodDisruptionBudget, summed over the drains that have pods in
/// its queue (two nodes draining pods of one budget both count); a budget no drain waits on
/// any more has no series, rather than its last value for ever.
#[derive(Debug, Clone, Default)]
pub struct QueueDepths {
    gauges: Family<PdbLabel, Gauge>,
    by_drain: Arc<Mutex<HashMap<String, HashMap<String, i64>>>>,
}

impl QueueDepths {
    /// Replaces what the drain `drain` (its node's UID) contributes; empty when it ends.
    pub fn set(&self, drain: &str, depths: HashMap<String, i64>) {
        let mut by_drain = self.by_drain.lock().unwrap_or_else(PoisonError::into_inner);
        let mut touched: Vec<String> = depths.keys().cloned().collect();
        let before = if depths.is_empty() {
            by_drain.remove(drain)
        } else {
            by_drain.insert(drain.to_owned(), depths)
        };
        touched.extend(before.into_iter().flat_map(HashMap::into_keys));
        touched.sort();
        touched.dedup();
        for label in touched {
            let total: i64 = by_drain
                .values()
                .filter_map(|depths| depths.get(&label))
                .sum();
            let waited_on = by_drain.values().any(|depths| depths.contains_key(&label));
            let key = PdbLabel { pdb: label };
            if waited_on {
                self.gauges.get_or_create(&key).set(total);
            } else {
                self.gauges.remove(&key);
            }
        }
    }

    /// The gauge's value for `pdb`, if it has a series (tests).
    pub fn get(&self, pdb: &str) -> Option<i64> {
        let by_drain = self.by_drain.lock().unwrap_or_else(PoisonError::into_inner);
        by_drain
            .values()
            .any(|depths| depths.contains_key(pdb))
            .then(|| by_drain.values().filter_map(|depths| depths.get(pdb)).sum())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_queue_depth_is_summed_over_drains_and_gone_with_the_last() {
        let depths = QueueDepths::default();
        depths.set("node-a", [("ns/web".to_owned(), 3)].into());
        depths.set(
            "node-b",
            [("ns/web".to_owned(), 2), ("none".to_owned(), 1)].into(),
        );
        assert_eq!(depths.get("ns/web"), Some(5));
        depths.set("node-a", HashMap::new());
        assert_eq!(depths.get("ns/web"), Some(2));
        depths.set("node-b", [("none".to_owned(), 1)].into());
        assert_eq!(depths.get("ns/web"), None, "no drain waits on it");
        assert_eq!(depths.get("none"), Some(1));
        depths.set("node-b", HashMap::new());
        assert_eq!(depths.get("none"), None);
    }
}
