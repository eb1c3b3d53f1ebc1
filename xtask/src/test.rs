//! `cargo xtask test`: the one command CI and people run. It installs what the tests need
//! (idempotently), then runs every check a change must pass.

use std::process::Command;

use anyhow::{Result, bail};

use crate::{
    actionlint, cargo, disk, e2e, explore, helm, image, peer_tests, run_command, setup, target_dir,
};

pub fn run() -> Result<()> {
    disk::ensure_room_for_a_test_run()?;
    setup::ensure_system_packages()?;
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
    step("workflows", actionlint::check_workflows)?;
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
    step("peer tests", peer_tests::run)?;
    // The README's first command is the e2e's story with all four charts; e2e adds each chart
    // alone and the least-privilege proof, against the release binaries.
    step("e2e", || e2e::run(&e2e::E2eArgs::default()))?;
    // Random histories of the seeds on record, against the same release binaries.
    step("explore", explore::fixed_seeds)?;
    // The e2e just built and ran these release binaries: the images carry exactly them.
    step("images", || {
        let built = image::build_all(&image::PROGRAMS)?;
        image::check_all(&built)
    })?;
    step("stray processes", check_no_stray_processes)?;
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

fn step(name: &str, body: impl FnOnce() -> Result<()>) -> Result<()> {
    println!("==> {name}");
    body().map_err(|e| e.context(format!("step `{name}` failed")))
}

/// The logind harness and the demo promise a clean teardown; a leftover elogind, bus daemon,
/// cluster or agent from the suite is a bug, so it fails the run.
fn check_no_stray_processes() -> Result<()> {
    const OURS: [&str; 9] = [
        "elogind",
        "dbus-daemon",
        "kube-sim",
        "graceful-shutdown-agent",
        "shutdown-inhibitor-agent",
        "out-of-service-gc",
        "termination-controller",
        "nodegrace-demo",
        "nodegrace-explore",
    ];
    let target = target_dir();
    let out = Command::new("ps").args(["-eo", "pid,args"]).output()?;
    let listing = String::from_utf8_lossy(&out.stdout);
    let strays: Vec<&str> = listing
        .lines()
        .filter(|line| line.contains(&*target.to_string_lossy()))
        .filter(|line| OURS.iter().any(|name| line.contains(name)))
        .collect();
    if strays.is_empty() {
        println!("no stray processes");
        Ok(())
    } else {
        bail!(
            "processes left behind by the test suite:\n{}",
            strays.join("\n")
        )
    }
}
