use std::process::ExitCode;

use out_of_service_gc::{app, cli::Args};

fn main() -> ExitCode {
    nodegrace_core::program::main(|args: &Args| &args.controller.common.log, app::run)
}
