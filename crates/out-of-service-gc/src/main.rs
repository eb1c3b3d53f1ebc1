//! `out-of-service-gc`: Force-deletes pods and detaches volumes of out-of-service nodes (KEP-2268)
//!
//! The behaviour lands with its component issue (the out-of-service-gc issue); until then the binary accepts the
//! common options, so charts and scripts can be written against them, and says it is not ready.

use anyhow::bail;
use clap::Parser;
use nodegrace_core::cli::{CommonArgs, ports};

#[derive(Debug, Parser)]
#[command(
    name = "out-of-service-gc",
    version,
    about = "Force-deletes pods and detaches volumes of out-of-service nodes (KEP-2268)"
)]
struct Args {
    #[command(flatten)]
    common: CommonArgs<{ ports::OUT_OF_SERVICE_GC }>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    tracing::debug!(?args, "parsed options");
    bail!("out-of-service-gc is not implemented in this build yet (the out-of-service-gc issue)")
}
