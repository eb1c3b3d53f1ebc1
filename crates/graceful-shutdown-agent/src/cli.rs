//! Command-line options. Every flag also reads `NODEGRACE_<FLAG>` (see nodegrace-core's `cli`).

use std::path::PathBuf;

use clap::Parser;
use nodegrace_core::cli::{duration_flag, ports};
use nodegrace_logind::AgentArgs;

use crate::config::{PriorityPeriod, ShutdownSettings, parse_priority_flag};

#[derive(Debug, Parser)]
#[command(
    name = "graceful-shutdown-agent",
    version,
    about = "Terminates a node's pods gracefully, in priority order, when the machine shuts down"
)]
pub struct Args {
    #[command(flatten)]
    pub agent: AgentArgs<{ ports::GRACEFUL_SHUTDOWN_AGENT }>,

    /// YAML file with KubeletConfiguration's shutdown fields (shutdownGracePeriod,
    /// shutdownGracePeriodCriticalPods, shutdownGracePeriodByPodPriority).
    #[arg(long, env = "NODEGRACE_CONFIG")]
    pub config: Option<PathBuf>,
    /// Overrides shutdownGracePeriod (a duration such as 30s or 2m).
    #[arg(long, env = "NODEGRACE_SHUTDOWN_GRACE_PERIOD")]
    pub shutdown_grace_period: Option<String>,
    /// Overrides shutdownGracePeriodCriticalPods (a duration such as 10s).
    #[arg(long, env = "NODEGRACE_SHUTDOWN_GRACE_PERIOD_CRITICAL_PODS")]
    pub shutdown_grace_period_critical_pods: Option<String>,
    /// Overrides shutdownGracePeriodByPodPriority, as PRIORITY=SECONDS,… (periods in seconds,
    /// e.g. 0=20,2000000000=10).
    #[arg(long, env = "NODEGRACE_SHUTDOWN_GRACE_PERIOD_BY_POD_PRIORITY", value_parser = parse_priorities)]
    pub shutdown_grace_period_by_pod_priority: Option<Priorities>,

    /// Directory of the durable shutdown record.
    #[arg(
        long,
        env = "NODEGRACE_STATE_DIR",
        default_value = "/var/lib/nodegrace"
    )]
    pub state_dir: PathBuf,
    /// Where logind reads drop-ins (/etc/systemd/logind.conf.d for systemd-logind).
    #[arg(
        long,
        env = "NODEGRACE_LOGIND_DROP_IN_DIR",
        default_value = "/etc/systemd/logind.conf.d"
    )]
    pub logind_drop_in_dir: PathBuf,
    /// File name of the drop-in the agent writes.
    #[arg(
        long,
        env = "NODEGRACE_LOGIND_DROP_IN_FILE",
        default_value = "99-nodegrace.conf"
    )]
    pub logind_drop_in_file: String,
    /// How long to wait for logind to apply a raised InhibitDelayMaxSec after the reload (a
    /// duration).
    #[arg(long, env = "NODEGRACE_LOGIND_RELOAD_TIMEOUT", default_value = "10s", value_parser = duration_flag)]
    pub logind_reload_timeout: std::time::Duration,
    /// Identifies the current boot, to tell a crash mid-shutdown from a reboot.
    #[arg(
        long,
        env = "NODEGRACE_BOOT_ID_FILE",
        default_value = "/proc/sys/kernel/random/boot_id"
    )]
    pub boot_id_file: PathBuf,
    /// Requests the shutdown may send at once (a count): its pods' status patches and deletes,
    /// on a client of their own. 0 sizes it from the node: two per pod it can hold
    /// (status.allocatable.pods), plus 10.
    #[arg(long, env = "NODEGRACE_SHUTDOWN_API_BURST", default_value_t = 0)]
    pub shutdown_api_burst: u32,
    /// The agent's own pod, which it never deletes (downward API metadata.name); needs
    /// --pod-namespace.
    #[arg(long, env = "NODEGRACE_POD_NAME", requires = "pod_namespace")]
    pub pod_name: Option<String>,
    /// The agent's own pod's namespace (downward API metadata.namespace); needs --pod-name.
    #[arg(long, env = "NODEGRACE_POD_NAMESPACE", requires = "pod_name")]
    pub pod_namespace: Option<String>,
}

/// The flag form of shutdownGracePeriodByPodPriority (one value holding the whole list).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Priorities(pub Vec<PriorityPeriod>);

fn parse_priorities(text: &str) -> Result<Priorities, String> {
    parse_priority_flag(text).map(Priorities)
}

impl Args {
    /// The file's settings with the flags laid over them.
    pub fn settings(&self) -> Result<ShutdownSettings, crate::config::ConfigError> {
        let file = match &self.config {
            Some(path) => ShutdownSettings::from_file(path)?,
            None => ShutdownSettings::default(),
        };
        Ok(file.overridden_by(ShutdownSettings::from_flags(
            self.shutdown_grace_period.clone(),
            self.shutdown_grace_period_critical_pods.clone(),
            self.shutdown_grace_period_by_pod_priority
                .clone()
                .map(|p| p.0),
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_own_pod_is_given_whole_or_not_at_all() {
        let parse = |extra: &[&str]| {
            Args::try_parse_from(
                ["graceful-shutdown-agent", "--node-name=n"]
                    .iter()
                    .chain(extra),
            )
        };
        let error = parse(&["--pod-name=agent-x"]).unwrap_err().to_string();
        assert!(error.contains("--pod-namespace"), "{error}");
        let error = parse(&["--pod-namespace=kube-system"])
            .unwrap_err()
            .to_string();
        assert!(error.contains("--pod-name"), "{error}");
        let both = parse(&["--pod-name=agent-x", "--pod-namespace=kube-system"]).unwrap();
        assert_eq!(both.pod_name.as_deref(), Some("agent-x"));
        assert!(parse(&[]).is_ok());
    }
}
