//! The binary as an operator runs it: its help, its environment variables, its logs in a
//! pipe, its errors.

use std::path::Path;
use std::process::Command;

use clap::CommandFactory;
use nodegrace_testing::{
    check_env_follows_flags, check_help_and_chart_port, check_plain_one_line_error,
};
use shutdown_inhibitor_agent::app::PROGRAM;
use shutdown_inhibitor_agent::cli::Args;
use shutdown_inhibitor_agent::metrics::Metrics;

const BINARY: &str = env!("CARGO_BIN_EXE_shutdown-inhibitor-agent");

#[test]
fn help_shows_the_programs_own_admin_port_and_the_chart_uses_it() -> anyhow::Result<()> {
    let values = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../charts/shutdown-inhibitor-agent/values.yaml");
    check_help_and_chart_port(BINARY, 9452, &values)
}

#[test]
fn every_flag_reads_its_nodegrace_variable() -> anyhow::Result<()> {
    check_env_follows_flags(&Args::command())
}

#[test]
fn logs_in_a_pipe_are_plain_and_each_cause_is_printed_once() -> anyhow::Result<()> {
    check_plain_one_line_error(BINARY, &["--node-name=n"])
}

#[test]
fn the_config_file_is_read_and_a_bad_field_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.yaml");
    std::fs::write(&config, "shutdownInhibitorAlertTimeout: soon\n").unwrap();
    let output = Command::new(BINARY)
        .args(["--node-name=n", "--admin-listen=127.0.0.1:0"])
        .arg(format!("--config={}", config.display()))
        .env_remove("NODEGRACE_NODE_NAME")
        .output()
        .unwrap();
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("shutdownInhibitorAlertTimeout: invalid duration \"soon\""),
        "{stderr}"
    );
}

nodegrace_testing::operator_reference_tests!(PROGRAM, Args, Metrics);
