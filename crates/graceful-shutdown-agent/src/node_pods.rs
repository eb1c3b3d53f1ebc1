//! A live view of the pods bound to this node, kept by a watch so that waiting for pods to
//! go away reacts to the API server's events instead of polling it.

use std::collections::HashSet;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher;
use kube::{Api, Client};
use nodegrace_core::k8s::watched::{WatchCounters, Watched};
use tokio::time::Instant;

/// The node's pods, and a signal that fires on every change to them.
#[derive(Debug, Clone)]
pub struct NodePods {
    pods: Watched<Pod>,
}

impl NodePods {
    /// Starts watching the pods with `spec.nodeName = node` across all namespaces. It runs as
    /// long as any clone of the view exists: a SIGTERM must not end it while a shutdown still
    /// waits on it.
    pub fn start(client: Client, node: &str) -> Self {
        let config = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
        Self {
            pods: Watched::start(Api::all(client), config, WatchCounters::default()),
        }
    }

    /// Waits for the first complete listing.
    pub async fn synced(&self) {
        // Err means the watch task ended; there is nothing left to wait for.
        let _ = self.pods.synced().await;
    }

    pub fn snapshot(&self) -> Vec<Arc<Pod>> {
        self.pods.state()
    }

    /// Waits until none of `uids` is on the node any more, or `deadline` passes. Returns the
    /// UIDs still present. Only the watch can say a pod is gone: without it, the wait lasts to
    /// the deadline.
    pub async fn wait_gone(&self, uids: &HashSet<String>, deadline: Instant) -> HashSet<String> {
        let mut changes = self.pods.clone();
        loop {
            let remaining = self.present(uids);
            if remaining.is_empty() {
                return remaining;
            }
            tokio::select! {
                () = tokio::time::sleep_until(deadline) => return self.present(uids),
                changed = changes.changed() => if changed.is_err() {
                    tokio::time::sleep_until(deadline).await;
                    return remaining;
                },
            }
        }
    }

    fn present(&self, uids: &HashSet<String>) -> HashSet<String> {
        self.pods
            .state()
            .iter()
            .filter_map(|pod| pod.metadata.uid.clone())
            .filter(|uid| uids.contains(uid))
            .collect()
    }
}
