use std::process::ExitCode;

use shutdown_inhibitor_agent::{app, cli::Args};

fn main() -> ExitCode {
    nodegrace_core::program::main(|args: &Args| &args.agent.common.log, app::run)
}
