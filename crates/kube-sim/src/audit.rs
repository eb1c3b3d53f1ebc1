//! The audit of what API clients took away, for judges that must not trust the clients' own
//! reports (drain tests, `cargo xtask explore`):
//! - availability: every moment an API eviction or delete took a healthy pod away while its
//!   PodDisruptionBudget's healthy pods fell below `desiredHealthy` (a correct eviction cannot
//!   cause one unless the budget's status was stale);
//! - deletions: every API delete of a pod, a VolumeAttachment or a Node, by whom, with which
//!   grace period, and whether the kubelet of the object's node was running at that moment —
//!   which only the simulator knows;
//! - Node writes: every API PUT or PATCH of a Node or its status, by whom and when, so a judge
//!   can tell a program that writes a Node far more often than its steps need.

use std::sync::{Arc, Mutex, PoisonError};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::conditions::{is_finished, is_ready};
use crate::selector::LabelSelector;
use crate::store::Store;

/// What took the pod away.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Disruption {
    /// `POST …/pods/{name}/eviction`.
    Eviction,
    /// A plain `DELETE` of the pod (or a deletecollection that included it).
    Delete,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Violation {
    pub namespace: String,
    pub pod: String,
    pub budget: String,
    /// RFC 3339, whole seconds.
    pub at: String,
    pub by: Disruption,
    /// The budget's healthy pods once this one was gone.
    pub healthy: i64,
    /// The budget's `status.desiredHealthy` at that moment.
    pub desired_healthy: i64,
    /// The budget's `status.currentHealthy` at that moment: more than `healthy` + 1 means the
    /// status had not yet counted pods that turned unhealthy (the disruption controller is
    /// asynchronous, as upstream), so the eviction was allowed on a stale status.
    #[serde(default)]
    pub status_healthy: i64,
    /// The requester's user name.
    pub user: String,
    /// The store's resourceVersion just before the pod went, to order the record among
    /// watched changes.
    pub revision: u64,
}

/// The kubelet of a node, as the simulated machine runs it (see `annotations::KUBELET_ANNOTATION`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum KubeletState {
    /// Running and reporting.
    Running,
    /// Running (its containers too) but cut off from the API server: it reports nothing.
    Partitioned,
    /// Its machine just powered on: it reports before it starts any pod.
    Booting,
    /// Stopped with its machine: nothing runs there.
    Stopped,
    /// No such node, or no node named.
    None,
}

impl KubeletState {
    pub fn of_node(store: &Store, node: &str) -> Self {
        if node.is_empty() {
            return Self::None;
        }
        match store.get(&store.kind("", "nodes"), None, node) {
            Err(_) => Self::None,
            Ok(node) => {
                match node["metadata"]["annotations"][crate::annotations::KUBELET_ANNOTATION]
                    .as_str()
                {
                    Some("stopped") => Self::Stopped,
                    Some("partitioned") => Self::Partitioned,
                    Some("booting") => Self::Booting,
                    _ => Self::Running,
                }
            }
        }
    }
}

/// One API delete of a pod, a VolumeAttachment or a Node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Deletion {
    /// `pods`, `volumeattachments` or `nodes`.
    pub resource: String,
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// The pod's or the attachment's `spec.nodeName`; a Node's own name.
    pub node: String,
    /// A Node's `spec.providerID`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider_id: Option<String>,
    /// The object's finalizers when the delete came.
    pub finalizers: Vec<String>,
    /// As requested (`None`: the object's own).
    pub grace_period_seconds: Option<i64>,
    pub user: String,
    /// RFC 3339 with milliseconds.
    pub at: String,
    pub revision: u64,
    /// The node's kubelet at that moment.
    pub kubelet: KubeletState,
}

/// One pod the eviction subresource deleted: by a client's `pods/eviction`, or by the default
/// eviction responder (`user` is then [`crate::world::EVICTOR_USER`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Evicted {
    pub namespace: String,
    pub pod: String,
    pub uid: String,
    pub node: String,
    pub user: String,
    /// RFC 3339 with milliseconds.
    pub at: String,
    pub revision: u64,
}

/// One successful API write (PUT or PATCH) of a Node, its status included.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeWrite {
    pub name: String,
    /// The status subresource, not the object.
    pub status: bool,
    pub user: String,
    /// RFC 3339 with milliseconds.
    pub at: String,
}

#[derive(Debug, Clone, Default)]
pub struct Audit {
    violations: Arc<Mutex<Vec<Violation>>>,
    deletions: Arc<Mutex<Vec<Deletion>>>,
    evictions: Arc<Mutex<Vec<Evicted>>>,
    node_writes: Arc<Mutex<Vec<NodeWrite>>>,
}

fn now_in_milliseconds() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%S%.3fZ")
        .to_string()
}

