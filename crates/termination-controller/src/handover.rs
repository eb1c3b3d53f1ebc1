//! `--eviction-api=eviction-request`: the drain hands each pod to its eviction responders
//! through Kubernetes 1.37's EvictionRequest API (lifecycle.k8s.io/v1alpha1, KEP-4563) instead
//! of calling `pods/eviction` itself.
//!
//! One EvictionRequest per pod, named by the pod's UID, requester
//! `nodegrace.io/termination-controller`, target by name and UID, labelled with the node (name
//! and UID) whose drain asked for it. The evictionrequest-controller turns it into an
//! `Eviction` and hands the pod to its responders by priority, the imperative evictor (which
//! calls `pods/eviction`, so PodDisruptionBudgets decide) last. The drain reads those
//! Evictions to tell who holds a pod and why.
//!
//! A request lives only while its node's termination needs it: the drain closes it (intent
//! `Withdrawn`, then deleted) once its pod is gone, when the pod turns do-not-evict, at the
//! drain deadline, and at the drain's end; [`sweep`] closes the rest — those of nodes gone,
//! released, replaced or no longer deleting (the finalizer removed by hand, a restart, a
//! leader change) — after a fresh read of their node.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::lifecycle::v1alpha1::{Eviction, EvictionRequest};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::watcher;
use kube::{Api, Client};
use nodegrace_core::k8s::api_errors::status_code;
use nodegrace_core::k8s::watched::{WatchCounters, Watched};
use serde_json::json;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::metrics::{ActionLabel, Metrics, ResponderLabels};

/// Who this controller is among a pod's requesters.
pub const REQUESTER: &str = "nodegrace.io/termination-controller";
/// The node whose drain requested the pod, by name and by UID.
pub const NODE_LABEL: &str = "nodegrace.io/node";
pub const NODE_UID_LABEL: &str = "nodegrace.io/node-uid";
/// The group version the API is served under.
pub const GROUP_VERSION: &str = "lifecycle.k8s.io/v1alpha1";
/// What the default evictor's message says when the Eviction API refused it.
pub const EVICTOR_REFUSED: &str = "pod deletion via the /eviction subresource failed";
/// How often [`sweep`] looks for requests no termination needs, besides when woken.
const SWEEP_EVERY: Duration = Duration::from_secs(30);

/// The requests of ours and the Evictions they became, watched.
#[derive(Clone)]
pub struct Handover {
    pub requests: Watched<EvictionRequest>,
    pub evictions: Watched<Eviction>,
    /// Wakes [`sweep`]: a node's termination ended.
    pub ended: Arc<Notify>,
}

impl std::fmt::Debug for Handover {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handover").finish_non_exhaustive()
    }
}

/// Whether the cluster serves the EvictionRequest API (its discovery lists the resource).
pub async fn served(client: &Client) -> bool {
    client
        .list_api_group_resources(GROUP_VERSION)
        .await
        .is_ok_and(|list| list.resources.iter().any(|r| r.name == "evictionrequests"))
}

fn trim_request(request: &mut EvictionRequest) {
    request.metadata.managed_fields = None;
}

fn trim_eviction(eviction: &mut Eviction) {
    eviction.metadata.managed_fields = None;
}

impl Handover {
    /// Watches our requests (by their node label) and the Evictions that name us a requester.
    pub fn start(client: &Client) -> Self {
        let requests = Watched::start_trimmed(
            Api::all(client.clone()),
            watcher::Config::default().labels(NODE_UID_LABEL),
            WatchCounters::default(),
            trim_request,
        );
        let evictions = Watched::start_trimmed(
            Api::all(client.clone()),
            watcher::Config::default().labels(REQUESTER),
            WatchCounters::default(),
            trim_eviction,
        );
        Self {
            requests,
            evictions,
            ended: Arc::new(Notify::new()),
        }
    }

