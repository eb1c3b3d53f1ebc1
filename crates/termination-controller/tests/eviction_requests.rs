//! `--eviction-api=eviction-request`: the drain hands pods to their eviction responders through
//! Kubernetes 1.37's EvictionRequest API (kube-sim serves it, with the evictionrequest-controller
//! and the default evictor). The test plays a pod's responder. Each history ends with no
//! EvictionRequest of ours left.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::lifecycle::v1alpha1::Eviction;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, Client};
use kube_sim::cluster::{Workload, statefulset};
use kube_sim::{KubeSim, SimOptions};
use serde_json::json;
use termination_controller::handover;

use crate::common::{
    app, cluster, delete_node, has_event, managing, node_gone, terminating_with, wait_for, world,
};

const RESPONDER: &str = "db.example.com/failover";

/// `nodes` nodes serving the EvictionRequest API, responders passed over after `deadline`.
fn serving(nodes: usize, deadline: Duration) -> kube_sim::cluster::Cluster {
    cluster(nodes).options(SimOptions {
        eviction_request_api: true,
        world: kube_sim::WorldOptions {
            responder_heartbeat_deadline: deadline,
            ..world()
        },
        ..SimOptions::default()
    })
}

/// On node-0 only.
fn pinned(workload: Workload) -> Workload {
    workload.pod(&json!({"spec": {"nodeSelector": {"kubernetes.io/hostname": "node-0"}}}))
}

/// A StatefulSet `db` on node-0 whose pod names `RESPONDER`.
fn db() -> Workload {
    pinned(statefulset("db", 1).timing(0.3, 0.1))
        .pod(&json!({"spec": {"evictionResponders": [{"name": RESPONDER, "priority": 10000}]}}))
}

async fn uid_of(client: &Client, name: &str) -> Result<String> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.get(name).await?.metadata.uid.context("pod uid")
}

async fn requests_left(client: &Client) -> Result<usize> {
    Ok(handover::list(client).await?.len())
}

/// Waits until exactly `count` EvictionRequests of ours are there.
async fn wait_requests(client: &Client, count: usize, what: &str) -> Result<()> {
    wait_for(what, || {
        let client = client.clone();
        async move { Ok(requests_left(&client).await? == count) }
    })
    .await
}

/// Plays the responder: a heartbeat with an expected completion, by server-side apply of its
/// own entry.
async fn heartbeat(client: &Client, eviction: &str) -> Result<()> {
    let evictions: Api<Eviction> = Api::namespaced(client.clone(), "default");
    let now = jiff::Timestamp::now();
    evictions
        .patch_status(
            eviction,
            &PatchParams::apply("db.example.com"),
            &Patch::Apply(json!({
                "apiVersion": "lifecycle.k8s.io/v1alpha1",
                "kind": "Eviction",
                "status": {"responders": [{
                    "name": RESPONDER,
                    "heartbeatTime": Time(now),
                    "expectedCompletionTime": Time(now + jiff::SignedDuration::from_secs(120)),
                    "message": "promoting db-1 to primary",
                }]},
            })),
        )
        .await?;
    Ok(())
}

// Multi-threaded: `plan` runs as a process that calls the in-process simulator.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_with_a_responder_leaves_through_it_without_an_eviction_api_call() -> Result<()> {
    let sim = serving(2, Duration::from_secs(600))
        .with(db())
        .with(app("web", 4).budget(json!({"maxUnavailable": 1})))
        .start()
        .await?;
    let client = sim.client();
    let db_uid = uid_of(&client, "db-0").await?;
    let _controller = managing(&sim, &["--eviction-api=eviction-request"]).await?;
    delete_node(&client, "node-0").await?;
    terminating_with(
        &client,
        "node-0",
        "Draining",
        &format!("handed to {RESPONDER}"),
    )
    .await?;
    heartbeat(&client, "pod-1-db-0").await?;
    terminating_with(&client, "node-0", "Draining", "promoting db-1 to primary").await?;
    let planned = crate::common::plan(&sim, "node-0", false)?;
    ensure!(
        planned.contains(&format!(
            "db-0: handed to {RESPONDER}: promoting db-1 to primary (expected done by "
        )),
        "{planned}"
    );
    // The responder moves the primary away, then deletes the pod itself.
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.delete("db-0", &DeleteParams::default()).await?;
    wait_for("node-0 to be drained and gone", || {
        let client = client.clone();
        async move { node_gone(&client, "node-0").await }
    })
    .await?;
    let audit = sim.world().audit();
    ensure!(
        !audit
            .evictions()
            .iter()
            .any(|evicted| evicted.uid == db_uid),
        "db-0 left without an Eviction API call"
    );
    let web_evicted = audit
        .evictions()
        .iter()
        .filter(|evicted| evicted.pod.starts_with("web-"))
        .all(|evicted| evicted.user == kube_sim::world::EVICTOR_USER);
    ensure!(web_evicted, "web's pods went through the default evictor");
    ensure!(audit.violations().is_empty(), "{:?}", audit.violations());
    ensure!(has_event(&client, "db-0", "EvictionRequested").await?);
    wait_requests(&client, 0, "no EvictionRequest of ours left").await?;
    Ok(())
}

