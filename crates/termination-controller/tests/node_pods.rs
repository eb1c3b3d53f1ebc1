//! A drain's view of its node's pods (`NodePods`): listed once, then watched from that list's
//! version only when the drain waits; against kube-sim's watch, its closed watches and its
//! expired history.

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use kube_sim::faults::{ErrorRule, FailureKind};
use nodegrace_testing::WAIT;
use serde_json::json;
use termination_controller::node_pods::NodePods;

use crate::common;

async fn pod(pods: &Api<Pod>, name: &str, node: &str) -> Result<()> {
    let pod = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]},
    }))?;
    pods.create(&PostParams::default(), &pod).await?;
    Ok(())
}

fn names(node_pods: &NodePods) -> BTreeSet<String> {
    node_pods
        .state()
        .iter()
        .filter_map(|pod| pod.metadata.name.clone())
        .collect()
}

/// Waits (with the tests' deadline) until the pods seen are `expected`, taking each change.
async fn until_seen(node_pods: &mut NodePods, expected: &[&str]) -> Result<()> {
    let expected: BTreeSet<String> = expected.iter().map(|&name| name.to_owned()).collect();
    tokio::time::timeout(WAIT, async {
        while names(node_pods) != expected {
            node_pods.changed().await;
        }
    })
    .await
    .with_context(|| format!("pods seen {:?}, expected {expected:?}", names(node_pods)))
}

#[tokio::test]
async fn the_pods_listed_are_watched_from_the_list_on() -> Result<()> {
    let sim = common::sim(2).await?;
    let client = sim.client();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pod(&pods, "a", "node-1").await?;
    pod(&pods, "elsewhere", "node-2").await?;
    let mut node_pods = NodePods::new(Api::all(client.clone()), "node-1", |_| {});
    node_pods.listed().await?;
    ensure!(names(&node_pods) == BTreeSet::from(["a".to_owned()]));
    // Created after the list and before any watch: the watch from the list's version has it.
    pod(&pods, "b", "node-1").await?;
    until_seen(&mut node_pods, &["a", "b"]).await?;
    pods.delete("a", &DeleteParams::default().grace_period(0))
        .await?;
    until_seen(&mut node_pods, &["b"]).await?;

    // A watch the server closes resumes from the version seen.
    sim.faults().close_watches();
    pod(&pods, "c", "node-1").await?;
    until_seen(&mut node_pods, &["b", "c"]).await?;

    // A version the server no longer has (410 Gone) is listed again; what happened meanwhile,
    // a deletion included, is seen.
    sim.store().compact();
    sim.faults().close_watches();
    pods.delete("b", &DeleteParams::default().grace_period(0))
        .await?;
    pod(&pods, "d", "node-1").await?;
    until_seen(&mut node_pods, &["c", "d"]).await?;

    // Failing watches keep the pods last seen and are tried again after their backoff.
    sim.faults().add_rule(ErrorRule {
        verb: "watch".to_owned(),
        resource: "pods".to_owned(),
        rate: 1.0,
        failure: FailureKind::InternalError,
    });
    let failed_before = sim.faults().failed();
    sim.faults().close_watches();
    tokio::time::timeout(WAIT, async {
        while sim.faults().failed() == failed_before {
            // Status updates of the pods seen may still come first.
            let _ = tokio::time::timeout(Duration::from_millis(50), node_pods.changed()).await;
        }
    })
    .await
    .context("the watch was not tried again")?;
    pod(&pods, "e", "node-1").await?;
    let seen = tokio::time::timeout(
        Duration::from_millis(300),
        until_seen(&mut node_pods, &["c", "d", "e"]),
    )
    .await;
    ensure!(
        seen.is_err(),
        "a pod is seen while every watch fails: {:?}",
        names(&node_pods)
    );
    sim.faults().clear();
    until_seen(&mut node_pods, &["c", "d", "e"]).await?;
    Ok(())
}

/// The controller's pod lists so far.
fn pod_lists(sim: &kube_sim::KubeSim) -> u64 {
    sim.requests()
        .of("nodegrace-termination-controller")
        .iter()
        .filter(|(kind, _)| kind.verb == "list" && kind.resource == "pods")
        .map(|(_, count)| count)
        .sum()
}

/// A drain lists the node's pods before its cordon and watches them only once it waits. A pod
/// bound after that list and before the cordon, on a node with nothing else to drain, is
/// still evicted: a drain done on a view from before its cordon lists again.
#[tokio::test]
async fn a_pod_bound_between_the_list_and_the_cordon_is_evicted() -> Result<()> {
    let sim = common::sim(2).await?;
    let client = sim.client();
    let _controller = common::managing(&sim, &[]).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    // Every request takes 400 ms: the cordon (a read, then a write) lands 800 ms after the list.
    sim.faults().set_latency(Duration::from_millis(400));
    let lists_before = pod_lists(&sim);
    common::delete_node(&client, "node-1").await?;
    common::wait_for("the drain's list of node-1's pods", || async {
        Ok(pod_lists(&sim) > lists_before)
    })
    .await?;
    pod(&pods, "late", "node-1").await?;
    let node = nodes.get("node-1").await?;
    ensure!(
        node.spec.and_then(|spec| spec.unschedulable) != Some(true),
        "the cordon landed before the pod was bound: the history is not the one tested"
    );
    sim.faults().set_latency(Duration::ZERO);
    common::wait_for("node-1 released", || async {
        common::node_gone(&client, "node-1").await
    })
    .await?;
    common::event_seen(&client, "late", "Evicted").await?;
    let evictions: u64 = sim
        .requests()
        .of("nodegrace-termination-controller")
        .iter()
        .filter(|(kind, _)| kind.subresource == "eviction")
        .map(|(_, count)| count)
        .sum();
    ensure!(
        evictions == 1,
        "one eviction, of the pod bound before the cordon: {evictions}"
    );
    Ok(())
}
