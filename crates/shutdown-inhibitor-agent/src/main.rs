//! `shutdown-inhibitor-agent`: Turns Leases named after the node into a logind block inhibitor
//!
//! The behaviour lands with its component issue (issue 5); until then the binary accepts the
//! common options, so charts and scripts can be written against them, and says it is not ready.

use anyhow::bail;
use clap::Parser;
use nodegrace_core::cli::{CommonArgs, NodeArgs};

#[derive(Debug, Parser)]
#[command(
    name = "shutdown-inhibitor-agent",
    version,
    about = "Turns Leases named after the node into a logind block inhibitor"
)]
struct Args {
    #[command(flatten)]
    common: CommonArgs,
    #[command(flatten)]
    node: NodeArgs,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    tracing::debug!(?args, "parsed options");
    bail!("shutdown-inhibitor-agent is not implemented in this build yet (issue 5)")
}
