//! Command-line options. Every flag also reads `NODEGRACE_<FLAG>` (see `nodegrace_core::cli`).

use std::time::Duration;

use clap::Parser;
use nodegrace_core::cli::{ControllerArgs, duration_flag, ports};

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
    /// Taint a node that has been NotReady this long (a duration, e.g. 5m) and is confirmed
    /// powered off in this outage: annotated nodegrace.io/fenced=<RFC 3339 time of the fence,
    /// after the NotReady transition>, or stopped/terminated according to --instance-provider.
    /// Off when unset; never taints without a confirmation.
    #[arg(long, env = "NODEGRACE_AUTO_TAINT_AFTER", value_parser = duration_flag)]
    pub auto_taint_after: Option<Duration>,
}
