//! Benchmarks live as `harness = false` bench targets next to the code they measure; this
//! module only knows where each one is, so `cargo test` never builds or runs them.

use anyhow::Result;
use clap::Subcommand;

use crate::{cargo, run_command};

#[derive(Debug, Subcommand)]
pub enum Which {
    /// kube-sim: load time, RSS, paginated list latency, watch latency under write load.
    Sim,
    /// graceful-shutdown-agent: release latency, shutdown overhead, RSS, binary size.
    Shutdown,
    /// shutdown-inhibitor-agent: block/unblock latency, unrelated watch events, RSS.
    Inhibitor,
}

pub fn run(which: &Which) -> Result<()> {
    let (package, bench) = match which {
        Which::Sim => ("kube-sim", "sim"),
        Which::Shutdown => ("graceful-shutdown-agent", "shutdown"),
        Which::Inhibitor => ("shutdown-inhibitor-agent", "inhibitor"),
    };
    run_command(cargo().args(["bench", "--package", package, "--bench", bench]))
}
