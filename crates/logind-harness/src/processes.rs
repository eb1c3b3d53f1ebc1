//! The two processes of a scenario. Both are started so that they die with the test process
//! even if it is killed (`setpriv --pdeathsig`), except in detached mode where outliving the
//! starter is the point.

use std::fs::File;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::HarnessError;
use crate::provision::Elogind;
use crate::scenario::ScenarioDir;

/// Processes left running by [`crate::LogindHarness::detach`].
#[derive(Debug, Clone)]
pub struct Detached {
    pub bus_address: String,
    pub scenario_dir: PathBuf,
    pub pids: Vec<u32>,
}

impl Detached {
    /// Stops detached processes by PID (elogind's namespace first, then the bus).
    pub fn stop(pids: &[u32]) {
        for pid in pids {
            if let Ok(pid) = i32::try_from(*pid) {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
        }
    }
}

#[derive(Debug)]
pub struct BusDaemon(Child);

impl BusDaemon {
    pub fn start(scenario: &ScenarioDir, detached: bool) -> Result<Self, HarnessError> {
        let mut command = guarded(detached, "dbus-daemon");
        command
            .arg(format!(
                "--config-file={}",
                scenario.dbus_config().display()
            ))
            .args(["--nofork", "--nopidfile"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file(scenario.root().join("dbus.log"))?);
        command
            .spawn()
            .map(Self)
            .map_err(HarnessError::io("start dbus-daemon"))
    }

    pub fn stop(mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }

    pub fn leak(self) -> u32 {
        self.0.id()
    }
}

/// `unshare` running elogind as PID 1 of a fresh PID namespace. `--kill-child` ties elogind's
/// life to unshare's, and the PID namespace takes anything elogind started with it.
#[derive(Debug)]
pub struct ElogindProcess(Child);

/// Inside the namespace: give elogind the scenario's config as /etc/elogind and the scenario's
/// runtime directory as /run/systemd (kept across restarts, like the host's /run), then become
/// elogind.
const NAMESPACE_SETUP: &str = "mkdir -p /etc/elogind /run/systemd \
    && mount --bind \"$1\" /etc/elogind \
    && mount --bind \"$3\" /run/systemd \
    && exec \"$2\"";

impl ElogindProcess {
    pub fn start(
        elogind: &Elogind,
        scenario: &ScenarioDir,
        bus_address: &str,
        detached: bool,
    ) -> Result<Self, HarnessError> {
        let mut command = guarded(detached, "unshare");
        command
            .args([
                "--pid",
                "--fork",
                "--kill-child",
                "--mount",
                "--mount-proc",
                "--propagation",
                "private",
                "sh",
                "-c",
                NAMESPACE_SETUP,
                "sh",
            ])
            .arg(scenario.etc())
            .arg(elogind.daemon())
            .arg(scenario.run_systemd())
            .env("DBUS_SYSTEM_BUS_ADDRESS", bus_address)
            .env("LD_LIBRARY_PATH", elogind.library_path())
            .stdin(Stdio::null())
            .stdout(log_file(scenario.elogind_log())?)
            .stderr(log_file(scenario.elogind_log())?);
        command
            .spawn()
            .map(Self)
            .map_err(HarnessError::io("start elogind under unshare"))
    }

    pub fn stop(mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }

    pub fn leak(self) -> u32 {
        self.0.id()
    }
}

/// A command that dies with its parent unless the scenario is detached.
fn guarded(detached: bool, program: &str) -> Command {
    if detached {
        Command::new(program)
    } else {
        let mut command = Command::new("setpriv");
        command.args(["--pdeathsig", "KILL", "--", program]);
        command
    }
}

fn log_file(path: PathBuf) -> Result<File, HarnessError> {
    File::options()
        .create(true)
        .append(true)
        .open(path)
        .map_err(HarnessError::io("open a scenario log"))
}
