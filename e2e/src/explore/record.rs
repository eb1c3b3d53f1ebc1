//! What the judge saw of Nodes and NodeDisruptionBudgets: every version its watches delivered,
//! with its resourceVersion, so the two kinds can be replayed in the API server's order (one
//! global resourceVersion). The watches go through the same faults as everyone: a version
//! that lived only during an outage may be missed, and a re-list is recorded as a resync.

use std::sync::{Arc, Mutex, PoisonError};

use futures::StreamExt;
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::watcher;
use kube::{Api, Client};
use serde_json::Value;
use tokio::task::JoinHandle;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Node,
    Budget,
    /// The pods of the `keeper` StatefulSet, which tolerate the out-of-service taint.
    Keeper,
    /// Leases: the kubelets' heartbeats in `kube-node-lease` (and the leader elections).
    Lease,
}

#[derive(Debug, Clone)]
pub enum Change {
    Upsert(Value),
    Removed(String),
    /// A re-list: these names exist, no others.
    Resync(Vec<String>),
}

#[derive(Debug, Clone)]
pub struct Seen {
    pub revision: u64,
    /// When the watch delivered it.
    pub received: jiff::Timestamp,
    pub kind: Kind,
    pub change: Change,
    /// Delivered by a re-list (the watch expired or failed), not as a change: versions between
    /// this object's last one and this may have lived while the judge was blind.
    pub relisted: bool,
}

#[derive(Debug, Default, Clone)]
pub struct Recording {
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Recording {
    fn push(&self, seen: Seen) {
        self.seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(seen);
    }

    /// Everything seen, in resourceVersion order (stable for equal versions).
    pub fn in_order(&self) -> Vec<Seen> {
        let mut seen = self
            .seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        seen.sort_by_key(|seen| seen.revision);
        seen
    }
}

impl Seen {
    /// One line of `watched.jsonl`: what the judge needs of the object, to read a verdict back.
    pub fn summary(&self) -> Value {
        let kind = match self.kind {
            Kind::Node => "Node",
            Kind::Budget => "NodeDisruptionBudget",
            Kind::Keeper => "Pod",
            Kind::Lease => "Lease",
        };
        let change = match &self.change {
            Change::Upsert(object) => serde_json::json!({
                "name": object["metadata"]["name"],
                "uid": object["metadata"]["uid"],
                "labels": object["metadata"]["labels"],
                "deletionTimestamp": object["metadata"]["deletionTimestamp"],
                "finalizers": object["metadata"]["finalizers"],
                "taints": object["spec"]["taints"],
                "ready": object["status"]["conditions"].as_array().and_then(|c| c.iter().find(|c| c["type"] == "Ready")).map(|c| c["status"].clone()),
                "spec": if self.kind == Kind::Budget { object["spec"].clone() } else { Value::Null },
                "nodeName": object["spec"]["nodeName"],
                "namespace": object["metadata"]["namespace"],
                "renewTime": object["spec"]["renewTime"],
            }),
            Change::Removed(name) => serde_json::json!({"removed": name}),
            Change::Resync(names) => serde_json::json!({"resync": names}),
        };
        serde_json::json!({"revision": self.revision, "received": self.received.to_string(), "kind": kind, "change": change})
    }
}

pub fn revision_of(object: &Value) -> u64 {
    object["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|version| version.parse().ok())
        .unwrap_or_default()
}

/// Watches Nodes, NodeDisruptionBudgets, the `keeper` pods and Leases into a [`Recording`] until the
/// handles are dropped.
pub fn start(client: &Client) -> (Recording, Vec<AbortOnDrop>) {
    let recording = Recording::default();
    let nodes = ApiResource::erase::<k8s_openapi::api::core::v1::Node>(&());
    let budgets = super::setup::node_budget_resource();
    let pods = ApiResource::erase::<k8s_openapi::api::core::v1::Pod>(&());
    let leases = ApiResource::erase::<k8s_openapi::api::coordination::v1::Lease>(&());
    let everything = watcher::Config::default();
    let keepers = watcher::Config::default().labels("app=keeper");
    let tasks = [
        (Kind::Node, nodes, everything.clone()),
        (Kind::Budget, budgets, everything.clone()),
        (Kind::Keeper, pods, keepers),
        (Kind::Lease, leases, everything),
    ]
    .into_iter()
    .map(|(kind, resource, config)| {
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
        AbortOnDrop(tokio::spawn(watch(api, config, kind, recording.clone())))
    })
    .collect();
    (recording, tasks)
}

#[derive(Debug)]
pub struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn watch(api: Api<DynamicObject>, config: watcher::Config, kind: Kind, recording: Recording) {
    let mut events = watcher(api, config).boxed();
    let mut listed: Vec<String> = Vec::new();
    let mut newest = 0;
    let mut listing = false;
    while let Some(event) = events.next().await {
        let Ok(event) = event else {
            continue;
        };
        match event {
            watcher::Event::Apply(object) | watcher::Event::InitApply(object) => {
                let value = serde_json::to_value(&object).unwrap_or_default();
                let revision = revision_of(&value);
                newest = newest.max(revision);
                if listing {
                    listed.push(object.metadata.name.clone().unwrap_or_default());
                }
                recording.push(Seen {
                    revision,
                    received: jiff::Timestamp::now(),
                    kind,
                    change: Change::Upsert(value),
                    relisted: listing,
                });
            }
            watcher::Event::Delete(object) => {
                let value = serde_json::to_value(&object).unwrap_or_default();
                let revision = revision_of(&value);
                newest = newest.max(revision);
                recording.push(Seen {
                    revision,
                    received: jiff::Timestamp::now(),
                    kind,
                    change: Change::Removed(object.metadata.name.clone().unwrap_or_default()),
                    relisted: false,
                });
            }
            watcher::Event::Init => {
                listing = true;
                listed.clear();
            }
            watcher::Event::InitDone => {
                listing = false;
                recording.push(Seen {
                    revision: newest,
                    received: jiff::Timestamp::now(),
                    kind,
                    change: Change::Resync(std::mem::take(&mut listed)),
                    relisted: true,
                });
            }
        }
    }
}
