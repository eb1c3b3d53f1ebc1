//! What a storm test counts besides the provider's calls: the writes of a Node, and the
//! Events of a failure with their series counts.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, PoisonError};

use anyhow::Result;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::events::v1::Event;
use kube::api::ListParams;
use kube::runtime::watcher;
use kube::{Api, Client};
use tokio::task::JoinHandle;

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
