//! Options every nodegrace program shares, as flattened clap structs.
//!
//! Every flag also reads one environment variable, named by one rule for all programs:
//! `NODEGRACE_` and the flag's name in upper snake case (`--api-qps` ← `NODEGRACE_API_QPS`).
//! No other variable sets a flag; standard ones keep their usual meaning where a library reads
//! them (`KUBECONFIG` without `--kubeconfig`, `DBUS_SYSTEM_BUS_ADDRESS` without
//! `--dbus-address`).

use std::net::SocketAddr;
use std::time::Duration;

use clap::{Args, ValueEnum};

use crate::duration::parse_go_duration;
// The kube flags live with the client they build; every program still takes them from here.
pub use crate::k8s::client::KubeArgs;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, Args)]
pub struct LogArgs {
    /// Log format: text for people, json for a log pipeline
    #[arg(long, env = "NODEGRACE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Level or filter, in tracing's EnvFilter syntax (e.g. `info`, `debug,kube=info`).
    #[arg(long, env = "NODEGRACE_LOG_LEVEL", default_value = "info")]
    pub log_level: String,
}

/// The admin server's address. Each program has its own default port (see [`ports`]), so any
/// combination of them can share a host network namespace.
#[derive(Debug, Clone, Args)]
pub struct AdminArgs<const PORT: u16> {
    /// Address of the admin server (/metrics, /livez, /readyz); the default `[::]` takes IPv6
    /// and IPv4 (dual-stack).
    #[arg(long, env = "NODEGRACE_ADMIN_LISTEN", default_value_t = SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, PORT)))]
    pub admin_listen: SocketAddr,
}

/// Default admin ports, one per program. The charts use the same numbers.
pub mod ports {
    pub const GRACEFUL_SHUTDOWN_AGENT: u16 = 9451;
    pub const SHUTDOWN_INHIBITOR_AGENT: u16 = 9452;
    pub const OUT_OF_SERVICE_GC: u16 = 9453;
    pub const TERMINATION_CONTROLLER: u16 = 9454;
}

/// For the node agents: which node they act for.
#[derive(Debug, Clone, Args)]
pub struct NodeArgs {
    /// This node's name; in a DaemonSet, set NODEGRACE_NODE_NAME from the downward API
    /// (spec.nodeName).
    #[arg(long, env = "NODEGRACE_NODE_NAME", value_parser = non_empty)]
    pub node_name: String,
}

/// The options of every program; `ADMIN_PORT` is the program's default admin port.
#[derive(Debug, Clone, Args)]
pub struct CommonArgs<const ADMIN_PORT: u16> {
    #[command(flatten)]
    pub kube: KubeArgs,
    #[command(flatten)]
    pub log: LogArgs,
    #[command(flatten)]
    pub admin: AdminArgs<ADMIN_PORT>,
}

/// A clap value parser for duration flags in Go's syntax (`30s`, `2m`, `1h30m`).
pub fn duration_flag(text: &str) -> Result<Duration, String> {
    parse_go_duration(text).map_err(|error| error.to_string())
}

fn non_empty(value: &str) -> Result<String, String> {
    if value.trim().is_empty() {
        Err("must not be empty; set it to this node's name (downward API spec.nodeName)".to_owned())
    } else {
        Ok(value.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Agent {
        #[command(flatten)]
        common: CommonArgs<9999>,
        #[command(flatten)]
        node: NodeArgs,
    }

    #[test]
    fn defaults_are_production_values() {
        let agent = Agent::try_parse_from(["agent", "--node-name", "n1"]).unwrap();
        assert_eq!(agent.node.node_name, "n1");
        assert!((agent.common.kube.api_qps - 20.0).abs() < f64::EPSILON);
        assert_eq!(agent.common.kube.api_burst, 40);
        assert_eq!(agent.common.log.log_format, LogFormat::Text);
        assert_eq!(agent.common.admin.admin_listen.port(), 9999);
    }

    #[test]
    fn missing_node_name_is_a_clear_error() {
        // The variable may be set in the test environment; only parse when it is not.
        if std::env::var_os("NODEGRACE_NODE_NAME").is_some() {
            return;
        }
        let error = Agent::try_parse_from(["agent"]).unwrap_err().to_string();
        assert!(error.contains("--node-name"), "{error}");
        let empty = Agent::try_parse_from(["agent", "--node-name", " "])
            .unwrap_err()
            .to_string();
        assert!(empty.contains("spec.nodeName"), "{empty}");
    }

    #[test]
    fn bad_values_name_the_flag() {
        let error = Agent::try_parse_from(["agent", "--node-name", "n", "--log-format", "xml"])
            .unwrap_err()
            .to_string();
        assert!(error.contains("--log-format"), "{error}");
        let error = Agent::try_parse_from(["agent", "--node-name", "n", "--admin-listen", "nope"])
            .unwrap_err()
            .to_string();
        assert!(error.contains("--admin-listen"), "{error}");
    }
}
