//! The options of a node agent: every program's common ones, the node, and where logind is.

use clap::Args;
use nodegrace_core::cli::{CommonArgs, NodeArgs};

use crate::{LogindSource, SharedLogind};

/// The options of a node agent: the common ones, the node it runs on, and where logind is.
#[derive(Debug, Clone, Args)]
pub struct AgentArgs<const ADMIN_PORT: u16> {
    #[command(flatten)]
    pub common: CommonArgs<ADMIN_PORT>,
    #[command(flatten)]
    pub node: NodeArgs,
    #[command(flatten)]
    pub logind: LogindArgs,
}

/// For the node agents: where logind is.
#[derive(Debug, Clone, Default, Args)]
pub struct LogindArgs {
    /// The system bus, as a D-Bus address (default: $DBUS_SYSTEM_BUS_ADDRESS, else the
    /// standard system bus socket).
    #[arg(long, env = "NODEGRACE_DBUS_ADDRESS")]
    pub dbus_address: Option<String>,
    /// An implementation used instead of the bus; never set from the command line (tests
    /// drive the agents through one).
    #[arg(skip)]
    pub instead_of_bus: Option<SharedLogind>,
}

impl LogindArgs {
    pub fn source(&self) -> LogindSource {
        match &self.instead_of_bus {
            Some(logind) => LogindSource::Given(logind.clone()),
            None => LogindSource::Bus(self.dbus_address.clone()),
        }
    }
}
