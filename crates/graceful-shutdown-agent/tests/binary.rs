//! The binary as an operator runs it: its help, its environment variables, its logs in a
//! pipe, its errors.

use std::path::Path;

use clap::CommandFactory;
use graceful_shutdown_agent::app::PROGRAM;
use graceful_shutdown_agent::cli::Args;
use graceful_shutdown_agent::metrics::Metrics;
use nodegrace_testing::{
    check_env_follows_flags, check_help_and_chart_port, check_plain_one_line_error,
};

const BINARY: &str = env!("CARGO_BIN_EXE_graceful-shutdown-agent");

#[test]
fn help_shows_the_programs_own_admin_port_and_the_chart_uses_it() -> anyhow::Result<()> {
    let values = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../charts/graceful-shutdown-agent/values.yaml");
    check_help_and_chart_port(BINARY, 9451, &values)
}

#[test]
fn every_flag_reads_its_nodegrace_variable() -> anyhow::Result<()> {
    check_env_follows_flags(&Args::command())
}

#[test]
fn logs_in_a_pipe_are_plain_and_each_cause_is_printed_once() -> anyhow::Result<()> {
    check_plain_one_line_error(BINARY, &["--node-name=n", "--shutdown-grace-period=10s"])
}

nodegrace_testing::operator_reference_tests!(PROGRAM, Args, Metrics);
