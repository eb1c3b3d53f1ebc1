//! The providers' real-protocol servers for tests: moto (EC2, STS), sushy-tools' Redfish
//! emulator, Cluster API's Machine CRD and a machine controller (on any API server, kube-sim
//! in the tests), and an HTTP interposer that puts a cloud's faults between a program and them.
//! Their own crate, not part of `nodegrace-testing`, because the explorer (built beside the
//! programs) uses them too, and keeps what it links apart from the programs' tests.

pub mod cluster_api;
pub mod interposer;
pub mod moto;
pub mod sushy;

use std::time::Duration;

use anyhow::{Context, Result, bail};

/// The address a Flask development server (moto's, sushy-tools') printed once it listened; its
/// stderr is read on after that, since these servers log every request and would block on a
/// full pipe.
pub async fn flask_url(server: &mut tokio::process::Child, what: &str) -> Result<String> {
    use tokio::io::AsyncBufReadExt;
    let stderr = server.stderr.take().context("the server's stderr")?;
    let mut lines = tokio::io::BufReader::new(stderr).lines();
    let url = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await? {
            if let Some(at) = line.find("Running on http") {
                return Ok(line[at + "Running on ".len()..].trim().to_owned());
            }
        }
        bail!("{what} exited before it listened")
    })
    .await
    .with_context(|| format!("{what} did not listen within 60 s"))??;
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok(url)
}
