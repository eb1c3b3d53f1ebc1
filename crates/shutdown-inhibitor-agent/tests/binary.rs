//! The binary as an operator runs it: its help, its environment variables, its logs in a
//! pipe, its errors.

use std::process::Command;

use shutdown_inhibitor_agent::app::PROGRAM;
use shutdown_inhibitor_agent::cli::Args;
use shutdown_inhibitor_agent::metrics::Metrics;

const BINARY: &str = env!("CARGO_BIN_EXE_shutdown-inhibitor-agent");

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

nodegrace_testing::operator_checks! {
    program: PROGRAM,
    binary: BINARY,
    args: Args,
    metrics: Metrics,
    admin_port: nodegrace_core::cli::ports::SHUTDOWN_INHIBITOR_AGENT,
    error_args: &["--node-name=n"],
}
