//! Command-line options. Every flag also reads `NODEGRACE_<FLAG>` (see nodegrace-core's `cli`).

use std::time::Duration;

use clap::Parser;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use nodegrace_controller::ControllerArgs;
use nodegrace_core::cli::{duration_flag, ports};
use nodegrace_core::k8s::selectors::parse_selector;

/// The API rate limit is higher than the other programs': a node of 110 pods needs about 230
/// writes (a status patch and a delete per pod, the node read before them), and the point of
/// this controller is to make them at once, not over ten seconds.
#[derive(Debug, Parser)]
#[command(
    name = "out-of-service-gc",
    version,
    about = "Force-deletes the pods and detaches the volumes of nodes that are out of service \
             and not ready (KEP-2268)",
    mut_arg("api_qps", |arg| arg.default_value("100")),
    mut_arg("api_burst", |arg| arg.default_value("300")),
)]
pub struct Args {
    #[command(flatten)]
    pub controller: ControllerArgs<{ ports::OUT_OF_SERVICE_GC }>,
    /// Refuse to act on a node whose Lease in kube-node-lease this controller saw renewed
    /// within --liveness-guard-window (by its own clock): it is partitioned or rebooting, not
    /// shut down.
    #[arg(long, env = "NODEGRACE_LIVENESS_GUARD", default_value_t = true, action = clap::ArgAction::Set)]
    pub liveness_guard: bool,
    /// How recently a seen Lease renewal refuses the cleanup, and how long after its start
    /// this controller watches before trusting silence (a duration, e.g. 80s). Default: twice
    /// the Lease's leaseDurationSeconds.
    #[arg(long, env = "NODEGRACE_LIVENESS_GUARD_WINDOW", value_parser = duration_flag)]
    pub liveness_guard_window: Option<Duration>,
    /// Remove the out-of-service taint once the node is Ready again and nothing that was bound
    /// to it before (pods that do not tolerate the taint, VolumeAttachments) remains.
    #[arg(long, env = "NODEGRACE_AUTO_UNTAINT", default_value_t = false, action = clap::ArgAction::Set)]
    pub auto_untaint: bool,
    /// How often a clean node that stays out of service is looked at again for pods bound to
    /// it since (a duration, e.g. 5m). Its pod watch is closed while it rests; a change of the
    /// node or of its VolumeAttachments looks at it at once. Only a pod created with its
    /// spec.nodeName already set bypasses the scheduler and the NoExecute taint to get there.
    #[arg(long, env = "NODEGRACE_CLEAN_NODE_RECHECK", default_value = "5m", value_parser = duration_flag)]
    pub clean_node_recheck: Duration,
    /// Taint a node that has been NotReady this long (a duration, e.g. 5m) and is confirmed
    /// powered off in this outage: annotated nodegrace.io/fenced=<RFC 3339 time of the fence,
    /// after the NotReady transition>, or stopped/terminated according to --instance-provider.
    /// Off when unset; never taints without a confirmation.
    #[arg(long, env = "NODEGRACE_AUTO_TAINT_AFTER", value_parser = duration_flag)]
    pub auto_taint_after: Option<Duration>,
    #[command(flatten)]
    pub fencing: FencingArgs,
}

/// Fencing and recovery: this controller as the fencing agent (docs/out-of-service-gc.md,
/// "Fencing and recovery").
#[derive(Debug, Clone, clap::Args)]
pub struct FencingArgs {
    /// Power off, through --instance-provider, the machine of a node NotReady this long (a
    /// duration, at least 1s, e.g. 5m), once every guard allows it; confirmed off, the node gets
    /// nodegrace.io/fenced and the out-of-service taint. Off when unset. Needs a provider with
    /// power control (aws, redfish, sim).
    #[arg(long, env = "NODEGRACE_FENCE_AFTER", value_parser = duration_flag)]
    pub fence_after: Option<Duration>,
    /// The nodes --fence-after may fence (kubectl's -l syntax); the partition guard counts
    /// these. The default leaves control-plane nodes alone.
    #[arg(long, env = "NODEGRACE_FENCE_NODE_SELECTOR", default_value = "!node-role.kubernetes.io/control-plane", value_parser = parse_selector)]
    pub fence_node_selector: LabelSelector,
    /// No fencing while more than this fraction of the nodes --fence-node-selector selects
    /// (or of one zone's, by topology.kubernetes.io/zone) is NotReady, rounded up: that many
    /// down at once is a partition, not dead machines.
    #[arg(long, env = "NODEGRACE_NOT_READY_MAX_FRACTION", default_value_t = 0.2)]
    pub not_ready_max_fraction: f64,
    /// At most this many machines fenced and not yet back at once (fencing, fenced, powering
    /// on, or failed to come back); more wait.
    #[arg(long, env = "NODEGRACE_MAX_FENCED", default_value_t = 1)]
    pub max_fenced: usize,
    /// How long the provider may take to report a machine off after the power-off request
    /// before the fence counts as failed (and is tried again later).
    #[arg(long, env = "NODEGRACE_FENCE_TIMEOUT", default_value = "5m", value_parser = duration_flag)]
    pub fence_timeout: Duration,
    /// Once a fenced node is clean (no pod that does not tolerate the taint, no VolumeAttachment
    /// of those pods), power its machine on again; needs --fence-after and --auto-untaint.
    #[arg(long, env = "NODEGRACE_RECOVER_AFTER_CLEANUP", default_value_t = false, action = clap::ArgAction::Set)]
    pub recover_after_cleanup: bool,
    /// A machine powered on again whose node is not Ready within this long is powered off
    /// again, reported, and left off.
    #[arg(long, env = "NODEGRACE_RECOVER_TIMEOUT", default_value = "10m", value_parser = duration_flag)]
    pub recover_timeout: Duration,
}