/// Counted toward a budget: Ready, not terminating, not finished.
fn healthy(pod: &Value) -> bool {
    is_ready(pod) && !pod["metadata"]["deletionTimestamp"].is_string() && !is_finished(pod)
}

impl Audit {
    pub fn violations(&self) -> Vec<Violation> {
        self.violations
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub fn deletions(&self) -> Vec<Deletion> {
        self.deletions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub fn evictions(&self) -> Vec<Evicted> {
        self.evictions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Called once the eviction subresource deleted `pod` for `user`.
    pub fn evicted(&self, store: &Store, pod: &Value, user: &str) {
        let text = |value: &Value| value.as_str().unwrap_or_default().to_owned();
        let record = Evicted {
            namespace: text(&pod["metadata"]["namespace"]),
            pod: text(&pod["metadata"]["name"]),
            uid: text(&pod["metadata"]["uid"]),
            node: text(&pod["spec"]["nodeName"]),
            user: user.to_owned(),
            at: now_in_milliseconds(),
            revision: store.revision(),
        };
        self.evictions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(record);
    }

    pub fn node_writes(&self) -> Vec<NodeWrite> {
        self.node_writes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Called after `user` wrote the Node `name` through the API (its status, when `status`).
    pub fn node_written(&self, name: &str, status: bool, user: &str) {
        self.node_writes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(NodeWrite {
                name: name.to_owned(),
                status,
                user: user.to_owned(),
                at: now_in_milliseconds(),
            });
    }

    /// Called just before `object` of `resource` (plural) is deleted through the API by `user`;
    /// only pods, VolumeAttachments and Nodes are recorded.
    pub fn deleting(
        &self,
        store: &Store,
        resource: &str,
        object: &Value,
        grace_period_seconds: Option<i64>,
        user: &str,
    ) {
        if !matches!(resource, "pods" | "volumeattachments" | "nodes") {
            return;
        }
        let meta = &object["metadata"];
        let node = if resource == "nodes" {
            meta["name"].as_str()
        } else {
            object["spec"]["nodeName"].as_str()
        }
        .unwrap_or_default();
        let text = |value: &Value| value.as_str().unwrap_or_default().to_owned();
        let deletion = Deletion {
            resource: resource.to_owned(),
            namespace: text(&meta["namespace"]),
            name: text(&meta["name"]),
            uid: text(&meta["uid"]),
            node: node.to_owned(),
            provider_id: (resource == "nodes")
                .then(|| object["spec"]["providerID"].as_str().map(str::to_owned))
                .flatten(),
            finalizers: meta["finalizers"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|finalizer| finalizer.as_str().map(str::to_owned))
                .collect(),
            grace_period_seconds,
            user: user.to_owned(),
            at: now_in_milliseconds(),
            revision: store.revision(),
            kubelet: KubeletState::of_node(store, node),
        };
        self.deletions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(deletion);
    }

    /// Called just before `pod` is deleted through the API by `user`: records each budget of the
    /// pod whose healthy pods, without this one, are fewer than it desires.
    pub fn pod_leaving(&self, store: &Store, pod: &Value, by: Disruption, user: &str) {
        if !healthy(pod) {
            return;
        }
        let meta = &pod["metadata"];
        let namespace = meta["namespace"].as_str().unwrap_or_default();
        let budgets = store.kind("policy", "poddisruptionbudgets");
        let pods = store.kind("", "pods");
        for budget in store
            .list(&budgets, Some(namespace), None, 0, &|_| true)
            .items
        {
            // As the disruption controller counts: a nil selector selects nothing, `{}` all.
            if budget["spec"]["selector"].is_null() {
                continue;
            }
            let Ok(selector) = LabelSelector::from_object(&budget["spec"]["selector"]) else {
                continue;
            };
            let Some(desired) = budget["status"]["desiredHealthy"].as_i64() else {
                continue;
            };
            if !selector.matches(pod) {
                continue;
            }
            let others = store
                .list(&pods, Some(namespace), None, 0, &|other| {
                    other["metadata"]["uid"] != meta["uid"]
                        && selector.matches(other)
                        && healthy(other)
                })
                .items
                .len();
            let remaining = i64::try_from(others).unwrap_or(i64::MAX);
            if remaining < desired {
                self.violations
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(Violation {
                        namespace: namespace.to_owned(),
                        pod: meta["name"].as_str().unwrap_or_default().to_owned(),
                        budget: budget["metadata"]["name"]
                            .as_str()
                            .unwrap_or_default()
                            .to_owned(),
                        at: crate::store::timestamps::now_rfc3339(),
                        by,
                        healthy: remaining,
                        desired_healthy: desired,
                        status_healthy: budget["status"]["currentHealthy"]
                            .as_i64()
                            .unwrap_or_default(),
                        user: user.to_owned(),
                        revision: store.revision(),
                    });
            }
        }
    }
}
