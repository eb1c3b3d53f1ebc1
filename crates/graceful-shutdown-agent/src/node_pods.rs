//! A live view of the pods bound to this node, kept by a watch so that waiting for pods to
//! go away reacts to the API server's events instead of polling it.

use std::collections::HashSet;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tokio::sync::watch;
use tokio::time::Instant;

use nodegrace_core::error_chain::Chain;

/// The node's pods, and a signal that fires on every change to them.
#[derive(Debug, Clone)]
pub struct NodePods {
    store: Store<Pod>,
    changes: watch::Receiver<u64>,
}

impl NodePods {
    /// Starts watching the pods with `spec.nodeName = node` across all namespaces. The watch
    /// retries with backoff on its own; while the API server is away the view stays as it was.
    /// It runs as long as any clone of the view exists, and no longer: a SIGTERM must not end
    /// it while a shutdown still waits on it.
    pub fn start(client: Client, node: &str) -> Self {
        let (store, writer) = reflector::store();
        let (notify, changes) = watch::channel(0u64);
        let config = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
        let events = reflector::reflector(writer, watcher(Api::<Pod>::all(client), config))
            .default_backoff();
        tokio::spawn(async move {
            let mut events = std::pin::pin!(events);
            loop {
                tokio::select! {
                    () = notify.closed() => return,
                    event = events.next() => match event {
                        Some(Ok(_)) => notify.send_modify(|generation| *generation += 1),
                        Some(Err(error)) => tracing::warn!(error = %Chain(&error), "pod watch failed; retrying"),
                        None => return,
                    },
                }
            }
        });
        Self { store, changes }
    }

    /// Waits for the first complete listing.
    pub async fn synced(&self) {
        // Err means the watch task ended (cancelled); there is nothing left to wait for.
        let _ = self.store.wait_until_ready().await;
    }

    pub fn snapshot(&self) -> Vec<Arc<Pod>> {
        self.store.state()
    }

    /// Waits until none of `uids` is on the node any more, or `deadline` passes. Returns the
    /// UIDs still present. Only the watch can say a pod is gone: without it, the wait lasts to
    /// the deadline.
    pub async fn wait_gone(&self, uids: &HashSet<String>, deadline: Instant) -> HashSet<String> {
        let mut changes = self.changes.clone();
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
        self.store
            .state()
            .iter()
            .filter_map(|pod| pod.metadata.uid.clone())
            .filter(|uid| uids.contains(uid))
            .collect()
    }
}
