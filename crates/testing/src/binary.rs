//! Checks of a program's binary, run the way an operator runs it.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, ensure};

/// `--help` shows the program's own default admin port, and its chart uses the same.
pub fn check_help_and_chart_port(binary: &str, port: u16, chart_values: &Path) -> Result<()> {
    let help = Command::new(binary).arg("--help").output()?;
    let help = String::from_utf8(help.stdout)?;
    ensure!(help.contains(&format!("[default: [::]:{port}]")), "{help}");
    let values = std::fs::read_to_string(chart_values)
        .with_context(|| format!("read {}", chart_values.display()))?;
    ensure!(
        values.contains(&format!("\nadminPort: {port}\n")),
        "{values}"
    );
    Ok(())
}

/// Started with `args` and a kubeconfig that does not exist, the program logs plain text to
/// a pipe (no colour codes), then exits 1 with one line on stderr: the error and each of its
/// causes once, no backtrace even with RUST_BACKTRACE set.
pub fn check_plain_one_line_error(binary: &str, args: &[&str]) -> Result<()> {
    let output = Command::new(binary)
        .args(args)
        .arg("--admin-listen=127.0.0.1:0")
        .arg("--kubeconfig=/nonexistent/kubeconfig")
        .env_remove("NODEGRACE_NODE_NAME")
        .env("RUST_BACKTRACE", "1")
        .output()?;
    let (stdout, stderr) = (
        String::from_utf8(output.stdout)?,
        String::from_utf8(output.stderr)?,
    );
    ensure!(output.status.code() == Some(1), "{stdout}{stderr}");
    ensure!(stdout.contains("admin server listening"), "{stdout}");
    ensure!(
        !stdout.contains('\u{1b}'),
        "colour codes in a pipe: {stdout:?}"
    );
    let error: Vec<&str> = stderr.lines().collect();
    ensure!(error.len() == 1, "one line, no backtrace: {stderr}");
    ensure!(
        error[0].starts_with("Error: build the Kubernetes client: "),
        "{stderr}"
    );
    ensure!(
        error[0].matches("No such file or directory").count() == 1,
        "{stderr}"
    );
    Ok(())
}

/// Every flag reads `NODEGRACE_<FLAG>` (upper snake case), and no other variable; a flag's
/// help mentions its unit where it has one (durations, rates).
pub fn check_env_follows_flags(command: &clap::Command) -> Result<()> {
    for argument in command.get_arguments() {
        let Some(long) = argument.get_long() else {
            continue;
        };
        if matches!(long, "help" | "version") {
            continue;
        }
        let wanted = format!("NODEGRACE_{}", long.to_uppercase().replace('-', "_"));
        let env = argument
            .get_env()
            .map(|env| env.to_string_lossy().into_owned());
        ensure!(
            env.as_deref() == Some(wanted.as_str()),
            "--{long} reads {env:?}, not {wanted}"
        );
    }
    for subcommand in command.get_subcommands() {
        check_env_follows_flags(subcommand)?;
    }
    Ok(())
}

/// `--help` states each of `expected` (defaults, flags) that the docs promise.
pub fn check_help_states(binary: &str, expected: &[&str]) -> Result<()> {
    let help = String::from_utf8(Command::new(binary).arg("--help").output()?.stdout)?;
    for wanted in expected {
        ensure!(help.contains(wanted), "{wanted} missing from:\n{help}");
    }
    Ok(())
}
