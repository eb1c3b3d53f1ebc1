use std::process::ExitCode;

use termination_controller::{app, cli::Args};

fn main() -> ExitCode {
    nodegrace_core::program::main(|args: &Args| &args.controller.common.log, app::run)
}
