//! The demo binary judged from outside: a broken agent fails the act it breaks, and an
//! interrupted demo leaves no process behind. The programs are this build's binaries next to
//! the demo's (`cargo nextest run --workspace` builds them all).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use logind_harness::{SkipDecision, ci_is_set, skip_decision, skip_reason};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

const DEMO: &str = env!("CARGO_BIN_EXE_nodegrace-demo");

fn bin_dir() -> PathBuf {
    Path::new(DEMO).parent().unwrap().to_path_buf()
}

/// Whether the real-logind demo can run here (root); in CI it must.
fn can_run() -> bool {
    match skip_decision(skip_reason(), ci_is_set()) {
        SkipDecision::Run => true,
        SkipDecision::Skip(reason) => {
            eprintln!("SKIPPED (real logind unavailable): {reason}");
            false
        }
        SkipDecision::Fail(reason) => panic!("the demo must run in CI: {reason}"),
    }
}

fn demo(work_dir: &Path) -> Command {
    let mut command = Command::new(DEMO);
    command
        .arg("--bin-dir")
        .arg(bin_dir())
        .arg("--work-dir")
        .arg(work_dir);
    command
}

/// Processes that mention `needle` in their command line or environment.
fn processes_mentioning(needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let pid = entry.file_name().to_string_lossy().into_owned();
        if !pid.chars().all(|c| c.is_ascii_digit()) {
            continue;
        }
        for file in ["cmdline", "environ"] {
            let bytes = std::fs::read(entry.path().join(file)).unwrap_or_default();
            let text = String::from_utf8_lossy(&bytes).replace('\0', " ");
            if text.contains(needle) {
                found.push(format!("{pid}: {text}"));
                break;
            }
        }
    }
    found
}

#[test]
fn an_agent_that_never_releases_its_lock_fails_the_shutdown_act() {
    if !can_run() {
        return;
    }
    let scratch = tempfile::tempdir().unwrap();
    // The real agent, plus a second delay lock that is never released: to logind this is an
    // agent that keeps holding the shutdown after its pods are gone.
    let broken = scratch.path().join("broken-agent");
    std::fs::write(
        &broken,
        format!(
            "#!/bin/sh\n\
             systemd-inhibit --what=shutdown --mode=delay --who=broken --why='never releases' sleep 600 &\n\
             exec {} \"$@\"\n",
            bin_dir().join("graceful-shutdown-agent").display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&broken, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let work_dir = scratch.path().join("demo");
    let output = demo(&work_dir)
        .args(["--act", "priority-shutdown", "--image-binary"])
        .arg(format!("graceful-shutdown-agent={}", broken.display()))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        output.status.code(),
        Some(1),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        stdout.contains("FAILED act 2 (priority-shutdown): logind went ahead only when its"),
        "{stdout}"
    );
    assert!(
        stdout.contains("the agent never released its lock"),
        "{stdout}"
    );
    assert!(
        stdout.contains("Act `priority-shutdown` failed"),
        "{stdout}"
    );
    let left = processes_mentioning(&work_dir.display().to_string());
    assert!(left.is_empty(), "left behind: {left:#?}");
}

/// Waits until each process (`"<pid>: <command>"` or `"<pid>"`) has ended, woken by its pidfd,
/// or until `deadline`.
fn wait_for_exits(processes: &[String], deadline: Instant) {
    for process in processes {
        let Some(pid) = process
            .split(':')
            .next()
            .and_then(|pid| pid.trim().parse::<i32>().ok())
            .and_then(rustix::process::Pid::from_raw)
        else {
            continue;
        };
        // No pidfd: the process is gone already.
        let Ok(pidfd) = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty())
        else {
            continue;
        };
        let left = deadline.saturating_duration_since(Instant::now());
        let Ok(timeout) = rustix::event::Timespec::try_from(left) else {
            continue;
        };
        let mut ended = [rustix::event::PollFd::new(
            &pidfd,
            rustix::event::PollFlags::IN,
        )];
        // A timeout or an error leaves the process to the check that follows.
        let _ = rustix::event::poll(&mut ended, Some(&timeout));
    }
}

/// Whether process `pid` exists and has not ended: a zombie has ended, and waits only for
/// whoever inherited it to reap it.
fn has_not_ended(pid: &str) -> bool {
    std::fs::read_to_string(Path::new("/proc").join(pid).join("stat"))
        .ok()
        .and_then(|stat| {
            let state = stat
                .rsplit_once(')')?
                .1
                .split_whitespace()
                .next()?
                .to_owned();
            Some(state != "Z" && state != "X")
        })
        .unwrap_or(false)
}