    pub async fn synced(&self) -> Result<(), nodegrace_core::k8s::watched::WatchEnded> {
        self.requests.synced().await?;
        self.evictions.synced().await
    }

    /// Our open request for `pod`: named by its UID, wanting the eviction.
    pub fn open_for(&self, pod: &Pod) -> Option<Arc<EvictionRequest>> {
        let uid = pod.metadata.uid.as_deref()?;
        self.requests
            .get(pod.metadata.namespace.as_deref(), uid)
            .filter(|request| {
                request.spec.intent == "Eviction" && request.metadata.deletion_timestamp.is_none()
            })
    }

    /// Our requests made for the node with `node_uid`.
    pub fn of_node(&self, node_uid: &str) -> Vec<Arc<EvictionRequest>> {
        self.requests
            .state()
            .into_iter()
            .filter(|request| label(&request.metadata, NODE_UID_LABEL) == Some(node_uid))
            .collect()
    }

    /// The latest Eviction of the pod with `uid` in `namespace`.
    pub fn eviction_of(&self, namespace: &str, uid: &str) -> Option<Arc<Eviction>> {
        self.evictions
            .state()
            .into_iter()
            .filter(|eviction| {
                eviction.metadata.namespace.as_deref() == Some(namespace)
                    && eviction
                        .spec
                        .target
                        .pod
                        .as_ref()
                        .map(|pod| pod.uid.as_str())
                        == Some(uid)
            })
            .max_by_key(|eviction| eviction.metadata.creation_timestamp.clone().map(|t| t.0))
    }
}

fn label<'a>(
    metadata: &'a k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    key: &str,
) -> Option<&'a str> {
    metadata.labels.as_ref()?.get(key).map(String::as_str)
}

/// Who holds a requested pod and why, from its Eviction: the active responder, its message and
/// expected completion, and the responders passed over for a missed heartbeat.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Holder {
    pub responder: Option<String>,
    pub message: Option<String>,
    pub expected: Option<String>,
    pub passed_over: Vec<String>,
}

impl Holder {
    pub fn of(eviction: &Eviction) -> Self {
        let Some(status) = eviction.status.as_ref() else {
            return Self::default();
        };
        let states = status.target_responders.as_deref().unwrap_or_default();
        let entries = status.responders.as_deref().unwrap_or_default();
        let active = states.iter().find(|state| state.state == "Active");
        let entry =
            active.and_then(|active| entries.iter().find(|entry| entry.name == active.name));
        Self {
            responder: active.map(|active| active.name.clone()),
            message: entry.and_then(|entry| entry.message.clone()),
            expected: entry
                .and_then(|entry| entry.expected_completion_time.as_ref())
                .map(|time| time.0.to_string()),
            passed_over: states
                .iter()
                .filter(|state| state.state == "Interrupted")
                .map(|state| state.name.clone())
                .collect(),
        }
    }

    /// One line for the node's condition and the blocker lists.
    pub fn describe(&self) -> String {
        let mut said = match &self.responder {
            Some(responder) => format!("handed to {responder}"),
            None => "eviction requested; no responder active yet".to_owned(),
        };
        if let Some(message) = &self.message {
            let _ = write!(said, ": {message}");
        }
        if let Some(expected) = &self.expected {
            let _ = write!(said, " (expected done by {expected})");
        }
        if !self.passed_over.is_empty() {
            let _ = write!(
                said,
                "; passed over for a missed heartbeat: {}",
                self.passed_over.join(", ")
            );
        }
        said
    }
}

/// What asking for a pod's eviction came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Asked {
    /// The request exists and wants the eviction.
    Requested,
    /// The pod is gone, or another pod has its name: nothing to ask.
    Gone,
    Failed,
}

