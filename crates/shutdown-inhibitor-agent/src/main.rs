use std::process::ExitCode;

use clap::Parser;
use nodegrace_core::error_chain::exit_code;
use nodegrace_core::{signals, telemetry};
use shutdown_inhibitor_agent::{app, cli::Args};

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    if let Err(error) = telemetry::init_tracing(&args.common.log) {
        return exit_code::<anyhow::Error>(Err(error.into()));
    }
    let stop = signals::shutdown_token();
    exit_code(app::run(args, stop).await)
}
