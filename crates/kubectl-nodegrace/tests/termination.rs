//! Nodes held by termination-controller: by a NodeDisruptionBudget, a pre-drain hook, a
//! PodDisruptionBudget and a do-not-evict pod; each suggested command moves its node on.

use std::time::Duration;

use anyhow::{Result, ensure};
use clap::Parser;
use k8s_openapi::api::core::v1::Node;
use kube::api::ListParams;
use kube::{Api, Client, CustomResourceExt};
use kube_sim::cluster::Cluster;
use kube_sim::{KubeSim, WorldOptions};
use nodegrace_testing::{ProgramUnderTest, command_line};
use serde_json::{Value, json};
use termination_controller::api::{FINALIZER, NodeDisruptionBudget, NodeDrainRule};
use termination_controller::app::{self, PROGRAM};
use termination_controller::cli::Args;

use nodegrace_testing::cluster::create;

use crate::plugin::{Kubectl, blocked_by, command, viewer, wait_for};

const TC: &str = "termination-controller";

async fn cluster(nodes: usize) -> Result<KubeSim> {
    Ok(Cluster::new(nodes)
        .world(WorldOptions {
            lease_renew_interval: Duration::from_millis(100),
            node_monitor_grace: Duration::from_secs(2),
            detach_delay: Duration::from_millis(200),
            pod_gc_period: Duration::from_secs(3600),
            ..WorldOptions::default()
        })
        .crd(NodeDisruptionBudget::crd())
        .crd(NodeDrainRule::crd())
        .start()
        .await?)
}

async fn controller(sim: &KubeSim) -> Result<ProgramUnderTest> {
    let defaults = [
        format!("--kubeconfig={}", sim.kubeconfig_path().display()),
        "--admin-listen=127.0.0.1:0".to_owned(),
        "--instance-provider=sim".to_owned(),
        "--eviction-backoff-max=1s".to_owned(),
        "--leader-elect=false".to_owned(),
    ];
    let args = Args::try_parse_from(command_line(PROGRAM, &defaults, &[]))?;
    ProgramUnderTest::start("nodegrace_termination_controller", |stop| {
        app::start(args, stop)
    })
    .await
}

fn pod(name: &str, node: &str, labels: &Value, annotations: &Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": labels, "annotations": annotations},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "app"}]}})
}

async fn finalizers_on(client: &Client, count: usize) -> Result<()> {
    wait_for("the finalizer on every node", || async {
        let nodes = Api::<Node>::all(client.clone())
            .list(&ListParams::default())
            .await?;
        Ok(nodes
            .items
            .iter()
            .filter(|node| {
                node.metadata
                    .finalizers
                    .iter()
                    .flatten()
                    .any(|f| f == FINALIZER)
            })
            .count()
            == count)
    })
    .await
}

