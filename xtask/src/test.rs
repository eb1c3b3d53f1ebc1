//! `cargo xtask test`: the one command CI and people run. It installs what the tests need
//! (idempotently), then runs every check a change must pass.

use std::process::Command;

use anyhow::{Result, bail};

use crate::{cargo, helm, project_root, run_command};

pub fn run() -> Result<()> {
    ensure_system_packages()?;
    ensure_nextest()?;
    helm::ensure_helm()?;

    step("format", || {
        run_command(cargo().args(["fmt", "--all", "--", "--check"]))
    })?;
    step("clippy", || {
        run_command(cargo().args([
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ]))
    })?;
    step("docs", || {
        run_command(
            cargo()
                .args(["doc", "--no-deps", "--package", "nodegrace-core"])
                .env("RUSTDOCFLAGS", "-D warnings"),
        )
    })?;
    step("charts", helm::check_charts)?;
    // Unpacking elogind once up front keeps that download out of the first test's time.
    step("provision elogind", || {
        run_command(cargo().args([
            "run",
            "--quiet",
            "--package",
            "logind-harness",
            "--",
            "provision",
        ]))
    })?;
    step("tests", || {
        run_command(cargo().args(["nextest", "run", "--workspace", "--no-fail-fast"]))
    })?;
    step("stray processes", check_no_stray_processes)?;
    Ok(())
}

fn step(name: &str, body: impl FnOnce() -> Result<()>) -> Result<()> {
    println!("==> {name}");
    body().map_err(|e| e.context(format!("step `{name}` failed")))
}

/// Binaries the logind harness and the kubectl tests start. elogind itself is not installed (it
/// would remove systemd); the harness unpacks it under target/.
const SYSTEM_COMMANDS: &[(&str, &str)] = &[
    ("dbus-daemon", "dbus-daemon"),
    ("busctl", "systemd"),
    ("unshare", "util-linux"),
    ("nsenter", "util-linux"),
    ("setpriv", "util-linux"),
    ("dpkg-deb", "dpkg"),
    ("npm", "npm"),
];

fn ensure_system_packages() -> Result<()> {
    let missing: Vec<&str> = SYSTEM_COMMANDS
        .iter()
        .filter(|(command, _)| !on_path(command))
        .map(|(_, package)| *package)
        .collect();
    if !missing.is_empty() {
        run_command(Command::new("apt-get").arg("update").arg("-qq"))?;
        run_command(
            Command::new("apt-get")
                .args(["install", "-y", "-qq", "--no-install-recommends"])
                .args(&missing)
                .env("DEBIAN_FRONTEND", "noninteractive"),
        )?;
    }
    if !on_path("kubectl") {
        println!("warning: kubectl is not on PATH; the kubectl conformance tests will skip");
    }
    Ok(())
}

fn ensure_nextest() -> Result<()> {
    let have = cargo()
        .args(["nextest", "--version"])
        .output()
        .is_ok_and(|out| out.status.success());
    if !have {
        run_command(cargo().args(["install", "cargo-nextest", "--locked"]))?;
    }
    Ok(())
}

fn on_path(command: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {command}")])
        .output()
        .is_ok_and(|out| out.status.success())
}

/// The logind harness promises a clean teardown; a leftover elogind or bus daemon from the
/// suite is a harness bug, so it fails the run.
fn check_no_stray_processes() -> Result<()> {
    let target = project_root().join("target");
    let out = Command::new("ps").args(["-eo", "pid,args"]).output()?;
    let listing = String::from_utf8_lossy(&out.stdout);
    let strays: Vec<&str> = listing
        .lines()
        .filter(|line| line.contains(&*target.to_string_lossy()))
        .filter(|line| line.contains("elogind") || line.contains("dbus-daemon"))
        .collect();
    if strays.is_empty() {
        println!("no stray elogind or dbus-daemon processes");
        Ok(())
    } else {
        bail!(
            "processes left behind by the test suite:\n{}",
            strays.join("\n")
        )
    }
}
