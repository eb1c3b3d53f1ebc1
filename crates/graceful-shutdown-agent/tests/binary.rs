//! The binary as an operator runs it: its help, its environment variables, its logs in a
//! pipe, its errors.

use graceful_shutdown_agent::app::PROGRAM;
use graceful_shutdown_agent::cli::Args;
use graceful_shutdown_agent::metrics::Metrics;

const BINARY: &str = env!("CARGO_BIN_EXE_graceful-shutdown-agent");

nodegrace_testing::operator_checks! {
    program: PROGRAM,
    binary: BINARY,
    args: Args,
    metrics: Metrics,
    admin_port: nodegrace_core::cli::ports::GRACEFUL_SHUTDOWN_AGENT,
    error_args: &["--node-name=n", "--shutdown-grace-period=10s"],
}