async fn gone(client: &Client, node: &str) -> Result<()> {
    wait_for(&format!("{node} to be released and gone"), || async {
        Ok(Api::<Node>::all(client.clone())
            .get_opt(node)
            .await?
            .is_none())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn budgets_and_hooks_are_named_with_the_command_that_moves_the_node() -> Result<()> {
    let sim = cluster(5).await?;
    let client = sim.client();
    let kubectl = Kubectl::new(sim.kubeconfig_path())?;
    let controller = controller(&sim).await?;
    finalizers_on(&client, 5).await?;
    ensure!(
        kubectl
            .run(&["plugin", "list"])
            .await?
            .contains("kubectl-nodegrace"),
        "kubectl plugin list does not find the plugin"
    );
    let quiet = kubectl.nodegrace(&["status"]).await?;
    ensure!(quiet.contains("No node is in a lifecycle state"), "{quiet}");

    create(&client, json!({"apiVersion": "nodegrace.io/v1alpha1", "kind": "NodeDisruptionBudget",
        "metadata": {"name": "workers"},
        "spec": {"selector": {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "Exists"}]}, "maxUnavailable": 1}})).await?;
    let watch = kubectl.watch()?;
    // node-1 is granted, then held by its pre-drain hook; node-2 waits for the budget.
    kubectl
        .run(&[
            "annotate",
            "node",
            "node-1",
            "pre-drain.nodegrace.io/backup=running",
        ])
        .await?;
    kubectl
        .run(&["delete", "node", "node-1", "--wait=false"])
        .await?;
    let hooked = kubectl
        .row_at("node-1", TC, "AwaitingPreDrainHooks")
        .await?;
    kubectl
        .run(&["delete", "node", "node-2", "--wait=false"])
        .await?;
    let waiting = kubectl.row_at("node-2", TC, "AwaitingBudget").await?;

    ensure!(hooked["state"] == "deleting", "{hooked:#}");
    blocked_by(&hooked, "pre-drain hook backup", "Node node-1")?;
    ensure!(
        hooked["blockedBy"]["object"]["key"] == "pre-drain.nodegrace.io/backup",
        "{hooked:#}"
    );
    ensure!(command(&hooked)? == "kubectl annotate node node-1 pre-drain.nodegrace.io/backup-");
    blocked_by(
        &waiting,
        "NodeDisruptionBudget workers",
        "NodeDisruptionBudget workers",
    )?;
    ensure!(
        command(&waiting)?
            == r#"kubectl patch nodedisruptionbudget workers --type=json -p '[{"op":"test","path":"/spec/maxUnavailable","value":1},{"op":"replace","path":"/spec/maxUnavailable","value":2}]'"#,
        "{waiting:#}"
    );
    let table = kubectl.nodegrace(&["status"]).await?;
    println!("{table}");
    for expected in [
        "NODE",
        "BLOCKED BY",
        "deleting (AwaitingPreDrainHooks)",
        "deleting (AwaitingBudget)",
    ] {
        ensure!(table.contains(expected), "{expected:?} in\n{table}");
    }
    ensure!(
        !table.contains('\x1b'),
        "colour without a terminal:\n{table}"
    );
    let story = kubectl.nodegrace(&["explain", "node", "node-2"]).await?;
    println!("{story}");
    ensure!(
        story.contains("To unblock it:\n  kubectl patch nodedisruptionbudget workers"),
        "{story}"
    );

    kubectl.paste(&command(&waiting)?).await?;
    // The command acts on the budget it was read from: once it changed, it does nothing.
    kubectl.paste_fails(&command(&waiting)?).await?;
    kubectl.moves_on("node-2", TC, "AwaitingBudget").await?;
    kubectl.paste(&command(&hooked)?).await?;
    kubectl
        .moves_on("node-1", TC, "AwaitingPreDrainHooks")
        .await?;
    gone(&client, "node-1").await?;
    gone(&client, "node-2").await?;
    watch
        .printed("node-1", "step", "AwaitingPreDrainHooks")
        .await?;
    watch.printed("node-2", "step", "AwaitingBudget").await?;
    watch.printed("node-1", "state", "gone").await?;
    controller.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pdbs_and_do_not_evict_pods_are_named_with_the_command_that_moves_the_node() -> Result<()> {
    let sim = cluster(5).await?;
    let client = sim.client();
    let kubectl = Kubectl::new(sim.kubeconfig_path())?;
    let controller = controller(&sim).await?;
    finalizers_on(&client, 5).await?;
    // node-3's pod is under a budget that allows nothing; node-4's is protected.
    create(
        &client,
        pod("db-0", "node-3", &json!({"app": "db"}), &json!({})),
    )
    .await?;
    create(
        &client,
        pod("db-1", "node-0", &json!({"app": "db"}), &json!({})),
    )
    .await?;
    create(
        &client,
        json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "db", "namespace": "default"},
        "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "db"}}}}),
    )
    .await?;
    create(
        &client,
        pod(
            "batch",
            "node-4",
            &json!({}),
            &json!({"nodegrace.io/do-not-evict": "true"}),
        ),
    )
    .await?;
    wait_for("the db budget to count both pods", || async {
        let pdb = kubectl
            .run(&[
                "get",
                "pdb",
                "db",
                "-o",
                "jsonpath={.status.currentHealthy}",
            ])
            .await?;
        Ok(pdb == "2")
    })
    .await?;
    kubectl
        .run(&["delete", "node", "node-3", "node-4", "--wait=false"])
        .await?;
    kubectl.row_at("node-3", TC, "Draining").await?;
    kubectl.row_at("node-4", TC, "BlockedByDoNotEvict").await?;

    let draining = explained_row(&kubectl, "node-3").await?;
    blocked_by(
        &draining,
        "PodDisruptionBudget default/db: 2 healthy, minAvailable 2, allows 0",
        "PodDisruptionBudget default/db",
    )?;
    ensure!(
        command(&draining)?
            == r#"kubectl patch pdb db -n default --type=json -p '[{"op":"test","path":"/spec/minAvailable","value":2},{"op":"replace","path":"/spec/minAvailable","value":1}]'"#,
        "{draining:#}"
    );
    // The docs' read role is enough for the drain plan the blocker is read from.
    let viewer = viewer(&sim, "viewer", &[]).await?;
    ensure!(
        explained_row(&viewer, "node-3").await?["blockedBy"] == draining["blockedBy"],
        "the viewer's answer differs"
    );
    let protected = explained_row(&kubectl, "node-4").await?;
    blocked_by(
        &protected,
        "pod default/batch has nodegrace.io/do-not-evict",
        "Pod default/batch",
    )?;
    ensure!(
        command(&protected)? == "kubectl annotate pod batch -n default nodegrace.io/do-not-evict-",
        "{protected:#}"
    );

    kubectl.paste(&command(&draining)?).await?;
    gone(&client, "node-3").await?;
    kubectl.paste(&command(&protected)?).await?;
    gone(&client, "node-4").await?;

    // The evicted pod's story outlives it.
    let evicted = kubectl.json(&["explain", "pod", "default/db-0"]).await?;
    ensure!(evicted["exists"] == false, "{evicted:#}");
    ensure!(evicted["verdict"]["program"] == TC, "{evicted:#}");
    ensure!(evicted["verdict"]["how"] == "evicted", "{evicted:#}");
    let told = kubectl
        .nodegrace(&["explain", "pod", "db-0", "-n", "default"])
        .await?;
    ensure!(told.contains("evicted by termination-controller"), "{told}");

    // The plan is the controller's own.
    let plan = kubectl.json(&["plan", "node-0"]).await?;
    ensure!(plan["heldByFinalizer"] == true, "{plan:#}");
    ensure!(plan["machine"]["provider"] == "none", "{plan:#}");
    controller.stop().await
}

/// The row `explain node` gives, the blocker read in depth.
async fn explained_row(kubectl: &Kubectl, node: &str) -> Result<Value> {
    let story = kubectl.json(&["explain", "node", node]).await?;
    story["now"]
        .as_array()
        .and_then(|rows| rows.iter().find(|row| row["program"] == TC))
        .cloned()
        .ok_or_else(|| anyhow::anyhow!("no termination-controller row: {story:#}"))
}
