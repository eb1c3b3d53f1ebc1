//! A real logind for tests: elogind from Debian's packages on a private `dbus-daemon`, inside
//! its own PID and mount namespace.
//!
//! Each [`LogindHarness`] is one scenario: its own bus socket, its own `logind.conf`, and a
//! shutdown hook that records when shutdown would have proceeded and then cancels it, so a
//! test can call `PowerOff` for real. elogind runs under `unshare --pid --mount`: if a power
//! action ever went through, it would only end that namespace. Dropping the harness stops
//! everything it started.

mod processes;
mod provision;
mod scenario;

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use zbus::fdo::DBusProxy;
use zbus::names::BusName;

pub use processes::Detached;
pub use provision::{Elogind, provision};
pub use scenario::AfterShutdownHook;

use processes::{BusDaemon, ElogindProcess};
use scenario::ScenarioDir;

const LOGIND: &str = "org.freedesktop.login1";
const LOGIND_PATH: &str = "/org/freedesktop/login1";
const MANAGER: &str = "org.freedesktop.login1.Manager";
/// elogind needs well under a second to come up; this allows for a loaded CI machine.
const START_TIMEOUT: Duration = Duration::from_secs(20);

#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    #[error("cannot {action}: {source}")]
    Io {
        action: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot provision elogind: {0}")]
    Provision(String),
    #[error("{0}")]
    Timeout(String),
    #[error("D-Bus call failed: {0}")]
    Bus(#[from] zbus::Error),
    #[error("the real-logind tests cannot run here, and CI is set so they may not be skipped: {0}")]
    SkipInCi(String),
}

impl HarnessError {
    fn io(action: &'static str) -> impl FnOnce(std::io::Error) -> Self {
        move |source| Self::Io { action, source }
    }
}

/// Why the logind tests cannot run here, or `None` when they can.
///
/// Only a missing root or a missing `unshare` is a reason: anything else that fails is a bug the
/// tests must show.
pub fn skip_reason() -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        return Some("the real-logind tests need root (PID and mount namespaces)".to_owned());
    }
    let has_unshare = std::process::Command::new("unshare")
        .arg("--version")
        .output()
        .is_ok_and(|out| out.status.success());
    if !has_unshare {
        return Some("the real-logind tests need `unshare` (util-linux)".to_owned());
    }
    None
}

/// What a real-logind test does here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SkipDecision {
    Run,
    /// A developer's machine without root: say so loudly and pass.
    Skip(String),
    /// In CI a skipped test would count as passed, so it fails instead.
    Fail(String),
}

pub fn skip_decision(reason: Option<String>, ci: bool) -> SkipDecision {
    match reason {
        None => SkipDecision::Run,
        Some(reason) if ci => SkipDecision::Fail(reason),
        Some(reason) => SkipDecision::Skip(reason),
    }
}

/// `CI` set to anything but empty, `0` or `false`, as CI services (and `.ci/run`) set it.
pub fn ci_is_set() -> bool {
    std::env::var("CI").is_ok_and(|value| !matches!(value.as_str(), "" | "0" | "false"))
}

/// How to set up one scenario.
#[derive(Debug, Clone)]
pub struct ScenarioOptions {
    /// `InhibitDelayMaxSec` in the scenario's logind.conf.
    pub inhibit_delay_max: Duration,
    /// Keep the processes alive when this process exits (for `logind-harness up`).
    pub detached: bool,
    /// What happens once shutdown proceeds: cancelled, or held as a machine going down.
    pub after_shutdown_hook: AfterShutdownHook,
}

impl Default for ScenarioOptions {
    fn default() -> Self {
        Self {
            inhibit_delay_max: Duration::from_secs(5),
            detached: false,
            after_shutdown_hook: AfterShutdownHook::Cancel,
        }
    }
}

/// A running scenario: dbus-daemon plus elogind. Dropping it stops both.
#[derive(Debug)]
pub struct LogindHarness {
    // Field order is drop order: elogind leaves the bus before the bus goes away.
    elogind: Option<ElogindProcess>,
    bus_daemon: Option<BusDaemon>,
    elogind_binary: Elogind,
    bus_address: String,
    connection: zbus::Connection,
    scenario: ScenarioDir,
    detached: bool,
}

impl LogindHarness {
    /// Starts a scenario, or returns `Ok(None)` after printing why logind tests cannot run here.
    pub async fn start_or_skip(options: ScenarioOptions) -> Result<Option<Self>, HarnessError> {
        match skip_decision(skip_reason(), ci_is_set()) {
            SkipDecision::Run => Self::start(options).await.map(Some),
            SkipDecision::Skip(reason) => {
                eprintln!("SKIPPED (real logind unavailable): {reason}");
                Ok(None)
            }
            SkipDecision::Fail(reason) => Err(HarnessError::SkipInCi(reason)),
        }
    }

