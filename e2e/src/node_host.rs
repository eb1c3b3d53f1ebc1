//! One simulated machine: the host a node's pods see. It has its own real elogind (and D-Bus
//! system bus), its own loopback address for the pods' ports, and its own directory standing
//! for its filesystem.

use std::net::Ipv4Addr;
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
    address: Ipv4Addr,
    root: PathBuf,
    logind: Option<LogindHarness>,
}

impl NodeHost {
    /// Boots the machine: a fresh filesystem directory and a real elogind whose shutdowns go
    /// through (the hook holds them, as the power going off would), with logind's stock
    /// `InhibitDelayMaxSec` of 5 s.
    pub async fn boot(name: &str, index: u8, work_dir: &Path) -> Result<Self> {
        let root = work_dir.join("nodes").join(name);
        std::fs::create_dir_all(&root).with_context(|| format!("create {}", root.display()))?;
        let logind = LogindHarness::start(ScenarioOptions {
            inhibit_delay_max: Duration::from_secs(5),
            detached: false,
            after_shutdown_hook: AfterShutdownHook::Hold,
        })
        .await
        .with_context(|| format!("start {name}'s elogind"))?;
        Ok(Self {
            name: name.to_owned(),
            address: node_address(index),
            root,
            logind: Some(logind),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The address the node's pods listen on (each node has its own, so the charts' ports
    /// stay as they are).
    pub fn address(&self) -> Ipv4Addr {
        self.address
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

    /// The real path behind a path on this host: the system bus socket and logind's drop-in
    /// directory are its elogind's; everything else lives under the node's own directory.
    pub fn host_path(&self, path: &str) -> Result<PathBuf> {
        let logind = self.logind()?;
        Ok(match path {
            SYSTEM_BUS_SOCKET => logind
                .bus_address()
                .strip_prefix("unix:path=")
                .map(PathBuf::from)
                .context("the harness bus is a UNIX socket")?,
            ELOGIND_DROP_IN_DIR => logind.drop_in_dir(),
            other => self.root.join("root").join(other.trim_start_matches('/')),
        })
    }

    /// Where the node keeps what the demo's kubelet writes for its pods (config volumes, logs).
    pub fn pod_dir(&self, namespace: &str, pod: &str) -> PathBuf {
        self.root.join("pods").join(format!("{namespace}_{pod}"))
    }

    /// The machine goes dark: elogind and its bus end (the hook holding the shutdown with them).
    pub fn power_off(&mut self) {
        self.logind = None;
    }
}

/// Each machine's own loopback address: 127.x.y.<index + 1>, x.y from the demo's process id so
/// that two demos at once (a kept one and a test run) never share an address and port.
fn node_address(index: u8) -> Ipv4Addr {
    let pid = std::process::id();
    Ipv4Addr::new(
        127,
        100 + ((pid >> 8) % 150) as u8,
        (pid & 0xff) as u8,
        index + 1,
    )
}