#[tokio::test]
async fn a_silent_responder_is_passed_over_and_the_deadline_withdraws_what_a_budget_holds()
-> Result<()> {
    let sim = serving(2, Duration::from_secs(2))
        .with(db().pod(&json!({"spec": {"terminationGracePeriodSeconds": 1}})))
        .with(
            pinned(app("frozen", 1))
                .pod(&json!({"spec": {"terminationGracePeriodSeconds": 1}}))
                .budget(json!({"maxUnavailable": 0})),
        )
        .start()
        .await?;
    let client = sim.client();
    let db_uid = uid_of(&client, "db-0").await?;
    let _controller = managing(
        &sim,
        &["--eviction-api=eviction-request", "--drain-timeout=12s"],
    )
    .await?;
    delete_node(&client, "node-0").await?;
    terminating_with(
        &client,
        "node-0",
        "Draining",
        "pod deletion via the /eviction subresource failed",
    )
    .await?;
    wait_for("db-0 passed over to the evictor and evicted", || {
        let sim = &sim;
        let db_uid = db_uid.clone();
        async move {
            Ok(sim.world().audit().evictions().iter().any(|evicted| {
                evicted.uid == db_uid && evicted.user == kube_sim::world::EVICTOR_USER
            }))
        }
    })
    .await?;
    wait_for("a Warning that db-0's responder was passed over", || {
        let client = client.clone();
        async move { has_event(&client, "db-0", "ResponderPassedOver").await }
    })
    .await?;
    wait_for("node-0 gone past its drain deadline", || {
        let client = client.clone();
        async move { node_gone(&client, "node-0").await }
    })
    .await?;
    let audit = sim.world().audit();
    let frozen_deleted = audit
        .deletions()
        .iter()
        .any(|deleted| deleted.name.starts_with("frozen-") && deleted.resource == "pods");
    ensure!(
        frozen_deleted,
        "the budget's pod was deleted at the deadline"
    );
    ensure!(
        !audit
            .evictions()
            .iter()
            .any(|evicted| evicted.pod.starts_with("frozen-")),
        "the budget held its pod until the deadline"
    );
    wait_requests(&client, 0, "no EvictionRequest of ours left").await?;
    Ok(())
}

#[tokio::test]
async fn do_not_evict_withdraws_and_a_finalizer_removed_by_hand_leaves_no_request_behind()
-> Result<()> {
    let sim = serving(2, Duration::from_secs(600))
        .with(pinned(app("frozen", 1)).budget(json!({"maxUnavailable": 0})))
        .start()
        .await?;
    let client = sim.client();
    let _controller = managing(&sim, &["--eviction-api=eviction-request"]).await?;
    delete_node(&client, "node-0").await?;
    wait_requests(&client, 1, "the frozen pod's request").await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let frozen = pods
        .list(&kube::api::ListParams::default().labels("app=frozen"))
        .await?
        .items
        .into_iter()
        .next()
        .and_then(|pod| pod.metadata.name)
        .context("the frozen pod")?;
    let protect = |value: Option<&str>| {
        Patch::Merge(json!({"metadata": {"annotations": {"nodegrace.io/do-not-evict": value}}}))
    };
    pods.patch(&frozen, &PatchParams::default(), &protect(Some("true")))
        .await?;
    wait_requests(
        &client,
        0,
        "the request withdrawn once the pod is do-not-evict",
    )
    .await?;
    terminating_with(&client, "node-0", "BlockedByDoNotEvict", &frozen).await?;
    pods.patch(&frozen, &PatchParams::default(), &protect(None))
        .await?;
    wait_requests(&client, 1, "the pod requested again").await?;
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .patch(
            "node-0",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await?;
    wait_for("the request closed once node-0 is gone", || {
        let client = client.clone();
        async move { Ok(node_gone(&client, "node-0").await? && requests_left(&client).await? == 0) }
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn auto_falls_back_to_the_eviction_api_where_the_group_is_not_served() -> Result<()> {
    let sim: KubeSim = cluster(2).with(pinned(app("web", 2))).start().await?;
    let client = sim.client();
    let _controller = managing(&sim, &["--eviction-api=auto"]).await?;
    delete_node(&client, "node-0").await?;
    wait_for("node-0 drained through the Eviction API", || {
        let client = client.clone();
        async move { node_gone(&client, "node-0").await }
    })
    .await?;
    let evicted = sim.world().audit().evictions();
    ensure!(
        evicted.len() == 2
            && evicted
                .iter()
                .all(|e| e.user != kube_sim::world::EVICTOR_USER),
        "{evicted:?}"
    );
    Ok(())
}
