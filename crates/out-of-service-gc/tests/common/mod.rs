//! What every test of the controller against kube-sim shares: the world's timings, the
//! controller started in-process, and the node and pod moves an outage is made of.
#![allow(dead_code, unused_imports)] // the bench uses a part only

use std::time::{Duration, Instant};

use anyhow::Result;
use clap::Parser;
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim, Pod, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use kube_sim::cluster::Cluster;
use kube_sim::{KubeSim, WorldOptions};
use nodegrace_core::k8s::taints::change_taints;
use nodegrace_testing::cluster::node_condition;
pub use nodegrace_testing::cluster::{
    all_ready, event_reasons, events_with_reason, has_attachment, is_ready, machine_node,
};
pub use nodegrace_testing::wait_for;
use nodegrace_testing::{ProgramUnderTest, command_line};
use out_of_service_gc::app::{self, PROGRAM};
use out_of_service_gc::cli::Args;
use serde_json::json;
use tokio_util::sync::CancellationToken;

pub const TAINT: &str = "node.kubernetes.io/out-of-service";
const METRICS_PREFIX: &str = "nodegrace_out_of_service_gc";

pub fn world() -> WorldOptions {
    WorldOptions {
        lease_renew_interval: Duration::from_millis(100),
        node_monitor_grace: Duration::from_millis(600),
        detach_delay: Duration::from_millis(200),
        // The KCM-like sweep is out of the way unless a test brings it closer.
        pod_gc_period: Duration::from_secs(3600),
        ..WorldOptions::default()
    }
}

pub async fn sim(nodes: usize, world: WorldOptions) -> Result<KubeSim> {
    Ok(Cluster::new(nodes).world(world).start().await?)
}

/// Starts the controller against `sim` with `flags`; the guard window is 1 s unless given.
pub async fn controller(sim: &KubeSim, flags: &[&str]) -> Result<ProgramUnderTest> {
    let defaults = [
        format!("--kubeconfig={}", sim.kubeconfig_path().display()),
        "--admin-listen=127.0.0.1:0".to_owned(),
        "--liveness-guard-window=1s".to_owned(),
    ];
    let args = Args::try_parse_from(command_line(PROGRAM, &defaults, flags))?;
    ProgramUnderTest::start(METRICS_PREFIX, |stop| app::start(args, stop)).await
}

pub fn pod(name: &str, node: &str, extra: &serde_json::Value) -> Result<Pod> {
    let mut pod = json!({"metadata": {"name": name}, "spec": {"nodeName": node, "containers": [{"name": "c", "image": "app"}]}});
    if let (Some(target), Some(extra)) = (pod.as_object_mut(), extra.as_object()) {
        for (key, value) in extra {
            if let (Some(existing), Some(more)) = (
                target.get_mut(key).and_then(|v| v.as_object_mut()),
                value.as_object(),
            ) {
                existing.extend(more.clone());
            } else {
                target.insert(key.clone(), value.clone());
            }
        }
    }
    Ok(serde_json::from_value(pod)?)
}

pub async fn running_pods(client: &Client, node: &str, count: usize) -> Result<Vec<String>> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let mut names = Vec::new();
    for index in 0..count {
        let name = format!("{node}-app-{index}");
        pods.create(&PostParams::default(), &pod(&name, node, &json!({}))?)
            .await?;
        names.push(name);
    }
    wait_for("the pods to run", || async {
        let listed = pods
            .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
            .await?;
        Ok(listed
            .items
            .iter()
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
            .count()
            >= count)
    })
    .await?;
    Ok(names)
}

/// The node's simulated kubelet stops: no more Lease renewals or status reports.
pub async fn stop_kubelet(client: &Client, node: &str) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {"sim.nodegrace.io/kubelet": "stopped"}}}),
            ),
        )
        .await?;
    Ok(())
}

/// The node's kubelet stops (a hard power-off) and the node is seen NotReady.
pub async fn kill(client: &Client, node: &str) -> Result<()> {
    stop_kubelet(client, node).await?;
    let nodes: Api<Node> = Api::all(client.clone());
    wait_for("the node to be NotReady", || async {
        Ok(!is_ready(&nodes.get(node).await?))
    })
    .await
}

pub async fn revive(client: &Client, node: &str) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"sim.nodegrace.io/kubelet": null}}})),
        )
        .await?;
    Ok(())
}

pub async fn taint(client: &Client, node: &str) -> Result<()> {
    taint_with_effect(client, node, "NoExecute").await
}

pub async fn taint_with_effect(client: &Client, node: &str, effect: &str) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    change_taints(&nodes, node, |_, taints| {
        taints.push(Taint {
            key: TAINT.to_owned(),
            value: Some("nodeshutdown".to_owned()),
            effect: effect.to_owned(),
            time_added: None,
        });
        true
    })
    .await?;
    Ok(())
}

/// The spec of a 1 GiB ReadWriteOnce claim, which kube-sim's provisioner binds.
pub fn claim_spec() -> serde_json::Value {
    json!({"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}})
}

/// Creates the claim `name` in `default` (see [`claim_spec`]).
pub async fn create_claim(client: &Client, name: &str) -> Result<Api<PersistentVolumeClaim>> {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    claims
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": name}, "spec": claim_spec()}))?,
        )
        .await?;
    Ok(claims)
}

pub fn has_taint(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == TAINT))
}

pub async fn pod_names(client: &Client, node: &str) -> Result<Vec<String>> {
    let pods: Api<Pod> = Api::all(client.clone());
    Ok(pods
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await?
        .items
        .into_iter()
        .filter_map(|pod| pod.metadata.name)
        .collect())
}

/// Renews `node`'s Lease every 200 ms (the kubelet's period, shortened) with a `renewTime` ten
/// minutes in the past (a kubelet whose clock is late), until `stop` is cancelled; returns when
/// the last renewal was written.
pub async fn renew_late(
    client: kube::Client,
    node: &str,
    stop: CancellationToken,
) -> Result<Instant> {
    let leases: Api<Lease> = Api::namespaced(client, "kube-node-lease");
    let mut period = tokio::time::interval(Duration::from_millis(200));
    let mut last = Instant::now();
    loop {
        tokio::select! {
            () = stop.cancelled() => return Ok(last),
            _ = period.tick() => {}
        }
        let late = Timestamp::now() - SignedDuration::from_mins(10);
        leases
            .patch(
                node,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"renewTime": MicroTime(late)}})),
            )
            .await?;
        last = Instant::now();
    }
}

/// The node's `OutOfServiceCleanup` condition, as its status and reason.
pub async fn condition(client: &Client, node: &str) -> Result<Option<(String, String)>> {
    Ok(node_condition(client, node, "OutOfServiceCleanup")
        .await?
        .map(|seen| (seen.status, seen.reason)))
}
