//! The files one scenario needs: a bus configuration, a logind.conf, and the shutdown hook that
//! records when shutdown proceeds and then cancels or holds it.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use crate::HarnessError;

/// What the shutdown hook does after recording the moment shutdown proceeded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterShutdownHook {
    /// Fails, so logind cancels the power-off at its last step (`AllowPowerOffInterrupts`) and
    /// the scenario goes on: clients see `PrepareForShutdown(false)`.
    Cancel,
    /// Never returns, as a machine going down never comes back to its clients: logind sends
    /// nothing more. The scenario is stopped from outside, as the power going off would.
    Hold,
}

/// A scenario's private directory; it is mounted over `/etc/elogind` inside elogind's namespace.
#[derive(Debug)]
pub struct ScenarioDir {
    root: PathBuf,
}

impl ScenarioDir {
    /// Creates a fresh directory under `parent`. Names are short because the bus socket inside
    /// must fit the 108-byte limit of a UNIX socket path.
    pub fn create(
        parent: &Path,
        inhibit_delay_max: Duration,
        after_hook: AfterShutdownHook,
    ) -> Result<Self, HarnessError> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let root = parent.join(name);
        let _ = fs::remove_dir_all(&root);
        let scenario = Self { root };
        scenario.write_files(inhibit_delay_max, after_hook)?;
        Ok(scenario)
    }

    fn write_files(
        &self,
        inhibit_delay_max: Duration,
        after_hook: AfterShutdownHook,
    ) -> Result<(), HarnessError> {
        let io = HarnessError::io;
        fs::create_dir_all(self.drop_in_dir()).map_err(io("create the scenario directory"))?;
        fs::create_dir_all(self.run_systemd()).map_err(io("create the runtime directory"))?;
        fs::create_dir_all(self.etc().join("system-shutdown"))
            .map_err(io("create the hook directory"))?;
        fs::write(self.dbus_config(), dbus_config(&self.bus_socket()))
            .map_err(io("write the bus configuration"))?;
        fs::write(
            self.etc().join("logind.conf"),
            logind_conf(inhibit_delay_max),
        )
        .map_err(io("write logind.conf"))?;
        let hook = self.etc().join("system-shutdown/nodegrace-record");
        fs::write(&hook, shutdown_hook(&self.hook_log(), after_hook))
            .map_err(io("write the shutdown hook"))?;
        fs::set_permissions(&hook, fs::Permissions::from_mode(0o755))
            .map_err(io("make the shutdown hook executable"))?;
        Ok(())
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn etc(&self) -> PathBuf {
        self.root.join("etc")
    }

    /// Mounted as `/run/systemd` inside elogind's namespace. It outlives a restart, as the
    /// host's `/run` does, so elogind restores its inhibitors from `/run/systemd/inhibit`.
    pub fn run_systemd(&self) -> PathBuf {
        self.root.join("run-systemd")
    }

    /// `/etc/elogind/logind.conf.d` as elogind sees it.
    pub fn drop_in_dir(&self) -> PathBuf {
        self.etc().join("logind.conf.d")
    }

    pub fn bus_socket(&self) -> PathBuf {
        self.root.join("bus")
    }

    pub fn dbus_config(&self) -> PathBuf {
        self.root.join("dbus.conf")
    }

    pub fn hook_log(&self) -> PathBuf {
        self.root.join("shutdown-hook.log")
    }

    pub fn elogind_log(&self) -> PathBuf {
        self.root.join("elogind.log")
    }

    pub fn remove(&self) {
        let _ = fs::remove_dir_all(&self.root);
    }
}

fn dbus_config(socket: &Path) -> String {
    // Everyone may own and talk to everything: the bus is private to one scenario, and the
    // tests call logind as root anyway.
    format!(
        r#"<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-BUS Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>system</type>
  <listen>unix:path={}</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/>
    <allow own="*"/>
    <allow send_destination="*" eavesdrop="true"/>
    <allow receive_sender="*"/>
    <allow send_type="method_call"/>
    <allow send_type="signal"/>
  </policy>
</busconfig>
"#,
        socket.display()
    )
}

fn logind_conf(inhibit_delay_max: Duration) -> String {
    // AllowPowerOffInterrupts lets the failing hook cancel the power-off at its very last step.
    format!(
        "[Login]\nInhibitDelayMaxSec={}\n\n[Sleep]\nAllowPowerOffInterrupts=yes\n",
        inhibit_delay_max.as_secs().max(1)
    )
}

fn shutdown_hook(log: &Path, after: AfterShutdownHook) -> String {
    // Holding sleeps rather than powering off: the hook runs inside elogind's PID namespace, so
    // stopping the scenario ends it along with elogind.
    let then = match after {
        AfterShutdownHook::Cancel => "exit 1",
        AfterShutdownHook::Hold => "exec sleep 3600",
    };
    format!(
        "#!/bin/sh\n\
         # Records when shutdown proceeds; nothing ever powers off.\n\
         PATH=/usr/sbin:/usr/bin:/sbin:/bin\n\
         date +%s%N >> '{}'\n\
         {then}\n",
        log.display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scenario_holds_config_hook_and_drop_in_dir() {
        let parent = tempfile::tempdir().unwrap();
        let scenario = ScenarioDir::create(
            parent.path(),
            Duration::from_secs(7),
            AfterShutdownHook::Cancel,
        )
        .unwrap();
        let conf = fs::read_to_string(scenario.etc().join("logind.conf")).unwrap();
        assert!(conf.contains("InhibitDelayMaxSec=7\n"));
        assert!(conf.contains("AllowPowerOffInterrupts=yes"));
        assert!(scenario.drop_in_dir().is_dir());
        let hook = scenario.etc().join("system-shutdown/nodegrace-record");
        assert_eq!(
            fs::metadata(&hook).unwrap().permissions().mode() & 0o111,
            0o111
        );
        assert!(fs::read_to_string(&hook).unwrap().contains("exit 1"));
        let bus = fs::read_to_string(scenario.dbus_config()).unwrap();
        assert!(bus.contains(&format!("unix:path={}", scenario.bus_socket().display())));
        assert!(bus.contains("<type>system</type>"));
    }

    #[test]
    fn a_held_shutdown_never_returns_to_logind() {
        let hook = shutdown_hook(Path::new("/log"), AfterShutdownHook::Hold);
        assert!(hook.contains("date +%s%N >> '/log'\nexec sleep"), "{hook}");
    }

    #[test]
    fn scenarios_never_share_a_directory() {
        let parent = tempfile::tempdir().unwrap();
        let create = |after| ScenarioDir::create(parent.path(), Duration::from_secs(1), after);
        let first = create(AfterShutdownHook::Cancel).unwrap();
        let second = create(AfterShutdownHook::Hold).unwrap();
        assert_ne!(first.root(), second.root());
        first.remove();
        assert!(!first.root().exists());
        assert!(second.root().exists());
    }
}
