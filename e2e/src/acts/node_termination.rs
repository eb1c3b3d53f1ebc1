//! Act: the operator deletes node-2 with `kubectl delete node`. termination-controller holds
//! it with its finalizer until the NodeDisruptionBudget grants it (node-1, down since act 2,
//! must boot first), cordons it, drains it tier by tier with one eviction queue per
//! PodDisruptionBudget, waits for a backup's pre-terminate hook, has kube-sim's cloud terminate
//! the machine, and only then lets the Node go — with no budget broken.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use serde_json::json;

use super::Act;
use crate::manifests::{self, describe_all};
use crate::observe::{http_get, node_condition};
use crate::stage::{AGENTS_NAMESPACE, Stage, TERMINATION_CONTROLLER};
use crate::timeline::seconds;
use crate::wait::poll_for;

pub const ACT: Act = Act {
    slug: "node-termination",
    title: "kubectl delete node node-2: drained within every budget, then its machine terminated",
    play: |stage| Box::pin(play(stage)),
};

const NODE: &str = "node-2";
const DOWN: &str = "node-1";
const NAMESPACE: &str = "fleet";
/// The pre-terminate hook a backup controller would set.
const BACKUP_HOOK: &str = "pre-terminate.nodegrace.io/backup";
pub(crate) const FLEET: &str = include_str!("../../demo/fleet.yaml");
/// Bounds each wait of a broken run; a working one takes seconds.
const TIMEOUT: Duration = Duration::from_secs(60);

