use anyhow::Result;
use clap::Parser;
use nodegrace_core::{signals, telemetry};
use shutdown_inhibitor_agent::{app, cli::Args};

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    telemetry::init_tracing(&args.common.log)?;
    let stop = signals::shutdown_token();
    app::run(args, stop).await
}
