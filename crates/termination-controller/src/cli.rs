//! Command-line options. Every flag also reads `NODEGRACE_<FLAG>` (see `nodegrace_core::cli`).

use std::time::Duration;

use clap::Parser;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use nodegrace_core::cli::{CommonArgs, InstanceArgs, LeaderArgs, duration_flag, ports};
use nodegrace_core::k8s::selectors::parse_selector;

#[derive(Debug, Parser)]
#[command(
    name = "termination-controller",
    version,
    about = "Makes `kubectl delete node` safe: holds the Node with a finalizer while it is \
             cordoned, drained through the Eviction API within PodDisruptionBudgets and \
             NodeDisruptionBudgets, and its machine terminated",
    mut_arg("api_qps", |arg| arg.default_value("50")),
    mut_arg("api_burst", |arg| arg.default_value("100")),
)]
pub struct Args {
    #[command(flatten)]
    pub common: CommonArgs<{ ports::TERMINATION_CONTROLLER }>,
    #[command(flatten)]
    pub leader: LeaderArgs,
    #[command(flatten)]
    pub instances: InstanceArgs,
    /// The nodes this controller manages (kubectl's -l syntax, e.g. "pool=batch,!gpu"); the
    /// empty default manages every node.
    #[arg(long, env = "NODEGRACE_NODE_SELECTOR", default_value = "", value_parser = parse_selector)]
    pub node_selector: LabelSelector,
    /// Eviction requests per second, over all nodes and queues.
    #[arg(long, env = "NODEGRACE_EVICTION_QPS", default_value_t = 50.0)]
    pub eviction_qps: f64,
    /// Eviction requests that may go at once before --eviction-qps paces them.
    #[arg(long, env = "NODEGRACE_EVICTION_BURST", default_value_t = 100)]
    pub eviction_burst: u32,
    /// Evictions in flight at once per node for pods no PodDisruptionBudget covers.
    #[arg(long, env = "NODEGRACE_EVICTION_CONCURRENCY", default_value_t = 16)]
    pub eviction_concurrency: usize,
    /// First retry delay of a refused eviction (a duration; doubles per refusal, with jitter).
    #[arg(long, env = "NODEGRACE_EVICTION_BACKOFF_MIN", default_value = "100ms", value_parser = duration_flag)]
    pub eviction_backoff_min: Duration,
    /// Longest retry delay of a refused eviction.
    #[arg(long, env = "NODEGRACE_EVICTION_BACKOFF_MAX", default_value = "10s", value_parser = duration_flag)]
    pub eviction_backoff_max: Duration,
    /// Past this long after the node's deletion, the pods still there are deleted with their
    /// grace period cut to the time left (at least 1 s), do-not-evict pods included
    /// (Karpenter's terminationGracePeriod). Off when unset.
    #[arg(long, env = "NODEGRACE_DRAIN_TIMEOUT", value_parser = duration_flag)]
    pub drain_timeout: Option<Duration>,
    /// How long to wait for the node's VolumeAttachments to go after the drain before the
    /// machine is terminated anyway.
    #[arg(long, env = "NODEGRACE_VOLUME_DETACH_TIMEOUT", default_value = "5m", value_parser = duration_flag)]
    pub volume_detach_timeout: Duration,
    /// Delete a managed node that has been NotReady this long (the seed's 15m), which starts
    /// its termination. Off when unset.
    #[arg(long, env = "NODEGRACE_NOT_READY_TIMEOUT", value_parser = duration_flag)]
    pub not_ready_timeout: Option<Duration>,
}
