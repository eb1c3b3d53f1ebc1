//! The pods bound to one node, as its drain sees them: listed once (before the cordon, whose
//! fresh read then confirms them bound to this Node object), and watched from that list's
//! resourceVersion only while the drain waits for them to change.
//!
//! A rollout grants hundreds of nodes at once, and each waits its turn for requests through
//! its cordon and evictions. A watch kept for the whole drain held, per node, a task with
//! kube's watcher and reflector (18 KiB), a line codec (8 KiB) and an HTTP connection with its
//! buffers (18 KiB): a third of the 5,000-node rollout's heap at its peak. Here there is no
//! task, and no watch until the drain first waits. A watch that breaks resumes from the last
//! version seen, after a backoff; one whose version expired (410) lists again.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{ListParams, WatchEvent, WatchParams};
use nodegrace_core::backoff::{Backoff, Retry};
use nodegrace_core::error_chain::Chain;
use tokio::time::Instant;

/// Watch failures in a row wait 0.5 s doubling to 30 s (kube's watcher waits up to 30 s too).
const BACKOFF: Backoff = Backoff {
    first: std::time::Duration::from_millis(500),
    longest: std::time::Duration::from_secs(30),
};

pub struct NodePods {
    api: Api<Pod>,
    selector: String,
    trim: fn(&mut Pod),
    /// By namespace and name.
    pods: BTreeMap<(String, String), Arc<Pod>>,
    /// The resourceVersion the pods are known at; `None` until listed.
    version: Option<String>,
    events: Option<BoxStream<'static, kube::Result<WatchEvent<Pod>>>>,
    retry: Retry,
    /// Lists made so far: a drain tells a view from before its cordon from one after.
    lists: u32,
}

impl std::fmt::Debug for NodePods {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodePods")
            .field("selector", &self.selector)
            .field("pods", &self.pods.len())
            .field("version", &self.version)
            .field("watching", &self.events.is_some())
            .finish_non_exhaustive()
    }
}

impl NodePods {
    /// The pods of node `node_name`; nothing is read until [`Self::list`] or
    /// [`Self::changed`].
    pub fn new(api: Api<Pod>, node_name: &str, trim: fn(&mut Pod)) -> Self {
        Self {
            api,
            selector: format!("spec.nodeName={node_name}"),
            trim,
            pods: BTreeMap::new(),
            version: None,
            events: None,
            retry: Retry::default(),
            lists: 0,
        }
    }

    /// Lists the node's pods (again, if listed before), replacing what was known.
    pub async fn list(&mut self) -> Result<(), kube::Error> {
        let list = self
            .api
            .list(&ListParams::default().fields(&self.selector))
            .await?;
        self.events = None;
        self.pods = list
            .items
            .into_iter()
            .map(|pod| (key(&pod), self.trimmed(pod)))
            .collect();
        self.version = list.metadata.resource_version;
        self.lists += 1;
        Ok(())
    }

    /// How many lists were made so far.
    pub fn lists(&self) -> u32 {
        self.lists
    }

    /// Lists the pods unless they are listed already.
    pub async fn listed(&mut self) -> Result<(), kube::Error> {
        if self.version.is_none() {
            self.list().await?;
        }
        Ok(())
    }

    /// The pods as last seen.
    pub fn state(&self) -> Vec<Arc<Pod>> {
        self.pods.values().cloned().collect()
    }

    /// Applies what the watch has delivered already, without waiting: a look at the pods
    /// right after another wake-up (an eviction's answer) sees the deletions that came first.
    pub fn catch_up(&mut self) {
        while let Some(Some(event)) = self
            .events
            .as_mut()
            .and_then(|events| events.next().now_or_never())
        {
            self.apply(event);
        }
    }

    /// Waits for the next change to the pods. Watches from the version last seen (listing
    /// first when never listed, or when the version expired); a failure waits out its
    /// backoff and watches again, keeping the pods last seen. Cancel-safe: dropped, it
    /// resumes where it was at the next call.
    pub async fn changed(&mut self) {
        loop {
            if self.events.is_none() {
                if let Some(wait) = self.retry.wait(Instant::now()) {
                    tokio::time::sleep(wait).await;
                }
                let started = match &self.version {
                    None => self.list().await.map(|()| true),
                    Some(version) => {
                        let params = WatchParams::default().fields(&self.selector);
                        match self.api.watch(&params, version).await {
                            Ok(events) => {
                                self.events = Some(events.boxed());
                                Ok(false)
                            }
                            Err(error) => Err(error),
                        }
                    }
                };
                match started {
                    // A fresh list is a change.
                    Ok(true) => return,
                    Ok(false) => {}
                    Err(error) => {
                        self.failed(&error);
                        continue;
                    }
                }
            }
            let Some(events) = self.events.as_mut() else {
                continue;
            };
            match events.next().await {
                Some(event) => {
                    if self.apply(event) {
                        return;
                    }
                }
                // The server ends watches after a while: resume from the version last seen.
                None => self.events = None,
            }
        }
    }

    /// Applies one watch event; whether the pods changed.
    fn apply(&mut self, event: kube::Result<WatchEvent<Pod>>) -> bool {
        match event {
            Ok(WatchEvent::Added(pod) | WatchEvent::Modified(pod)) => {
                self.retry.succeeded();
                self.version.clone_from(&pod.metadata.resource_version);
                let pod = self.trimmed(pod);
                self.pods.insert(key(&pod), pod);
                true
            }
            Ok(WatchEvent::Deleted(pod)) => {
                self.retry.succeeded();
                self.version.clone_from(&pod.metadata.resource_version);
                self.pods.remove(&key(&pod));
                true
            }
            Ok(WatchEvent::Bookmark(bookmark)) => {
                self.version = Some(bookmark.metadata.resource_version);
                false
            }
            // The version is too old to watch from: only a new list knows what changed.
            Ok(WatchEvent::Error(status)) if status.code == 410 => {
                self.events = None;
                self.version = None;
                false
            }
            Ok(WatchEvent::Error(status)) => {
                self.events = None;
                self.failed(&kube::Error::Api(status));
                false
            }
            Err(error) => {
                self.events = None;
                self.failed(&error);
                false
            }
        }
    }

    fn failed(&mut self, error: &kube::Error) {
        let delay = self.retry.failed(BACKOFF, Instant::now());
        tracing::warn!(
            pods = %self.selector,
            error = %Chain(error),
            retry_in_ms = delay.as_millis(),
            "watching the node's pods failed; keeping the pods last seen"
        );
    }

    fn trimmed(&self, mut pod: Pod) -> Arc<Pod> {
        (self.trim)(&mut pod);
        Arc::new(pod)
    }
}

fn key(pod: &Pod) -> (String, String) {
    (
        pod.metadata.namespace.clone().unwrap_or_default(),
        pod.metadata.name.clone().unwrap_or_default(),
    )
}
