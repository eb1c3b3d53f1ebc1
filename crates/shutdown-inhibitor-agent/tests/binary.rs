//! The binary as an operator runs it: its help, its logs in a pipe, its errors.

use std::process::Command;

const BINARY: &str = env!("CARGO_BIN_EXE_shutdown-inhibitor-agent");

#[test]
fn help_shows_the_programs_own_admin_port_and_the_chart_uses_it() {
    let help = Command::new(BINARY).arg("--help").output().unwrap();
    let help = String::from_utf8(help.stdout).unwrap();
    assert!(help.contains("[default: 0.0.0.0:9452]"), "{help}");
    let values = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../charts/shutdown-inhibitor-agent/values.yaml"
    );
    let values = std::fs::read_to_string(values).unwrap();
    assert!(values.contains("\nadminPort: 9452\n"), "{values}");
}

#[test]
fn logs_in_a_pipe_are_plain_and_each_cause_is_printed_once() {
    let output = Command::new(BINARY)
        .args([
            "--node-name=n",
            "--admin-listen=127.0.0.1:0",
            "--kubeconfig=/nonexistent/kubeconfig",
        ])
        .env_remove("NODE_NAME")
        .env("RUST_BACKTRACE", "1")
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8(output.stdout).unwrap(),
        String::from_utf8(output.stderr).unwrap(),
    );
    assert_eq!(output.status.code(), Some(1), "{stdout}{stderr}");
    assert!(stdout.contains("admin server listening"), "{stdout}");
    assert!(
        !stdout.contains('\u{1b}'),
        "colour codes in a pipe: {stdout:?}"
    );
    let error: Vec<&str> = stderr.lines().collect();
    assert_eq!(error.len(), 1, "one line, no backtrace: {stderr}");
    assert!(
        error[0].starts_with("Error: build the Kubernetes client: "),
        "{stderr}"
    );
    assert_eq!(
        error[0].matches("No such file or directory").count(),
        1,
        "{stderr}"
    );
}

#[test]
fn the_config_file_is_read_and_a_bad_field_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.yaml");
    std::fs::write(&config, "shutdownInhibitorAlertTimeout: soon\n").unwrap();
    let output = Command::new(BINARY)
        .args(["--node-name=n", "--admin-listen=127.0.0.1:0"])
        .arg(format!("--config={}", config.display()))
        .env_remove("NODE_NAME")
        .output()
        .unwrap();
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("shutdownInhibitorAlertTimeout: invalid duration \"soon\""),
        "{stderr}"
    );
}
