//! Command-line options; every flag also reads an environment variable.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use nodegrace_core::cli::{CommonArgs, NodeArgs, ports};

#[derive(Debug, Parser)]
#[command(
    name = "shutdown-inhibitor-agent",
    version,
    about = "Turns Leases named after the node into a logind block inhibitor"
)]
pub struct Args {
    #[command(flatten)]
    pub common: CommonArgs<{ ports::SHUTDOWN_INHIBITOR_AGENT }>,
    #[command(flatten)]
    pub node: NodeArgs,
    /// Off: hold nothing, report not ready (the chart can be installed disabled).
    #[arg(long, env = "INHIBITOR_ENABLED", default_value_t = true, action = clap::ArgAction::Set)]
    pub enabled: bool,
    /// What the block inhibitor covers, in logind's syntax (`shutdown`, `shutdown:sleep`).
    #[arg(long, env = "INHIBIT_WHAT", default_value = "shutdown")]
    pub inhibit_what: String,
    /// YAML file with KubeletConfiguration's shutdownInhibitorAlertTimeout (a duration).
    #[arg(long, env = "SIA_CONFIG")]
    pub config: Option<PathBuf>,
    /// Warn about Leases held longer than this since their acquireTime, e.g. 30m (0s = never).
    /// Overrides the config file's shutdownInhibitorAlertTimeout; default 0s.
    #[arg(long, env = "SHUTDOWN_INHIBITOR_ALERT_TIMEOUT", value_parser = parse_duration)]
    pub alert_timeout: Option<Duration>,
    /// The system bus (default: the standard system bus socket).
    #[arg(long, env = "DBUS_SYSTEM_BUS_ADDRESS")]
    pub dbus_address: Option<String>,
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    nodegrace_core::duration::parse_go_duration(text).map_err(|error| error.to_string())
}