/// The pids of the processes whose parent is `parent`.
fn children_of(parent: &str) -> Vec<String> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|entry| {
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            // pid (comm) state ppid …: the command may hold spaces, the last ')' ends it.
            let ppid = stat.rsplit_once(')')?.1.split_whitespace().nth(1)?;
            (ppid == parent).then(|| entry.file_name().to_string_lossy().into_owned())
        })
        .collect()
}

/// A demo started by a test; a failing test kills it (its children die with it).
struct Running(std::process::Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_kept_cluster_answers_the_printed_commands_and_ctrl_c_stops_everything() {
    if !can_run() {
        return;
    }
    let scratch = tempfile::tempdir().unwrap();
    let work_dir = scratch.path().join("demo");
    let mut running = Running(
        demo(&work_dir)
            .arg("--keep")
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let child = &mut running.0;
    let mut transcript = String::new();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let kubeconfig = loop {
        let line = lines
            .next()
            .expect("the demo ended before offering the cluster")
            .unwrap();
        transcript.push_str(&line);
        transcript.push('\n');
        if let Some(path) = line.trim().strip_prefix("export KUBECONFIG=") {
            break PathBuf::from(path);
        }
    };
    assert!(transcript.contains("All 6 acts passed"), "{transcript}");

    // Every command the timeline offers works on the kept cluster, as a user would type it
    // (logind commands only while their machine is still on).
    let kubectl = Command::new("kubectl")
        .arg("version")
        .arg("--client")
        .output()
        .is_ok();
    let mut ran = 0;
    for command in transcript
        .lines()
        .filter_map(|line| line.trim().strip_prefix("$ "))
    {
        let bus_gone = command
            .split_once("unix:path=")
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|socket| !Path::new(socket).exists());
        if bus_gone || (command.starts_with("kubectl") && !kubectl) {
            continue;
        }
        // `kubectl nodegrace` finds the plugin on PATH, where an operator installs it.
        let path = std::env::join_paths(std::iter::once(bin_dir()).chain(std::env::split_paths(
            &std::env::var_os("PATH").unwrap_or_default(),
        )))
        .unwrap();
        let output = Command::new("sh")
            .args(["-c", command])
            .env("KUBECONFIG", &kubeconfig)
            .env("PATH", path)
            .output()
            .unwrap();
        assert!(
            output.status.success() && !output.stdout.is_empty(),
            "`{command}`: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        ran += 1;
    }
    assert!(ran >= 3 || !kubectl, "ran {ran} commands of:\n{transcript}");

    let started = processes_mentioning(&work_dir.display().to_string());
    let kube_sim = started
        .iter()
        .find(|process| process.contains("kube-sim serve"))
        .and_then(|process| process.split(':').next())
        .unwrap_or_else(|| panic!("no kube-sim among {started:#?}"))
        .to_owned();
    // Our pods' processes, which kube-sim's kubelets started.
    let pods = children_of(&kube_sim);
    assert!(
        pods.len() >= 7,
        "the agents of node-0 and node-1, out-of-service-gc, two termination-controllers: {pods:#?}"
    );
    let scenarios = format!("logind-scenarios/{}-", child.id());
    let machines = processes_mentioning(&scenarios);
    assert!(
        machines.len() >= 4,
        "two elogind (node-1 booted again in act 4, node-2 and node-3 terminated in acts 4 and 6) and their buses: {machines:#?}"
    );

    kill(Pid::from_raw(child.id() as i32), Signal::SIGINT).unwrap();
    // Ctrl-C is how a kept demo ends: its acts passed, so it exits 0.
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0));
    let still_there = || -> Vec<String> {
        processes_mentioning(&work_dir.display().to_string())
            .into_iter()
            .chain(processes_mentioning(&scenarios))
            .chain(pods.iter().filter(|pid| has_not_ended(pid)).cloned())
            .collect()
    };
    // Killed processes that were not the demo's children end on their own time (a death
    // signal, a PID namespace torn down): wait for each, then look once more.
    wait_for_exits(&still_there(), Instant::now() + Duration::from_secs(10));
    let left = still_there();
    assert!(left.is_empty(), "left behind: {left:#?}");
}

#[test]
fn without_root_it_says_in_one_line_what_to_run() {
    let mut command = if nix::unistd::geteuid().is_root() {
        let mut as_nobody = Command::new("setpriv");
        as_nobody.args(["--reuid=65534", "--regid=65534", "--clear-groups", DEMO]);
        as_nobody
    } else {
        Command::new(DEMO)
    };
    let output = command.output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("Error: the demo needs root")
            && stderr.contains("Run: sudo -E env PATH=\"$PATH\" cargo xtask demo"),
        "{stderr}"
    );
    assert!(output.stdout.is_empty());
}
