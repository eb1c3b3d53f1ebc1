//! Making logind allow the delay an agent needs (`InhibitDelayMaxSec`).
//!
//! logind caps how long a delay inhibitor may hold up shutdown; the default (5 s) is far below
//! what pods need. We raise it the way an operator would: a drop-in file plus a reload. logind
//! may still report less (another drop-in sorts later, or the reload did not take), so the
//! caller gets the effective value and runs with that rather than failing.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::{Logind, LogindError};

/// Where and how the drop-in is written, and how long to wait for logind to pick it up.
#[derive(Debug, Clone)]
pub struct DelayConfig {
    /// `/etc/systemd/logind.conf.d` for systemd-logind; elogind reads `/etc/elogind/logind.conf.d`.
    pub drop_in_dir: PathBuf,
    pub file_name: String,
    /// How long to keep re-reading `InhibitDelayMaxUSec` after the reload signal.
    pub reload_timeout: Duration,
}

impl Default for DelayConfig {
    fn default() -> Self {
        Self {
            drop_in_dir: PathBuf::from("/etc/systemd/logind.conf.d"),
            file_name: "99-nodegrace.conf".to_owned(),
            reload_timeout: Duration::from_secs(10),
        }
    }
}

/// What [`ensure_inhibit_delay`] found and did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DelayOutcome {
    pub wanted: Duration,
    /// `InhibitDelayMaxUSec` as logind reports it at the end.
    pub reported: Duration,
    /// `min(wanted, reported)`: the budget the caller can count on.
    pub effective: Duration,
    /// Whether a drop-in was written (and logind asked to reload).
    pub drop_in_written: bool,
}

impl DelayOutcome {
    fn new(wanted: Duration, reported: Duration, drop_in_written: bool) -> Self {
        Self {
            wanted,
            reported,
            effective: wanted.min(reported),
            drop_in_written,
        }
    }

    /// True when logind grants less than was wanted.
    pub fn is_reduced(&self) -> bool {
        self.effective < self.wanted
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DelayError {
    #[error(transparent)]
    Logind(#[from] LogindError),
    #[error(
        "cannot write the logind drop-in {path}: {source} \
         (mount the host's logind.conf.d writable, or set the drop-in directory)"
    )]
    WriteDropIn {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "cannot signal logind (pid {pid}) to reload: {source} \
         (the agent needs the host PID namespace and CAP_KILL)"
    )]
    Reload {
        pid: u32,
        #[source]
        source: nix::Error,
    },
}

/// Ensures logind allows delay inhibitors at least `wanted`, writing a drop-in and reloading
/// logind when it does not, and returns the delay in effect.
pub async fn ensure_inhibit_delay(
    logind: &Logind,
    wanted: Duration,
    config: &DelayConfig,
) -> Result<DelayOutcome, DelayError> {
    let before = logind.inhibit_delay_max().await?;
    if before >= wanted {
        return Ok(DelayOutcome::new(wanted, before, false));
    }
    let path = config.drop_in_dir.join(&config.file_name);
    write_atomically(&path, &drop_in_contents(wanted))
        .map_err(|source| DelayError::WriteDropIn { path, source })?;
    let pid = logind.owner_pid().await?;
    let target = Pid::from_raw(i32::try_from(pid).unwrap_or(i32::MAX));
    kill(target, Signal::SIGHUP).map_err(|source| DelayError::Reload { pid, source })?;
    let reported = wait_for_reload(logind, before, wanted, config.reload_timeout).await?;
    if reported < wanted {
        tracing::warn!(
            wanted_seconds = wanted.as_secs_f64(),
            reported_seconds = reported.as_secs_f64(),
            "logind still allows less inhibit delay than wanted after reload"
        );
    }
    Ok(DelayOutcome::new(wanted, reported, true))
}

/// Re-reads the setting with a growing pause until it moves or the deadline passes. logind
/// announces no change, so reading again is the only way to see the reload land.
async fn wait_for_reload(
    logind: &Logind,
    before: Duration,
    wanted: Duration,
    timeout: Duration,
) -> Result<Duration, LogindError> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut pause = Duration::from_millis(10);
    loop {
        let reported = logind.inhibit_delay_max().await?;
        if reported >= wanted || reported != before {
            return Ok(reported);
        }
        let now = tokio::time::Instant::now();
        if now >= deadline {
            return Ok(reported);
        }
        tokio::time::sleep(pause.min(deadline - now)).await;
        pause = (pause * 2).min(Duration::from_millis(500));
    }
}

/// logind takes whole seconds; rounding up keeps the granted delay at least the wanted one.
fn drop_in_contents(wanted: Duration) -> String {
    let seconds = wanted.as_secs() + u64::from(wanted.subsec_nanos() > 0);
    format!(
        "# Written by nodegrace: pods need this long to stop when the node shuts down.\n\
         [Login]\nInhibitDelayMaxSec={seconds}\n"
    )
}

/// Writes next to the target and renames over it, so logind never reads a half-written file.
fn write_atomically(path: &Path, contents: &str) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or_else(|| Path::new("."));
    fs::create_dir_all(dir)?;
    let file_name = path.file_name().map_or_else(
        || "drop-in".into(),
        |name| name.to_string_lossy().into_owned(),
    );
    // logind reads only `*.conf`, so the temporary name is never picked up half-written.
    let temporary = dir.join(format!(".{file_name}.tmp"));
    let mut file = fs::File::create(&temporary)?;
    file.write_all(contents.as_bytes())?;
    file.sync_all()?;
    drop(file);
    fs::rename(&temporary, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drop_in_rounds_up_to_whole_seconds() {
        assert!(
            drop_in_contents(Duration::from_secs(30)).ends_with("[Login]\nInhibitDelayMaxSec=30\n")
        );
        assert!(
            drop_in_contents(Duration::from_millis(30_001)).contains("InhibitDelayMaxSec=31\n")
        );
    }

    #[test]
    fn effective_is_the_smaller_of_wanted_and_reported() {
        let reduced = DelayOutcome::new(Duration::from_secs(30), Duration::from_secs(10), true);
        assert_eq!(reduced.effective, Duration::from_secs(10));
        assert!(reduced.is_reduced());
        let granted = DelayOutcome::new(Duration::from_secs(30), Duration::from_secs(90), false);
        assert_eq!(granted.effective, Duration::from_secs(30));
        assert!(!granted.is_reduced());
    }

    #[test]
    fn atomic_write_creates_the_directory_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("logind.conf.d").join("99-nodegrace.conf");
        write_atomically(&path, "first").unwrap();
        write_atomically(&path, "second").unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap(), "second");
        let names: Vec<_> = fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|entry| entry.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("99-nodegrace.conf")]);
    }

    #[test]
    fn write_failure_is_reported_not_swallowed() {
        let dir = tempfile::tempdir().unwrap();
        let blocker = dir.path().join("not-a-dir");
        fs::write(&blocker, "").unwrap();
        assert!(write_atomically(&blocker.join("99.conf"), "x").is_err());
    }
}