async fn play(stage: &mut Stage) -> Result<()> {
    let client = stage.client().clone();
    let objects = manifests::parse_documents(FLEET)?;
    for object in &objects {
        manifests::create(&client, object, NAMESPACE).await?;
    }
    stage.timeline.event(&format!(
        "created {} (web and dns prefer {NODE}; web and dns have PDBs; the NDB lets one of the \
         3 nodes be disrupted)",
        describe_all(&objects)
    ));
    let on_node = wait_pods_on_node(&client).await?;
    stage.timeline.event(&format!(
        "on {NODE}: {}",
        on_node.keys().cloned().collect::<Vec<_>>().join(", ")
    ));
    stage
        .timeline
        .show(&format!("kubectl -n {NAMESPACE} get pods,pdb -o wide"));
    stage.timeline.show("kubectl get nodedisruptionbudgets");

    let nodes: Api<Node> = Api::all(client.clone());
    let hook = json!({"metadata": {"annotations": {BACKUP_HOOK: "copying the node's local disk"}}});
    nodes
        .patch(NODE, &PatchParams::default(), &Patch::Merge(&hook))
        .await
        .with_context(|| format!("annotate {NODE} with {BACKUP_HOOK}"))?;
    stage.timeline.event(&format!(
        "a backup controller marks {NODE} with {BACKUP_HOOK}: the machine must not go before \
         it has copied the node's disk"
    ));
    let departures = record_departures(&client);
    nodes
        .delete(NODE, &DeleteParams::default())
        .await
        .with_context(|| format!("delete {NODE}"))?;
    let deleted = Instant::now();
    // Told, not offered as a `$` command: typed on a kept cluster it would delete the node.
    stage.timeline.event(&format!(
        "the operator runs `kubectl delete node {NODE}`: the Node gets a deletionTimestamp, \
         the finalizer nodegrace.io/termination holds it"
    ));
    let waiting = wait_reason(&client, "AwaitingBudget").await?;
    stage.timeline.event(&format!(
        "{NODE} waits, untouched: {waiting} ({DOWN} has been down since act 2)"
    ));
    let status = stage.nodegrace(&["status"]).await?;
    if !status.contains("deleting (AwaitingBudget)") {
        bail!("kubectl nodegrace status does not show {NODE} waiting for its budget:\n{status}");
    }
    // The node is gone by the end: its condition is told, not offered as a command.
    stage.timeline.event(&format!("{DOWN} boots again"));
    stage.power_on(DOWN).await?;
    let booted = Instant::now();
    let granted = poll_for(TIMEOUT, || async {
        let condition = node_condition(&client, NODE, "Terminating").await.ok()??;
        (condition.reason.as_deref() != Some("AwaitingBudget")).then_some(())
    })
    .await;
    if granted.is_none() {
        bail!("{NODE} was not granted by the NodeDisruptionBudget after {DOWN} came back");
    }
    stage.timeline.event(&format!(
        "NodeDisruptionBudget workers granted {NODE} {} after {DOWN} was Ready again; {NODE} \
         is cordoned and drains",
        seconds(booted.elapsed())
    ));
    let held = wait_reason(&client, "AwaitingPreTerminateHooks").await?;
    stage
        .timeline
        .event(&format!("{NODE} is drained; its machine waits: {held}"));
    // The node is gone by the end: its story is told as run now.
    let story = stage.nodegrace_then(&["explain", "node", NODE]).await?;
    let unblock = format!("kubectl annotate node {NODE} {BACKUP_HOOK}-");
    if !story.contains(&format!("To unblock it:\n  {unblock}")) {
        bail!("kubectl nodegrace explain node {NODE} does not end with `{unblock}`:\n{story}");
    }
    // The node is gone by the end: its condition is told, not offered as a command.
    let terminate_calls =
        sim_get(&client, &format!("/sim/v1/instances/{NODE}")).await?["terminateCalls"]
            .as_u64()
            .unwrap_or_default();
    if terminate_calls != 0 {
        bail!("{NODE}'s machine was terminated while the pre-terminate hook held it");
    }
    let release = json!({"metadata": {"annotations": {BACKUP_HOOK: null}}});
    nodes
        .patch(NODE, &PatchParams::default(), &Patch::Merge(&release))
        .await
        .with_context(|| format!("remove {BACKUP_HOOK} from {NODE}"))?;
    stage.timeline.event(&format!(
        "the backup is done and its controller removes {BACKUP_HOOK}"
    ));
    wait_gone(&client, NODE).await?;
    stage.machine_terminated(NODE);
    let gone = deleted.elapsed();
    let departures = departures.await.unwrap_or_default();
    for line in tier_lines(&on_node, &departures) {
        stage.timeline.event(&line);
    }
    let instance: serde_json::Value =
        sim_get(&client, &format!("/sim/v1/instances/{NODE}")).await?;
    let calls = instance["terminateCalls"].as_u64().unwrap_or_default();
    if instance["state"] != "terminated" || calls != 1 {
        bail!("{NODE}'s machine: {instance}; expected terminated by exactly one call");
    }
    stage.timeline.event(&format!(
        "kube-sim's cloud: {NODE}'s machine terminated (1 terminate call); the finalizer went \
         and the Node with it, {} after the delete",
        seconds(gone)
    ));
    let judged = webhook_deletes(&client).await?;
    if judged == 0 {
        bail!(
            "termination-controller's admission webhook judged no Node DELETE: kube-sim did not \
             reach it through its Service"
        );
    }
    stage.timeline.event(&format!(
        "termination-controller's admission webhook judged the DELETE, called through its \
         Service (webhook_reviews_total{{operation=\"DELETE\"}} = {judged})"
    ));
    let violations: serde_json::Value = sim_get(&client, "/sim/v1/audit/violations").await?;
    let count = violations.as_array().map_or(0, Vec::len);
    if count != 0 {
        bail!("PodDisruptionBudget violations: {violations}");
    }
    stage.timeline.show("kubectl get nodes");
    stage
        .timeline
        .show(&format!("kubectl -n {NAMESPACE} get pods -o wide"));
    stage
        .timeline
        .show("kubectl get events -A --field-selector reason=Evicted");
    stage.timeline.pass(&format!(
        "{NODE} drained tier by tier and its machine terminated in {}, 0 PodDisruptionBudget \
         violations (kube-sim's audit)",
        seconds(gone)
    ));
    Ok(())
}

pub(crate) async fn sim_get(client: &Client, path: &str) -> Result<serde_json::Value> {
    let request = http::Request::get(path).body(Vec::new())?;
    let text = client.request_text(request).await?;
    Ok(serde_json::from_str(&text)?)
}

/// The fleet's pods on the node once all are Ready there: name → app.
pub(crate) async fn wait_pods_on_node(client: &Client) -> Result<BTreeMap<String, String>> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let found = poll_for(TIMEOUT, || async {
        let listed = pods
            .list(&kube::api::ListParams::default())
            .await
            .ok()?
            .items;
        let ready = |pod: &Pod| {
            pod.status
                .iter()
                .flat_map(|status| status.conditions.iter().flatten())
                .any(|condition| condition.type_ == "Ready" && condition.status == "True")
        };
        let on_node: BTreeMap<String, String> = listed
            .iter()
            .filter(|pod| {
                pod.spec.as_ref().and_then(|spec| spec.node_name.as_deref()) == Some(NODE)
            })
            .filter(|pod| ready(pod))
            .map(|pod| {
                let app = pod
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|labels| labels.get("app"))
                    .cloned()
                    .unwrap_or_default();
                (pod.metadata.name.clone().unwrap_or_default(), app)
            })
            .collect();
        // 4 web, 2 dns, 1 log-shipper.
        (on_node.len() == 7).then_some(on_node)
    })
    .await;
    found.with_context(|| {
        format!("the fleet's 7 pods did not all run Ready on {NODE} within {TIMEOUT:?}")
    })
}

