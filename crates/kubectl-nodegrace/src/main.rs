use std::process::ExitCode;

use clap::Parser;
use kubectl_nodegrace::cli::Cli;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("Error: start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(kubectl_nodegrace::app::run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("Error: {error:#}");
            ExitCode::FAILURE
        }
    }
}
