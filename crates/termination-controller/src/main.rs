//! `termination-controller`: Drains and terminates nodes through a finalizer, honouring PodDisruptionBudgets
//!
//! The behaviour lands with its component issue (the termination-controller issue); until then the binary accepts the
//! common options, so charts and scripts can be written against them, and says it is not ready.

use anyhow::bail;
use clap::Parser;
use nodegrace_core::cli::{CommonArgs, ports};

#[derive(Debug, Parser)]
#[command(
    name = "termination-controller",
    version,
    about = "Drains and terminates nodes through a finalizer, honouring PodDisruptionBudgets"
)]
struct Args {
    #[command(flatten)]
    common: CommonArgs<{ ports::TERMINATION_CONTROLLER }>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    tracing::debug!(?args, "parsed options");
    bail!(
        "termination-controller is not implemented in this build yet (the termination-controller issue)"
    )
}
