use std::process::ExitCode;

use graceful_shutdown_agent::{app, cli::Args};

fn main() -> ExitCode {
    nodegrace_core::program::main(|args: &Args| &args.agent.common.log, app::run)
}
