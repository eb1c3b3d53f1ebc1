//! Child processes that cannot outlive the demo: each runs under `setpriv --pdeathsig KILL` (so
//! even a killed demo takes them along) in a process group of its own (so stopping one stops
//! what it started).
//!
//! The death signal fires when the *thread* that started the child ends, so children are only
//! started from the demo's main thread (its runtime is single-threaded).

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use anyhow::{Context, Result};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

#[derive(Debug)]
pub struct Guarded {
    child: Child,
}

impl Guarded {
    /// Starts `program` with `args` and extra `env`, stdout and stderr appended to `log`.
    pub fn spawn(
        name: &str,
        program: &Path,
        args: &[String],
        env: &[(String, String)],
        log: &Path,
    ) -> Result<Self> {
        let log_file = || {
            File::options()
                .create(true)
                .append(true)
                .open(log)
                .with_context(|| format!("open {}", log.display()))
        };
        let child = Command::new("setpriv")
            .args(["--pdeathsig", "KILL", "--"])
            .arg(program)
            .args(args)
            .envs(env.iter().map(|(key, value)| (key, value)))
            .stdin(Stdio::null())
            .stdout(log_file()?)
            .stderr(log_file()?)
            .process_group(0)
            .spawn()
            .with_context(|| format!("start {name} (setpriv from util-linux must be installed)"))?;
        Ok(Self { child })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The exit status if the process has ended.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Kills the whole group at once, as pulling the plug would, and reaps the child.
    pub fn kill(&mut self) {
        if let Ok(pid) = i32::try_from(self.child.id()) {
            let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        self.kill();
    }
}
