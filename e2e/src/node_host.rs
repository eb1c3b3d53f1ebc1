//! One simulated machine: the host a node's pods see. It has its own real elogind (and D-Bus
//! system bus) and its own filesystem directory, which kube-sim's kubelet uses for the node's
//! hostPath volumes (`kube-sim serve --node-roots`): its D-Bus socket and logind's drop-in
//! directory there are this machine's elogind's.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use logind_harness::{AfterShutdownHook, LogindHarness, ScenarioOptions};

/// Where D-Bus clients find the system bus on a Linux host.
pub const SYSTEM_BUS_SOCKET: &str = "/run/dbus/system_bus_socket";
/// elogind reads its drop-ins here (systemd-logind: /etc/systemd/logind.conf.d).
pub const ELOGIND_DROP_IN_DIR: &str = "/etc/elogind/logind.conf.d";

#[derive(Debug)]
pub struct NodeHost {
    name: String,
    /// The machine's filesystem, as its pods' hostPath volumes see it.
    root: PathBuf,
    logind: Option<LogindHarness>,
}

impl NodeHost {
    /// Boots the machine: a real elogind whose shutdowns go through (the hook holds them, as
    /// the power going off would), with logind's stock `InhibitDelayMaxSec` of 5 s, its bus
    /// socket and drop-in directory in place in the machine's filesystem `roots/<name>`.
    pub async fn boot(name: &str, roots: &Path) -> Result<Self> {
        let root = roots.join(name);
        std::fs::create_dir_all(&root).with_context(|| format!("create {}", root.display()))?;
        let logind = LogindHarness::start(ScenarioOptions {
            inhibit_delay_max: Duration::from_secs(5),
            detached: false,
            after_shutdown_hook: AfterShutdownHook::Hold,
        })
        .await
        .with_context(|| format!("start {name}'s elogind"))?;
        let socket = logind
            .bus_address()
            .strip_prefix("unix:path=")
            .map(PathBuf::from)
            .context("the harness bus is a UNIX socket")?;
        link(&root, SYSTEM_BUS_SOCKET, &socket)?;
        link(&root, ELOGIND_DROP_IN_DIR, &logind.drop_in_dir())?;
        Ok(Self {
            name: name.to_owned(),
            root,
            logind: Some(logind),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The machine's filesystem (kube-sim's node root).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The node's logind, or an error once the machine is off.
    pub fn logind(&self) -> Result<&LogindHarness> {
        self.logind
            .as_ref()
            .with_context(|| format!("{} is powered off", self.name))
    }

    /// `DBUS_SYSTEM_BUS_ADDRESS=… systemd-inhibit --list`: logind's locks as a person lists them.
    pub fn inhibitors_command(&self) -> String {
        self.logind.as_ref().map_or_else(String::new, |logind| {
            format!(
                "DBUS_SYSTEM_BUS_ADDRESS={} systemd-inhibit --list",
                logind.bus_address()
            )
        })
    }

    /// The machine goes dark: elogind and its bus end (the hook holding the shutdown with them).
    pub fn power_off(&mut self) {
        self.logind = None;
    }
}

/// Makes `path` in the machine's filesystem `root` lead to `target` (replacing a link left by
/// an earlier boot).
fn link(root: &Path, path: &str, target: &Path) -> Result<()> {
    let link = root.join(path.trim_start_matches('/'));
    if let Some(parent) = link.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(target, &link)
        .with_context(|| format!("link {} to {}", link.display(), target.display()))
}
