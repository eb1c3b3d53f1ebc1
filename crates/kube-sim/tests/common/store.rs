//! Waiting on the in-process simulator's state.

use std::future::Future;
use std::time::Duration;

use anyhow::{Result, bail};
use kube_sim::KubeSim;
use tokio::sync::broadcast::error::RecvError;

/// How long any awaited state may take to appear.
const TIMEOUT: Duration = Duration::from_secs(20);

/// Waits until `check` holds, checking again after every change the simulator's store commits.
/// Every state a check reads changes only through the store, and the subscription starts
/// before the first check, so no change goes unseen.
pub async fn wait_until<F, Fut>(sim: &KubeSim, what: &str, mut check: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<bool>>,
{
    let mut changes = sim.store().subscribe(0)?.live;
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    while !check().await? {
        match tokio::time::timeout_at(deadline, changes.recv()).await {
            Ok(Ok(_) | Err(RecvError::Lagged(_))) => {}
            Ok(Err(RecvError::Closed)) => bail!("the simulator stopped while waiting for {what}"),
            Err(_) => bail!("timed out after {TIMEOUT:?} waiting for {what}"),
        }
    }
    Ok(())
}