    pub async fn start(options: ScenarioOptions) -> Result<Self, HarnessError> {
        let work_dir = work_dir();
        let elogind_binary = provision(&work_dir.join("elogind"))?;
        let scenario = ScenarioDir::create(
            &work_dir.join("logind-scenarios"),
            options.inhibit_delay_max,
            options.after_shutdown_hook,
        )?;
        let bus_daemon = BusDaemon::start(&scenario, options.detached)?;
        let bus_address = format!("unix:path={}", scenario.bus_socket().display());
        let connection = connect(&bus_address, &scenario).await?;
        let mut harness = Self {
            elogind: None,
            bus_daemon: Some(bus_daemon),
            elogind_binary,
            bus_address,
            connection,
            scenario,
            detached: options.detached,
        };
        harness.start_elogind().await?;
        Ok(harness)
    }

    async fn start_elogind(&mut self) -> Result<(), HarnessError> {
        let process = ElogindProcess::start(
            &self.elogind_binary,
            &self.scenario,
            &self.bus_address,
            self.detached,
        )?;
        self.elogind = Some(process);
        let logind = logind_name();
        let dbus = DBusProxy::new(&self.connection).await?;
        let claimed = wait_until(START_TIMEOUT, || async {
            dbus.name_has_owner(logind.clone()).await.unwrap_or(false)
        })
        .await;
        if claimed {
            return Ok(());
        }
        Err(HarnessError::Timeout(format!(
            "elogind did not claim {LOGIND} within {START_TIMEOUT:?}; its log: {}",
            std::fs::read_to_string(self.scenario.elogind_log()).unwrap_or_default()
        )))
    }

    /// The scenario's bus, as `DBUS_SYSTEM_BUS_ADDRESS` would name it.
    pub fn bus_address(&self) -> &str {
        &self.bus_address
    }

    /// The directory elogind reads as `/etc/elogind/logind.conf.d`.
    pub fn drop_in_dir(&self) -> PathBuf {
        self.scenario.drop_in_dir()
    }

    /// The host PID of elogind (what the bus reports for its name).
    pub async fn elogind_pid(&self) -> Result<u32, HarnessError> {
        let dbus = DBusProxy::new(&self.connection).await?;
        dbus.get_connection_unix_process_id(logind_name())
            .await
            .map_err(|e| HarnessError::Bus(e.into()))
    }

    /// Asks logind to power off, as `systemctl poweroff` would. The shutdown hook cancels it
    /// at the last step.
    pub async fn power_off(&self) -> Result<(), HarnessError> {
        self.connection
            .call_method(
                Some(LOGIND),
                LOGIND_PATH,
                Some(MANAGER),
                "PowerOff",
                &(false,),
            )
            .await?;
        Ok(())
    }

    /// Calls `method` of logind's Manager with `body`, as any client on the bus would (the
    /// test process is root): the reply, or logind's error.
    pub async fn call_manager<B>(
        &self,
        method: &str,
        body: &B,
    ) -> Result<zbus::Message, zbus::Error>
    where
        B: serde::Serialize + zbus::zvariant::DynamicType,
    {
        self.connection
            .call_method(Some(LOGIND), LOGIND_PATH, Some(MANAGER), method, body)
            .await
    }

    /// The directory of elogind's own tools (`loginctl`, `elogind-inhibit`) and the library
    /// path they need.
    pub fn elogind_tools(&self) -> (PathBuf, String) {
        let bin = self
            .elogind_binary
            .daemon()
            .parent()
            .and_then(Path::parent)
            .and_then(Path::parent)
            .map(|root| root.join("bin"))
            .unwrap_or_default();
        (bin, self.elogind_binary.library_path())
    }

    /// `InhibitDelayMaxUSec` as logind applies it now (drop-ins included).
    pub async fn inhibit_delay_max(&self) -> Result<Duration, HarnessError> {
        let reply = self
            .connection
            .call_method(
                Some(LOGIND),
                LOGIND_PATH,
                Some("org.freedesktop.DBus.Properties"),
                "Get",
                &(MANAGER, "InhibitDelayMaxUSec"),
            )
            .await?;
        let value: zbus::OwnedVariant = reply.body().deserialize()?;
        let micros = u64::try_from(value)?;
        Ok(Duration::from_micros(micros))
    }

    /// `ListInhibitors` as (what, who, why, mode, uid, pid) rows.
    pub async fn list_inhibitors(
        &self,
    ) -> Result<Vec<(String, String, String, String, u32, u32)>, HarnessError> {
        let reply = self
            .connection
            .call_method(
                Some(LOGIND),
                LOGIND_PATH,
                Some(MANAGER),
                "ListInhibitors",
                &(),
            )
            .await?;
        Ok(reply.body().deserialize()?)
    }

