//! The cluster: `kube-sim serve` as its own process, reached through the kubeconfig it writes,
//! as kubectl and the programs reach it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::processes::Guarded;
use crate::wait::poll_until;

const START_TIMEOUT: Duration = Duration::from_secs(30);

pub struct Cluster {
    process: Guarded,
    kubeconfig: PathBuf,
    client: Client,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("process", &self.process)
            .field("kubeconfig", &self.kubeconfig)
            .finish_non_exhaustive()
    }
}

impl Cluster {
    /// Starts `kube-sim serve` with `nodes` Ready nodes (node-0…), whose kubelets renew their
    /// Lease every `renew_interval` and count as down after `grace` without, and connects to it.
    /// `extra_args` go to `kube-sim serve` as they are.
    pub async fn start(
        kube_sim: &Path,
        nodes: usize,
        renew_interval: Duration,
        grace: Duration,
        work_dir: &Path,
        extra_args: &[String],
    ) -> Result<Self> {
        let kubeconfig = work_dir.join("kubeconfig");
        let mut args = vec![
            "serve".to_owned(),
            "--listen=127.0.0.1:0".to_owned(),
            format!("--kubeconfig-out={}", kubeconfig.display()),
            format!("--nodes={nodes}"),
            format!(
                "--node-lease-renew-interval={}ms",
                renew_interval.as_millis()
            ),
            format!("--node-monitor-grace-period={}ms", grace.as_millis()),
        ];
        args.extend_from_slice(extra_args);
        let log = work_dir.join("logs/kube-sim.log");
        let mut process = Guarded::spawn("kube-sim", kube_sim, &args, &[], &log)?;
        // The kubeconfig appears (atomically) once the server accepts requests.
        let written = poll_until(START_TIMEOUT, || {
            let settled = kubeconfig.is_file() || process.exited().is_some();
            async move { settled }
        })
        .await;
        if !written || !kubeconfig.is_file() {
            bail!(
                "kube-sim did not start within {START_TIMEOUT:?}; its log: {}",
                std::fs::read_to_string(&log).unwrap_or_default().trim()
            );
        }
        let client = client_for(&kubeconfig).await?;
        Ok(Self {
            process,
            kubeconfig,
            client,
        })
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    pub fn pid(&self) -> u32 {
        self.process.pid()
    }
}

pub async fn client_for(kubeconfig: &Path) -> Result<Client> {
    let config = kube::Config::from_custom_kubeconfig(
        Kubeconfig::read_from(kubeconfig)?,
        &KubeConfigOptions::default(),
    )
    .await
    .with_context(|| format!("read {}", kubeconfig.display()))?;
    Ok(Client::try_from(config)?)
}
