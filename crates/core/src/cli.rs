//! Options every nodegrace program shares, as flattened clap structs. Every flag also reads an
//! environment variable, so a chart can set it either way.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, ValueEnum};

/// How to reach the API server, and how hard to use it.
#[derive(Debug, Clone, Args)]
pub struct KubeArgs {
    /// Kubeconfig file. Without it: $KUBECONFIG or ~/.kube/config, else the in-cluster config.
    #[arg(long, env = "NODEGRACE_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Kubeconfig context (default: the file's current context).
    #[arg(long, env = "NODEGRACE_CONTEXT")]
    pub context: Option<String>,
    /// Sustained API requests per second.
    #[arg(long, env = "API_QPS", default_value_t = 20.0)]
    pub api_qps: f64,
    /// Requests allowed at once above the sustained rate.
    #[arg(long, env = "API_BURST", default_value_t = 40)]
    pub api_burst: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, Args)]
pub struct LogArgs {
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Level or filter, in tracing's EnvFilter syntax (e.g. `info`, `debug,kube=info`).
    #[arg(long, env = "LOG_LEVEL", default_value = "info")]
    pub log_level: String,
}

/// The admin server's address. Each program has its own default port (see [`ports`]), so any
/// combination of them can share a host network namespace.
#[derive(Debug, Clone, Args)]
pub struct AdminArgs<const PORT: u16> {
    /// Address of the admin server (/metrics, /livez, /readyz).
    #[arg(long, env = "ADMIN_LISTEN", default_value_t = SocketAddr::from(([0, 0, 0, 0], PORT)))]
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
    /// This node's name; in a DaemonSet, set NODE_NAME from the downward API (spec.nodeName).
    #[arg(long, env = "NODE_NAME", value_parser = non_empty)]
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
        // NODE_NAME may be set in the test environment; only parse when it is not.
        if std::env::var_os("NODE_NAME").is_some() {
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