    /// When the shutdown hook ran, each time it ran.
    pub fn shutdown_hook_runs(&self) -> Vec<SystemTime> {
        std::fs::read_to_string(self.scenario.hook_log())
            .unwrap_or_default()
            .lines()
            .filter_map(|line| line.trim().parse::<u64>().ok())
            .map(|nanos| UNIX_EPOCH + Duration::from_nanos(nanos))
            .collect()
    }

    /// Waits until the shutdown hook has run (the moment shutdown would have proceeded).
    pub async fn wait_for_shutdown_hook(
        &self,
        timeout: Duration,
    ) -> Result<SystemTime, HarnessError> {
        let ran = wait_until(timeout, || async { !self.shutdown_hook_runs().is_empty() }).await;
        self.shutdown_hook_runs()
            .first()
            .copied()
            .filter(|_| ran)
            .ok_or_else(|| {
                HarnessError::Timeout(format!("the shutdown hook did not run within {timeout:?}"))
            })
    }

    /// Kills elogind (its whole namespace) and starts a fresh one on the same bus, as a logind
    /// crash and restart would look to a client.
    pub async fn restart(&mut self) -> Result<(), HarnessError> {
        self.stop_elogind().await?;
        self.start_elogind().await
    }

    /// Kills elogind and waits until it has left the bus.
    pub async fn stop_elogind(&mut self) -> Result<(), HarnessError> {
        if let Some(process) = self.elogind.take() {
            process.stop();
        }
        let dbus = DBusProxy::new(&self.connection).await?;
        let logind = logind_name();
        let left = wait_until(START_TIMEOUT, || async {
            !dbus.name_has_owner(logind.clone()).await.unwrap_or(true)
        })
        .await;
        if left {
            Ok(())
        } else {
            Err(HarnessError::Timeout(
                "elogind did not leave the bus".to_owned(),
            ))
        }
    }

    /// Leaves the processes running after this value is gone, for `logind-harness up`.
    pub fn detach(mut self) -> Detached {
        Detached {
            bus_address: self.bus_address.clone(),
            scenario_dir: self.scenario.root().to_path_buf(),
            pids: [
                self.elogind.take().map(ElogindProcess::leak),
                self.bus_daemon.take().map(BusDaemon::leak),
            ]
            .into_iter()
            .flatten()
            .collect(),
        }
    }
}

impl Drop for LogindHarness {
    fn drop(&mut self) {
        let Some(bus_daemon) = self.bus_daemon.take() else {
            return; // detached
        };
        if let Some(elogind) = self.elogind.take() {
            elogind.stop();
        }
        bus_daemon.stop();
        self.scenario.remove();
    }
}

/// Where provisioned elogind and scenario directories live: the workspace's target directory,
/// so `cargo clean` removes them and the stray-process check can recognise our processes.
pub fn work_dir() -> PathBuf {
    let dir = std::env::var_os("CARGO_TARGET_DIR").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"),
        PathBuf::from,
    );
    // A short, plain path keeps the bus socket under the UNIX socket path limit.
    std::fs::canonicalize(&dir).unwrap_or(dir)
}

fn logind_name() -> BusName<'static> {
    BusName::from_static_str(LOGIND).expect("the logind bus name is valid")
}

async fn connect(address: &str, scenario: &ScenarioDir) -> Result<zbus::Connection, HarnessError> {
    let deadline = tokio::time::Instant::now() + START_TIMEOUT;
    loop {
        match zbus::connection::Builder::address(address).build().await {
            Ok(connection) => return Ok(connection),
            Err(error) if tokio::time::Instant::now() >= deadline => {
                return Err(HarnessError::Timeout(format!(
                    "the private dbus-daemon at {} did not accept connections: {error}",
                    scenario.bus_socket().display()
                )));
            }
            // The socket appears a moment after dbus-daemon starts.
            Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
        }
    }
}

/// Polls `ready` until it holds or `timeout` passes. Used only where the system offers no
/// notification (a socket appearing, a hook writing a file).
async fn wait_until<F, Fut>(timeout: Duration, mut ready: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if ready().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_skip_passes_on_a_laptop_and_fails_in_ci() {
        let reason = || Some("needs root".to_owned());
        assert_eq!(skip_decision(None, true), SkipDecision::Run);
        assert_eq!(skip_decision(None, false), SkipDecision::Run);
        assert_eq!(
            skip_decision(reason(), false),
            SkipDecision::Skip("needs root".into())
        );
        assert_eq!(
            skip_decision(reason(), true),
            SkipDecision::Fail("needs root".into())
        );
    }
}