/// Requests `pod`'s eviction for the drain of `node` (name, UID). A request of that name that
/// is already there (a restart, another leader) is ours: it is made to want the eviction again.
pub async fn request(client: &Client, metrics: &Metrics, node: (&str, &str), pod: &Pod) -> Asked {
    let (Some(namespace), Some(name), Some(uid)) = (
        pod.metadata.namespace.as_deref(),
        pod.metadata.name.as_deref(),
        pod.metadata.uid.as_deref(),
    ) else {
        return Asked::Gone;
    };
    let api: Api<EvictionRequest> = Api::namespaced(client.clone(), namespace);
    let wanted: EvictionRequest = match serde_json::from_value(json!({
        "metadata": {
            "name": uid,
            "labels": {NODE_LABEL: node.0, NODE_UID_LABEL: node.1},
        },
        "spec": {
            "requester": REQUESTER,
            "intent": "Eviction",
            "target": {"pod": {"name": name, "uid": uid}},
        },
    })) {
        Ok(request) => request,
        Err(_) => return Asked::Failed,
    };
    match api.create(&PostParams::default(), &wanted).await {
        Ok(_) => {
            metrics
                .handover_requests
                .get_or_create(&ActionLabel { action: "created" })
                .inc();
            Asked::Requested
        }
        Err(error) if status_code(&error) == Some(409) => {
            let renewed = api
                .patch(
                    uid,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"intent": "Eviction"}})),
                )
                .await;
            if renewed.is_ok() {
                Asked::Requested
            } else {
                Asked::Failed
            }
        }
        Err(error) if status_code(&error) == Some(404) => Asked::Gone,
        Err(error) => {
            tracing::warn!(pod = %format!("{namespace}/{name}"), error = %nodegrace_core::error_chain::Chain(&error), "creating the EvictionRequest failed");
            metrics.error("evictionrequest");
            Asked::Failed
        }
    }
}

/// Closes one request: withdrawn (so the responders stop), counted, then deleted, the delete
/// bound to this request's UID (a new request of the same name is not ours to delete).
pub async fn close(
    client: &Client,
    metrics: &Metrics,
    handover: &Handover,
    request: &EvictionRequest,
) {
    let (Some(namespace), Some(name)) = (
        request.metadata.namespace.as_deref(),
        request.metadata.name.as_deref(),
    ) else {
        return;
    };
    let api: Api<EvictionRequest> = Api::namespaced(client.clone(), namespace);
    if request.spec.intent != "Withdrawn" {
        let withdrawn = api
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({
                    "metadata": {"uid": request.metadata.uid},
                    "spec": {"intent": "Withdrawn"},
                })),
            )
            .await;
        match withdrawn {
            Ok(_) => {
                metrics
                    .handover_requests
                    .get_or_create(&ActionLabel {
                        action: "withdrawn",
                    })
                    .inc();
            }
            Err(error) if matches!(status_code(&error), Some(404 | 422 | 409)) => return,
            Err(error) => {
                tracing::warn!(request = %format!("{namespace}/{name}"), error = %nodegrace_core::error_chain::Chain(&error), "withdrawing the EvictionRequest failed");
                metrics.error("evictionrequest");
                return;
            }
        }
    }
    if let Some(eviction) = handover.eviction_of(namespace, name) {
        count_outcomes(metrics, &eviction);
    }
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: request.metadata.uid.clone(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    if let Err(error) = api.delete(name, &params).await
        && !matches!(status_code(&error), Some(404 | 409))
    {
        tracing::warn!(request = %format!("{namespace}/{name}"), error = %nodegrace_core::error_chain::Chain(&error), "deleting the EvictionRequest failed");
        metrics.error("evictionrequest");
    }
}

fn count_outcomes(metrics: &Metrics, eviction: &Eviction) {
    let states = eviction
        .status
        .as_ref()
        .and_then(|status| status.target_responders.as_deref())
        .unwrap_or_default();
    for state in states {
        if matches!(
            state.state.as_str(),
            "Completed" | "Interrupted" | "Canceled"
        ) {
            metrics
                .responder_outcomes
                .get_or_create(&ResponderLabels {
                    responder: state.name.clone(),
                    outcome: state.state.clone(),
                })
                .inc();
        }
    }
}

