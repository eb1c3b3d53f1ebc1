//! The binary as an operator runs it: its help, its environment variables, its logs in a
//! pipe, its errors.

use std::path::Path;

use clap::CommandFactory;
use graceful_shutdown_agent::cli::Args;
use nodegrace_core::testing::{
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

/// docs/graceful-shutdown-agent.md's flag, chart value and metric tables are generated from the program and its
/// chart; `cargo xtask docs` rewrites them.
#[test]
fn the_docs_reference_is_current() -> anyhow::Result<()> {
    nodegrace_core::testing::reference::check_program_reference(
        &workspace(),
        graceful_shutdown_agent::app::PROGRAM,
        &Args::command(),
        &program_metrics(),
    )
}

#[test]
fn every_dashboard_query_selects_an_exported_metric_and_every_metric_is_shown() -> anyhow::Result<()>
{
    let program = graceful_shutdown_agent::app::PROGRAM;
    let dashboard = workspace().join(format!("charts/{program}/dashboards/{program}.json"));
    nodegrace_core::testing::check_dashboard(&dashboard, &program_metrics())?;
    Ok(())
}

fn program_metrics() -> nodegrace_core::telemetry::ProgramRegistry {
    let mut registry =
        nodegrace_core::telemetry::ProgramRegistry::new(graceful_shutdown_agent::app::PROGRAM);
    graceful_shutdown_agent::metrics::Metrics::register(&mut registry);
    registry
}

fn workspace() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}
