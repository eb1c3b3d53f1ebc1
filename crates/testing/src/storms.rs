//! Storm tests: a program's binary against a provider that refuses or hangs, judged over a
//! window of its backoff by the calls that reach the provider, the Node's writes, and the
//! Events of the failure with their series counts.

use std::collections::BTreeSet;
use std::future::Future;
use std::ops::RangeInclusive;
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::events::v1::Event;
use kube::api::ListParams;
use kube::runtime::watcher;
use kube::{Api, Client};
use tokio::process::{Child, Command};
use tokio::task::JoinHandle;

use crate::wait_for;

/// The writes of one Node, as the distinct resourceVersions a watch of it showed.
#[derive(Debug)]
pub struct NodeWrites {
    seen: Arc<Mutex<BTreeSet<String>>>,
    watching: JoinHandle<()>,
}

impl Drop for NodeWrites {
    fn drop(&mut self) {
        self.watching.abort();
    }
}

impl NodeWrites {
    pub fn watch(client: &Client, node: &str) -> Self {
        let seen: Arc<Mutex<BTreeSet<String>>> = Arc::default();
        let nodes: Api<Node> = Api::all(client.clone());
        let config = watcher::Config::default().fields(&format!("metadata.name={node}"));
        let counted = Arc::clone(&seen);
        let watching = tokio::spawn(async move {
            let mut events = watcher(nodes, config).boxed();
            while let Some(event) = events.next().await {
                if let Ok(watcher::Event::Apply(node) | watcher::Event::InitApply(node)) = event
                    && let Some(version) = node.metadata.resource_version
                {
                    counted
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .insert(version);
                }
            }
        });
        Self { seen, watching }
    }

    /// The versions seen so far.
    pub fn count(&self) -> usize {
        self.seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

/// The events.k8s.io Events with `reason` about the Node `node`, each as its series count (1
/// for an Event without a series).
pub async fn event_series(client: &Client, node: &str, reason: &str) -> Result<Vec<i32>> {
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    Ok(events
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|event| {
            event.reason.as_deref() == Some(reason)
                && event.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(node)
        })
        .map(|event| event.series.map_or(1, |series| series.count))
        .collect())
}

/// A program's binary started as a storm test runs it: against `kubeconfig` without leader
/// election, quiet, with `flags` added, and with static AWS keys (a provider other than EC2
/// never reads them). Killed when the handle drops.
pub fn spawn_program(binary: &str, kubeconfig: &Path, flags: &[String]) -> Result<Child> {
    Command::new(binary)
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .args([
            "--admin-listen=127.0.0.1:0",
            "--leader-elect=false",
            "--instance-provider-timeout=2s",
            "--log-level=warn",
        ])
        .args(flags)
        .env_remove("AWS_REGION")
        .env("AWS_ACCESS_KEY_ID", "AKIAPROGRAM")
        .env("AWS_SECRET_ACCESS_KEY", "secret")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("start {binary}"))
}

/// What a failing provider's calls must look like over a window of the backoff's schedule.
pub struct Storm<'a> {
    pub client: &'a Client,
    /// The Node whose machine fails.
    pub node: &'a str,
    /// The call counted, for messages (`TerminateInstances`).
    pub what: &'a str,
    /// The Event the failures are told in, once, with a count.
    pub reason: &'a str,
    /// The window, from the first call on: real time, as the programs' due times are
    /// wall-clock.
    pub observed: Duration,
    /// How many calls the window must see, at least (a retry is due within it) and at most
    /// (what the backoff allows).
    pub tries: RangeInclusive<usize>,
    /// The Node writes one try may cost.
    pub writes_per_try: usize,
}

impl std::fmt::Debug for Storm<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Storm")
            .field("node", &self.node)
            .field("what", &self.what)
            .finish_non_exhaustive()
    }
}

impl Storm<'_> {
    /// Runs `failing` (what makes the program call the provider), then judges the calls
    /// `calls` counts from the first on, the Node's writes and the Event. Returns the calls.
    pub async fn judge(
        &self,
        calls: &dyn Fn() -> usize,
        failing: impl Future<Output = Result<()>>,
    ) -> Result<usize> {
        let Self {
            client,
            node,
            what,
            reason,
            observed,
            ref tries,
            writes_per_try,
        } = *self;
        let writes = NodeWrites::watch(client, node);
        failing.await?;
        wait_for(&format!("the first {what}"), || async { Ok(calls() >= 1) }).await?;
        let first = calls();
        let written_before = writes.count();
        // An observation window, not a wait for state: the count over it is the result.
        tokio::time::sleep(observed).await;
        let total = calls();
        let made = total - first + 1;
        ensure!(
            tries.contains(&made),
            "{made} {what} calls in {observed:?} (the backoff allows {}, and {} are due within \
             it)",
            tries.end(),
            tries.start(),
        );
        let written = writes.count() - written_before;
        ensure!(
            written <= writes_per_try * made + 2,
            "the Node was written {written} times for {made} tries"
        );
        let said = event_series(client, node, reason).await?;
        ensure!(said.len() == 1, "{reason} Events: {said:?}");
        ensure!(
            (total as i32 - 1..=total as i32).contains(&said[0]),
            "the {reason} Event counts {} of {total} failures",
            said[0]
        );
        Ok(total)
    }
}