/// Whether the node a request names is still being terminated under our finalizer, by a fresh
/// read: the same Node object (by UID), deleting, holding the finalizer.
async fn still_terminating(nodes: &Api<Node>, name: &str, uid: &str) -> Option<bool> {
    match nodes.get_opt(name).await {
        Ok(None) => Some(false),
        Ok(Some(node)) => Some(
            node.metadata.uid.as_deref() == Some(uid)
                && node.metadata.deletion_timestamp.is_some()
                && node
                    .metadata
                    .finalizers
                    .iter()
                    .flatten()
                    .any(|finalizer| finalizer == crate::api::FINALIZER),
        ),
        // Unknown: a request stays rather than be closed on a guess.
        Err(_) => None,
    }
}

/// Closes the requests no node's termination needs, at once, when woken by
/// [`Handover::ended`], and every 30 s, while this process leads.
pub async fn sweep(client: Client, metrics: Metrics, handover: Handover, stop: CancellationToken) {
    let nodes: Api<Node> = Api::all(client.clone());
    loop {
        let mut by_node: BTreeMap<(String, String), Vec<Arc<EvictionRequest>>> = BTreeMap::new();
        for request in handover.requests.state() {
            let node = label(&request.metadata, NODE_LABEL)
                .unwrap_or_default()
                .to_owned();
            let uid = label(&request.metadata, NODE_UID_LABEL)
                .unwrap_or_default()
                .to_owned();
            by_node.entry((node, uid)).or_default().push(request);
        }
        for ((node, uid), requests) in by_node {
            if still_terminating(&nodes, &node, &uid).await == Some(false) {
                tracing::info!(
                    node,
                    count = requests.len(),
                    "closing the EvictionRequests of a node no longer being terminated"
                );
                for request in requests {
                    close(&client, &metrics, &handover, &request).await;
                }
            }
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = handover.ended.notified() => {}
            () = tokio::time::sleep(SWEEP_EVERY) => {}
        }
    }
}

/// Lists the requests of ours still there (for tests and `plan`): by the node label.
pub async fn list(client: &Client) -> kube::Result<Vec<EvictionRequest>> {
    let api: Api<EvictionRequest> = Api::all(client.clone());
    Ok(api
        .list(&ListParams::default().labels(NODE_UID_LABEL))
        .await?
        .items)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_holder_names_the_active_responder_its_message_and_who_was_passed_over() {
        let eviction: Eviction = serde_json::from_value(json!({
            "metadata": {"name": "pod-1-db-0", "namespace": "default"},
            "spec": {"target": {"pod": {"name": "db-0", "uid": "u"}}},
            "status": {
                "targetResponders": [
                    {"name": "db.example.com/failover", "priority": 10000, "state": "Interrupted"},
                    {"name": "imperative-eviction.k8s.io/evictor", "priority": 100, "state": "Active"},
                ],
                "responders": [
                    {"name": "db.example.com/failover", "startTime": "2026-11-30T10:00:00Z"},
                    {"name": "imperative-eviction.k8s.io/evictor", "startTime": "2026-11-30T10:20:00Z",
                     "message": "\"db-0\" pod deletion via the /eviction subresource failed (attempts=2): Cannot evict pod"},
                ],
            },
        }))
        .unwrap();
        let holder = Holder::of(&eviction);
        assert_eq!(
            holder.responder.as_deref(),
            Some("imperative-eviction.k8s.io/evictor")
        );
        assert_eq!(holder.passed_over, ["db.example.com/failover"]);
        let said = holder.describe();
        assert!(
            said.starts_with("handed to imperative-eviction.k8s.io/evictor: \"db-0\" pod deletion"),
            "{said}"
        );
        assert!(
            said.ends_with("passed over for a missed heartbeat: db.example.com/failover"),
            "{said}"
        );
    }
}
