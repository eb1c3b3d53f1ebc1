//! Readers of what the programs wrote, as a test asks for it: Events about a node, a node's
//! conditions, the pods on a node. Each reads afresh from the API server.

use anyhow::Result;
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{ListParams, PostParams};
use kube::{Api, Client};
use nodegrace_core::k8s::nodes::has_condition;

use crate::wait_for;

/// One condition of a Node, as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConditionSeen {
    pub status: String,
    pub reason: String,
    pub message: String,
    /// `lastTransitionTime`, as the API server wrote it.
    pub since: String,
}

/// The condition `type_` of the Node `node`; `None` when the node or the condition is not
/// there.
pub async fn node_condition(
    client: &Client,
    node: &str,
    type_: &str,
) -> Result<Option<ConditionSeen>> {
    let nodes: Api<Node> = Api::all(client.clone());
    Ok(nodes.get_opt(node).await?.and_then(|node| {
        node.status?
            .conditions?
            .into_iter()
            .find(|condition| condition.type_ == type_)
            .map(|condition| ConditionSeen {
                status: condition.status,
                reason: condition.reason.unwrap_or_default(),
                message: condition.message.unwrap_or_default(),
                since: condition
                    .last_transition_time
                    .map(|time| time.0.to_string())
                    .unwrap_or_default(),
            })
    }))
}

/// Every core/v1 Event with `reason`, about any object.
pub async fn events_with_reason(client: &Client, reason: &str) -> Result<Vec<Event>> {
    let all: Api<Event> = Api::all(client.clone());
    Ok(all
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|event| event.reason.as_deref() == Some(reason))
        .collect())
}

/// The Events about the object named `name` (a node), in the order they happened.
pub async fn events_about(client: &Client, name: &str) -> Result<Vec<Event>> {
    let all: Api<Event> = Api::all(client.clone());
    let mut about = all
        .list(&ListParams::default().fields(&format!("involvedObject.name={name}")))
        .await?
        .items;
    about.sort_by_key(|event| {
        event
            .event_time
            .as_ref()
            .map(|time| time.0)
            .or(event.first_timestamp.as_ref().map(|time| time.0))
    });
    Ok(about)
}

/// The reasons of the Events about `name`, in the order they happened.
pub async fn event_reasons(client: &Client, name: &str) -> Result<Vec<String>> {
    Ok(events_about(client, name)
        .await?
        .into_iter()
        .filter_map(|event| event.reason)
        .collect())
}

/// The messages of the Events with `reason` about `name`.
pub async fn event_notes(client: &Client, name: &str, reason: &str) -> Result<Vec<String>> {
    Ok(events_about(client, name)
        .await?
        .into_iter()
        .filter(|event| event.reason.as_deref() == Some(reason))
        .filter_map(|event| event.message)
        .collect())
}

pub async fn has_event(client: &Client, name: &str, reason: &str) -> Result<bool> {
    Ok(event_reasons(client, name)
        .await?
        .iter()
        .any(|seen| seen == reason))
}

/// Waits for an Event with `reason` about `name`: Events are written after the acts they
/// report, so one may land after the object itself is gone.
pub async fn event_seen(client: &Client, name: &str, reason: &str) -> Result<()> {
    wait_for(&format!("a {reason} Event about {name}"), || {
        has_event(client, name, reason)
    })
    .await
}

/// The pods bound to `node`, in every namespace.
pub async fn pods_on(client: &Client, node: &str) -> Result<Vec<Pod>> {
    let pods: Api<Pod> = Api::all(client.clone());
    Ok(pods
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await?
        .items)
}

/// Whether the node reports Ready.
pub fn is_ready(node: &Node) -> bool {
    has_condition(node, "Ready", "True")
}

/// Waits until the cluster has `count` nodes and every one is Ready.
pub async fn all_ready(client: &Client, count: usize) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    wait_for("every node Ready", || async {
        let listed = nodes.list(&ListParams::default()).await?.items;
        Ok(listed.len() == count && listed.iter().all(is_ready))
    })
    .await
}

/// A Node as a cloud's node controller or Cluster API registers it: named, with its hostname
/// label, its machine's providerID and `annotations`. (kube-sim gives a Node made this way a
/// simulated kubelet, which makes it Ready.)
pub async fn machine_node(
    client: &Client,
    name: &str,
    provider_id: &str,
    annotations: Option<std::collections::BTreeMap<String, String>>,
) -> Result<()> {
    let node = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}, "annotations": annotations},
        "spec": {"providerID": provider_id},
    }))?;
    Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node)
        .await?;
    Ok(())
}

/// Whether a VolumeAttachment names `node`.
pub async fn has_attachment(client: &Client, node: &str) -> Result<bool> {
    let attachments: Api<VolumeAttachment> = Api::all(client.clone());
    Ok(attachments
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .any(|attachment| attachment.spec.node_name == node))
}

/// Creates `body`, an object of any kind the cluster serves, given as its manifest (its
/// `metadata.namespace` says where; none, cluster-scoped).
pub async fn create(client: &Client, body: serde_json::Value) -> Result<()> {
    use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
    let api_version = body["apiVersion"].as_str().unwrap_or_default();
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let kind = body["kind"].as_str().unwrap_or_default();
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind));
    let api: Api<DynamicObject> = match body["metadata"]["namespace"].as_str() {
        Some(namespace) => Api::namespaced_with(client.clone(), namespace, &resource),
        None => Api::all_with(client.clone(), &resource),
    };
    api.create(&PostParams::default(), &serde_json::from_value(body)?)
        .await?;
    Ok(())
}

/// kube-sim's simulated kubelet of `node` stops (`Some("stopped")`: no more Lease renewals or
/// status reports, as when its machine dies) or runs again (`None`).
pub async fn set_kubelet(client: &Client, node: &str, state: Option<&str>) -> Result<()> {
    use kube::api::{Patch, PatchParams};
    let annotations =
        serde_json::json!({"metadata": {"annotations": {"sim.nodegrace.io/kubelet": state}}});
    Api::<Node>::all(client.clone())
        .patch(node, &PatchParams::default(), &Patch::Merge(annotations))
        .await?;
    Ok(())
}