/// When each of the fleet's pods on the node started terminating, relative to the delete.
fn record_departures(client: &Client) -> tokio::task::JoinHandle<Vec<(Duration, String)>> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let started = Instant::now();
    tokio::spawn(async move {
        let mut seen = Vec::new();
        let config = watcher::Config::default().fields(&format!("spec.nodeName={NODE}"));
        let mut events = std::pin::pin!(watcher(pods, config).default_backoff().applied_objects());
        let deadline = tokio::time::Instant::now() + TIMEOUT * 2;
        while let Ok(Some(event)) = tokio::time::timeout_at(deadline, events.next()).await {
            let Ok(pod) = event else { continue };
            let name = pod.metadata.name.clone().unwrap_or_default();
            if pod.metadata.deletion_timestamp.is_some() && !seen.iter().any(|(_, n)| n == &name) {
                seen.push((started.elapsed(), name));
                if seen.len() == 7 {
                    break;
                }
            }
        }
        seen
    })
}

/// One line per tier and budget: which pods left when.
fn tier_lines(
    on_node: &BTreeMap<String, String>,
    departures: &[(Duration, String)],
) -> Vec<String> {
    let groups = [
        (
            "tier 1, workloads — PDB fleet/web (maxUnavailable 1), one at a time",
            "web",
        ),
        ("tier 2, DaemonSet pods", "log-shipper"),
        (
            "tier 3, critical workloads — PDB fleet/dns (minAvailable 1)",
            "dns",
        ),
    ];
    groups
        .iter()
        .map(|(label, app)| {
            let times: Vec<String> = departures
                .iter()
                .filter(|(_, pod)| on_node.get(pod).map(String::as_str) == Some(*app))
                .map(|(at, pod)| format!("{pod} at +{}", seconds(*at)))
                .collect();
            format!("{label}: {}", times.join(", "))
        })
        .collect()
}

async fn wait_reason(client: &Client, reason: &str) -> Result<String> {
    wait_terminating(client, NODE, |condition_reason, _| {
        condition_reason == reason
    })
    .await
    .with_context(|| format!("no Terminating condition with reason {reason}"))
}

/// The message of `node`'s Terminating condition once `matches(reason, message)`.
pub(crate) async fn wait_terminating(
    client: &Client,
    node: &str,
    matches: impl Fn(&str, &str) -> bool,
) -> Result<String> {
    let found = poll_for(TIMEOUT, || async {
        let condition = node_condition(client, node, "Terminating").await.ok()??;
        let reason = condition.reason.unwrap_or_default();
        let message = condition.message.unwrap_or_default();
        matches(&reason, &message).then_some(message)
    })
    .await;
    found.with_context(|| format!("{node}'s Terminating condition after {TIMEOUT:?}"))
}

/// Waits until `node` is gone: its finalizer released it.
pub(crate) async fn wait_gone(client: &Client, node: &str) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let gone = poll_for(TIMEOUT, || async {
        nodes.get_opt(node).await.ok()?.is_none().then_some(())
    })
    .await;
    gone.with_context(|| format!("{node} still exists {TIMEOUT:?} later"))
}

/// The chart's admin port, where each replica serves its metrics.
const CONTROLLER_ADMIN_PORT: u16 = 9454;

/// How many Node DELETEs the controller's webhook judged, summed over its replicas' metrics.
async fn webhook_deletes(client: &Client) -> Result<u64> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), AGENTS_NAMESPACE);
    let params =
        ListParams::default().labels(&format!("app.kubernetes.io/name={TERMINATION_CONTROLLER}"));
    let mut judged = 0.0;
    for pod in pods.list(&params).await?.items {
        let Some(ip) = pod.status.and_then(|status| status.pod_ip) else {
            continue;
        };
        let metrics = http_get(&format!("{ip}:{CONTROLLER_ADMIN_PORT}"), "/metrics")
            .await
            .unwrap_or_default();
        judged += metrics
            .lines()
            .filter(|line| {
                line.starts_with("nodegrace_termination_controller_webhook_reviews_total{")
                    && line.contains("operation=\"DELETE\"")
            })
            .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>();
    }
    // A counter of a few reviews: exact as a float.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    Ok(judged as u64)
}
