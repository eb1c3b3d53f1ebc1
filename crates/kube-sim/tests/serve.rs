//! `kube-sim serve` as scripts use it: the URL is on stdout before the kubeconfig exists.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common::files;
use files::wait_for_file;

const BINARY: &str = env!("CARGO_BIN_EXE_kube-sim");

#[test]
fn the_url_is_printed_before_the_kubeconfig_is_written() {
    // The kubeconfig cannot be written under /proc: the URL must be out already.
    let output = Command::new(BINARY)
        .args(["serve", "--kubeconfig-out", "/proc/kube-sim/kubeconfig"])
        .stderr(Stdio::null())
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert!(stdout.starts_with("http://127.0.0.1:"), "{stdout:?}");
}

#[test]
fn once_the_kubeconfig_exists_stdout_has_its_url() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    let mut child = Command::new(BINARY)
        .args(["serve", "--kubeconfig-out"])
        .arg(&kubeconfig)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    assert!(
        wait_for_file(&kubeconfig, Duration::from_secs(30)).unwrap(),
        "no kubeconfig after 30 s"
    );
    let mut url = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut url)
        .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    let contents = std::fs::read_to_string(&kubeconfig).unwrap();
    assert!(
        contents.contains(&format!("server: {}", url.trim())),
        "{url:?} not in {contents}"
    );
}

/// The container init of a simulator that ended between the fork and the death signal's setup
/// (its parent is another process by then) must not start the program: nothing would stop it.
#[test]
fn a_container_whose_simulator_is_gone_does_not_start() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");
    let spec = dir.path().join("container.json");
    let launch = serde_json::json!({
        "program": "/bin/sh",
        "args": ["-c", format!("touch {}", marker.display())],
        "env": [],
        "working_dir": null,
        "mounts": [],
    });
    std::fs::write(&spec, launch.to_string()).unwrap();
    let run = |simulator_pid: u32| {
        Command::new(BINARY)
            .arg("run-container")
            .arg(&spec)
            .arg(format!("--simulator-pid={simulator_pid}"))
            .output()
            .unwrap()
    };
    // This test is its parent, not the simulator that asked: it does not run.
    let orphan = run(std::process::id().wrapping_add(1));
    assert_eq!(orphan.status.code(), Some(128));
    let stderr = String::from_utf8_lossy(&orphan.stderr);
    assert!(
        stderr.contains("ended before the container started"),
        "{stderr}"
    );
    assert!(!marker.exists());
    // Started by the process it names: the program runs.
    let started = run(std::process::id());
    assert!(started.status.success(), "{started:?}");
    assert!(marker.exists());
}
