//! Nodes in out-of-service-gc's work: a fence held by `nodegrace.io/do-not-fence`, a fenced
//! machine, and a node tainted by hand and cleaned; the suggested commands move them on.

use std::time::Duration;

use anyhow::{Result, ensure};
use clap::Parser;
use k8s_openapi::api::core::v1::Pod;
use kube::api::PostParams;
use kube::{Api, Client};
use kube_sim::cluster::Cluster;
use kube_sim::{KubeSim, WorldOptions};
use nodegrace_testing::{ProgramUnderTest, command_line};
use out_of_service_gc::app::{self, PROGRAM};
use out_of_service_gc::cli::Args;
use serde_json::json;

use nodegrace_testing::cluster::set_kubelet;

use crate::plugin::{Kubectl, blocked_by, command, wait_for};

const GC: &str = "out-of-service-gc";

async fn cluster() -> Result<KubeSim> {
    Ok(Cluster::new(4)
        .world(WorldOptions {
            lease_renew_interval: Duration::from_millis(100),
            node_monitor_grace: Duration::from_millis(600),
            detach_delay: Duration::from_millis(200),
            pod_gc_period: Duration::from_secs(3600),
            ..WorldOptions::default()
        })
        .start()
        .await?)
}

/// The controller fencing a machine 1 s after its node is NotReady, on kube-sim's cloud.
async fn controller(sim: &KubeSim) -> Result<ProgramUnderTest> {
    let defaults = [
        format!("--kubeconfig={}", sim.kubeconfig_path().display()),
        "--admin-listen=127.0.0.1:0".to_owned(),
        "--liveness-guard-window=1s".to_owned(),
        "--fence-after=1s".to_owned(),
        "--instance-provider=sim".to_owned(),
        // Two of the four nodes down at once are two dead machines here, not a partition.
        "--not-ready-max-fraction=0.5".to_owned(),
    ];
    let args = Args::try_parse_from(command_line(PROGRAM, &defaults, &[]))?;
    ProgramUnderTest::start("nodegrace_out_of_service_gc", |stop| app::start(args, stop)).await
}

async fn running_pod(client: &Client, name: &str, node: &str) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": name},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "app"}]}}))?,
    )
    .await?;
    wait_for(&format!("{name} to run"), || async {
        Ok(pods
            .get(name)
            .await?
            .status
            .and_then(|s| s.phase)
            .as_deref()
            == Some("Running"))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_fenced_and_cleaned_nodes_are_named_with_the_command_that_moves_them() -> Result<()> {
    let sim = cluster().await?;
    let client = sim.client();
    let kubectl = Kubectl::new(sim.kubeconfig_path())?;
    let controller = controller(&sim).await?;
    running_pod(&client, "web-1", "node-1").await?;
    running_pod(&client, "web-2", "node-2").await?;

    // node-1: a fence held by its annotation, then let go.
    kubectl
        .run(&[
            "annotate",
            "node",
            "node-1",
            "nodegrace.io/do-not-fence=debugging",
        ])
        .await?;
    set_kubelet(&client, "node-1", Some("stopped")).await?;
    let held = kubectl.row_at("node-1", GC, "FenceHeldDoNotFence").await?;
    ensure!(held["state"] == "fence-waiting", "{held:#}");
    blocked_by(
        &held,
        "the node carries nodegrace.io/do-not-fence",
        "Node node-1",
    )?;
    ensure!(command(&held)? == "kubectl annotate node node-1 nodegrace.io/do-not-fence-");
    // node-2: tainted by hand (no fence for it), cleaned, and the taint left to the operator.
    kubectl
        .run(&[
            "annotate",
            "node",
            "node-2",
            "nodegrace.io/do-not-fence=by-hand",
        ])
        .await?;
    set_kubelet(&client, "node-2", Some("stopped")).await?;
    kubectl.row_at("node-2", GC, "FenceHeldDoNotFence").await?;
    kubectl
        .run(&[
            "taint",
            "node",
            "node-2",
            "node.kubernetes.io/out-of-service=nodeshutdown:NoExecute",
        ])
        .await?;
    let cleaned = kubectl.row_at("node-2", GC, "Done").await?;
    ensure!(cleaned["state"] == "cleaned", "{cleaned:#}");
    ensure!(
        command(&cleaned)? == "kubectl taint node node-2 node.kubernetes.io/out-of-service-",
        "{cleaned:#}"
    );
    let table = kubectl.nodegrace(&["status"]).await?;
    println!("{table}");
    ensure!(
        table.contains("fence waiting (FenceHeldDoNotFence)"),
        "{table}"
    );
    ensure!(table.contains("cleaned (Done)"), "{table}");

    kubectl.paste(&command(&held)?).await?;
    wait_for("node-1 to be fenced", || async {
        Ok(kubectl
            .row("node-1", GC)
            .await?
            .is_some_and(|row| row["state"] == "fenced"))
    })
    .await?;
    let story = kubectl.nodegrace(&["explain", "node", "node-1"]).await?;
    println!("{story}");
    ensure!(story.contains("out-of-service-gc: fenced"), "{story}");
    ensure!(
        story.contains("Fenced"),
        "the fence's Event in the timeline:\n{story}"
    );

    // The node is back; the suggested untaint takes it out of every program's work.
    set_kubelet(&client, "node-2", None).await?;
    wait_for("node-2 to be Ready", || async {
        let ready = kubectl
            .run(&[
                "get",
                "node",
                "node-2",
                "-o",
                "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
            ])
            .await?;
        Ok(ready == "True")
    })
    .await?;
    kubectl.paste(&command(&cleaned)?).await?;
    wait_for("node-2 to leave out-of-service-gc's work", || async {
        Ok(kubectl.row("node-2", GC).await?.is_none())
    })
    .await?;

    // The force-deleted pod's story, from its Events once it is gone; the program's Event is
    // written after the delete, so it is waited for.
    wait_for("web-2's story to name out-of-service-gc", || async {
        let pod = kubectl.json(&["explain", "pod", "default/web-2"]).await?;
        Ok(pod["verdict"]["program"] == GC)
    })
    .await?;
    let pod = kubectl.json(&["explain", "pod", "default/web-2"]).await?;
    ensure!(pod["verdict"]["program"] == GC, "{pod:#}");
    ensure!(pod["verdict"]["how"] == "force-deleted", "{pod:#}");
    controller.stop().await
}
