//! `out-of-service-gc`: Force-deletes pods and detaches volumes of out-of-service nodes (KEP-2268).
//!
//! The behaviour lands with its component issue; until then the binary accepts its options
//! (the common ones and leader election), so charts and scripts can be written against them,
//! and stops with a clear message.

use std::process::ExitCode;

use anyhow::bail;
use clap::Parser;
use nodegrace_core::cli::{CommonArgs, LeaderArgs, ports};
use tokio_util::sync::CancellationToken;

const PROGRAM: &str = "out-of-service-gc";

#[derive(Debug, Parser)]
#[command(
    name = "out-of-service-gc",
    version,
    about = "Force-deletes pods and detaches volumes of out-of-service nodes (KEP-2268)"
)]
struct Args {
    #[command(flatten)]
    common: CommonArgs<{ ports::OUT_OF_SERVICE_GC }>,
    #[command(flatten)]
    leader: LeaderArgs,
}

async fn run(args: Args, _stop: CancellationToken) -> anyhow::Result<()> {
    let election = args.leader.config(PROGRAM);
    tracing::debug!(?args, ?election, "parsed options");
    bail!("{PROGRAM} is not implemented in this build yet (its component issue)")
}

fn main() -> ExitCode {
    nodegrace_core::program::main(|args: &Args| &args.common.log, run)
}
