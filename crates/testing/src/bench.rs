//! A controller's binary run for a benchmark, as an operator runs it: the process is what a
//! benchmark measures (its resident memory, its CPU time).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result};
use kube_sim::{SimOptions, WorldOptions};

use crate::{Admin, wait_for_within};

/// How long a controller may take to list a benchmark's cluster (5,000 nodes and 150,000 pods
/// on a loaded 2-core machine) and say it is ready.
const READY_WITHIN: Duration = Duration::from_secs(300);

/// The controller's process, killed when dropped.
#[derive(Debug)]
pub struct BenchedController {
    child: Child,
    admin: Admin,
}

impl Drop for BenchedController {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl BenchedController {
    /// Starts `binary` against `kubeconfig` without leader election, quiet, with `flags`
    /// added. `NODEGRACE_BENCH_PROFILER` (`heaptrack -o /tmp/tc`, say) runs it under that
    /// profiler; where the memory goes is then the profiler's to say. `NODEGRACE_BENCH_LOG`
    /// (a file) takes its log at debug level instead, for a run that stalls.
    pub fn start(
        binary: &str,
        metrics_prefix: &'static str,
        kubeconfig: &Path,
        flags: &[&str],
    ) -> Result<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let mut command = match std::env::var("NODEGRACE_BENCH_PROFILER") {
            Ok(profiler) if !profiler.trim().is_empty() => {
                let mut words = profiler.split_whitespace();
                let mut command = Command::new(words.next().unwrap_or_default());
                command.args(words).arg(binary);
                command
            }
            _ => Command::new(binary),
        };
        let (log_level, log) = match std::env::var_os("NODEGRACE_BENCH_LOG") {
            Some(path) => ("debug", Some(std::fs::File::create(path)?)),
            None => ("warn", None),
        };
        let output = |log: Option<&std::fs::File>| -> Result<Stdio> {
            Ok(match log {
                Some(file) => file.try_clone()?.into(),
                None => Stdio::null(),
            })
        };
        let child = command
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg(format!("--admin-listen=127.0.0.1:{port}"))
            .args(["--leader-elect=false", &format!("--log-level={log_level}")])
            .args(flags)
            .stdout(output(log.as_ref())?)
            .stderr(output(log.as_ref())?)
            .spawn()
            .with_context(|| format!("start {binary}"))?;
        Ok(Self {
            child,
            admin: Admin {
                address: ([127, 0, 0, 1], port).into(),
                prefix: metrics_prefix,
            },
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn admin(&self) -> Admin {
        self.admin
    }

    /// Waits until the controller says it is ready.
    pub async fn until_ready(&self) -> Result<()> {
        let admin = self.admin;
        wait_for_within("the controller to be ready", READY_WITHIN, || async {
            Ok(admin.is_ready().await.unwrap_or(false))
        })
        .await
    }
}

/// The cluster a controller's idle memory is measured in: 5,000 nodes and 150,000 pods, with
/// nothing in it moving (no workloads, kubelets or node lifecycle).
pub fn idle_fleet() -> SimOptions {
    SimOptions {
        nodes: 5_000,
        pods_per_node: 30,
        world: WorldOptions {
            workloads: false,
            kubelet: false,
            node_lifecycle: false,
            ..WorldOptions::default()
        },
        ..SimOptions::default()
    }
}

/// The most resident memory `pid` had, sampled every 100 ms until `stop`.
pub async fn peak_rss(pid: u32, mut stop: tokio::sync::oneshot::Receiver<()>) -> f64 {
    let mut peak: f64 = 0.0;
    loop {
        peak = peak.max(crate::rss_mib(pid));
        tokio::select! {
            _ = &mut stop => return peak,
            () = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
    }
}

/// Samples `pid`'s peak resident memory in the background until the returned guard is
/// finished: a benchmark's worst moment, not the one it happens to read.
#[derive(Debug)]
pub struct PeakRss {
    stop: tokio::sync::oneshot::Sender<()>,
    peak: tokio::task::JoinHandle<f64>,
}

impl PeakRss {
    pub fn start(pid: u32) -> Self {
        let (stop, stopped) = tokio::sync::oneshot::channel();
        Self {
            stop,
            peak: tokio::spawn(peak_rss(pid, stopped)),
        }
    }

    /// The peak, in MiB.
    pub async fn finish(self) -> Result<f64> {
        let _ = self.stop.send(());
        Ok(self.peak.await?)
    }
}
