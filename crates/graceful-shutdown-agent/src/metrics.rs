//! The agent's metrics. Names follow the kubelet's graceful-shutdown metrics where it has them,
//! under the program prefix `nodegrace_graceful_shutdown_agent_`.

use std::sync::atomic::AtomicU64;

use nodegrace_core::telemetry::ProgramRegistry;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PodLabels {
    /// The group's priority threshold.
    pub group_priority: String,
    /// `stopped`, `timed_out`, `failed`, or `not_started` (the budget ended first).
    pub outcome: String,
}

#[derive(Debug, Clone)]
pub struct Metrics {
    pub start_time_seconds: Gauge<f64, AtomicU64>,
    pub end_time_seconds: Gauge<f64, AtomicU64>,
    pub duration_seconds: Histogram,
    pub pods_terminated: Family<PodLabels, Counter>,
    pub budget_seconds: Gauge<f64, AtomicU64>,
    pub budget_reduced: Gauge,
    pub inhibitor_held: Gauge,
    pub inhibit_failures: Counter,
    pub resumed_without_inhibitor: Gauge,
}

impl Metrics {
    pub fn register(registry: &mut ProgramRegistry) -> Self {
        let metrics = Self {
            start_time_seconds: Gauge::default(),
            end_time_seconds: Gauge::default(),
            // 0.5 s … ~17 min: shutdowns run from seconds to the longest sane budget.
            duration_seconds: Histogram::new(exponential_buckets(0.5, 2.0, 12)),
            pods_terminated: Family::default(),
            budget_seconds: Gauge::default(),
            budget_reduced: Gauge::default(),
            inhibitor_held: Gauge::default(),
            inhibit_failures: Counter::default(),
            resumed_without_inhibitor: Gauge::default(),
        };
        nodegrace_core::register_metrics!(registry, metrics, {
            start_time_seconds as "graceful_shutdown_start_time_seconds":
                "Unix time the last graceful shutdown started (kept across reboots)",
            end_time_seconds as "graceful_shutdown_end_time_seconds":
                "Unix time the last graceful shutdown ended (kept across reboots)",
            duration_seconds as "graceful_shutdown_duration_seconds":
                "Time from PrepareForShutdown to the inhibitor's release",
            pods_terminated as "graceful_shutdown_pods_terminated":
                "Pods terminated during shutdown, by priority group and outcome",
            budget_seconds as "graceful_shutdown_budget_seconds":
                "The shutdown budget in effect: min(wanted, logind's InhibitDelayMaxSec)",
            budget_reduced as "graceful_shutdown_budget_reduced":
                "1 when logind grants less delay than the configured groups need",
            inhibitor_held: "1 while the agent holds its logind delay inhibitor",
            inhibit_failures:
                "logind Inhibit calls that failed (each retried while the lock is wanted)",
            resumed_without_inhibitor as "graceful_shutdown_resumed_without_inhibitor":
                "1 when the agent restarted during a shutdown and finishes it without an \
                 inhibitor (logind grants none while shutting down)",
        });
        metrics
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::encoding::text::encode;

    #[test]
    fn metrics_carry_the_program_prefix() {
        // The registry the program itself builds, so a change of prefix shows here.
        let mut registry = ProgramRegistry::new(crate::app::PROGRAM);
        let metrics = Metrics::register(&mut registry);
        metrics.inhibitor_held.set(1);
        metrics
            .pods_terminated
            .get_or_create(&PodLabels {
                group_priority: "0".to_owned(),
                outcome: "stopped".to_owned(),
            })
            .inc();
        let mut text = String::new();
        encode(&mut text, registry.registry()).unwrap();
        assert!(
            text.contains("nodegrace_graceful_shutdown_agent_inhibitor_held 1"),
            "{text}"
        );
        assert!(text.contains(
            "nodegrace_graceful_shutdown_agent_graceful_shutdown_pods_terminated_total{group_priority=\"0\",outcome=\"stopped\"} 1"
        ), "{text}");
        assert!(
            text.contains("nodegrace_graceful_shutdown_agent_graceful_shutdown_start_time_seconds")
        );
    }
}
