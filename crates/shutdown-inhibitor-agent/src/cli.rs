//! Command-line options. Every flag also reads `NODEGRACE_<FLAG>` (see nodegrace-core's `cli`).

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use nodegrace_core::cli::{duration_flag, ports};
use nodegrace_logind::AgentArgs;

#[derive(Debug, Parser)]
#[command(
    name = "shutdown-inhibitor-agent",
    version,
    about = "Turns Leases named after the node into a logind block inhibitor"
)]
pub struct Args {
    #[command(flatten)]
    pub agent: AgentArgs<{ ports::SHUTDOWN_INHIBITOR_AGENT }>,
    /// Off: hold nothing, report not ready (the chart can be installed disabled).
    #[arg(long, env = "NODEGRACE_ENABLED", default_value_t = true, action = clap::ArgAction::Set)]
    pub enabled: bool,
    /// What the block inhibitor covers, in logind's syntax (`shutdown`, `shutdown:sleep`).
    #[arg(long, env = "NODEGRACE_INHIBIT_WHAT", default_value = "shutdown")]
    pub inhibit_what: String,
    /// The namespaces whose Leases may block this node's shutdown, comma-separated (empty:
    /// every namespace but kube-node-lease). Whoever may create a Lease in one of them can hold
    /// the node's shutdown: this is the security boundary.
    #[arg(long, env = "NODEGRACE_LEASE_NAMESPACES", value_delimiter = ',')]
    pub lease_namespaces: Vec<String>,
    /// Only Leases with these labels count (kubectl's -l syntax, e.g.
    /// "nodegrace.io/inhibit=true"); empty: any.
    #[arg(long, env = "NODEGRACE_LEASE_SELECTOR", default_value = "")]
    pub lease_selector: String,
    /// YAML file with KubeletConfiguration's shutdownInhibitorAlertTimeout (a duration).
    #[arg(long, env = "NODEGRACE_CONFIG")]
    pub config: Option<PathBuf>,
    /// Warn about Leases held longer than this since their acquireTime (a duration, e.g. 30m;
    /// 0s = never).
    /// Overrides the config file's shutdownInhibitorAlertTimeout; default 0s.
    #[arg(long, env = "NODEGRACE_ALERT_TIMEOUT", value_parser = duration_flag)]
    pub alert_timeout: Option<Duration>,
}
