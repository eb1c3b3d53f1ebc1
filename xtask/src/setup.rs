//! What the tasks need from the machine, installed when missing (idempotently).

use std::process::Command;

use anyhow::{Result, bail};

use crate::run_command;

/// Binaries the logind harness and the kubectl tests start. elogind itself is not installed (it
/// would remove systemd); the harness unpacks it under target/.
const SYSTEM_COMMANDS: &[(&str, &str)] = &[
    ("dbus-daemon", "dbus-daemon"),
    ("busctl", "systemd"),
    ("systemd-inhibit", "systemd"),
    ("unshare", "util-linux"),
    ("nsenter", "util-linux"),
    ("setpriv", "util-linux"),
    ("dpkg-deb", "dpkg"),
    ("npm", "npm"),
    // An independent reader of our OCI images: `cargo xtask image --check` verifies with it.
    ("skopeo", "skopeo"),
    // The reference Redfish client the redfish provider's tests check their readings against.
    ("fence_redfish", "fence-agents"),
];

pub fn ensure_system_packages() -> Result<()> {
    let missing: Vec<&str> = SYSTEM_COMMANDS
        .iter()
        .filter(|(command, _)| !on_path(command))
        .map(|(_, package)| *package)
        .collect();
    if !missing.is_empty() {
        install_packages(&missing)?;
    }
    ensure_python_packages()?;
    if !on_path("kubectl") {
        println!("warning: kubectl is not on PATH; the kubectl conformance tests will skip");
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
