use anyhow::Result;
use clap::Parser;
use graceful_shutdown_agent::{app, cli::Args};
use nodegrace_core::{signals, telemetry};

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    telemetry::init_tracing(&args.common.log)?;
    let stop = signals::shutdown_token();
    app::run(args, stop).await
}
