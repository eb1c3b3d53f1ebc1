//! Hooks through the controller: annotations of other controllers hold a deleting node before
//! its cordon and before its machine goes, until removed or, with --hook-timeout, until late.

use crate::common::*;

use anyhow::{Result, ensure};
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;

async fn annotate(client: &kube::Client, node: &str, annotations: serde_json::Value) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let patch = json!({"metadata": {"annotations": annotations}});
    nodes
        .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hooks_hold_the_node_before_its_cordon_and_before_its_machine_until_removed() -> Result<()>
{
    let sim = cluster(2).with(web(2)).start().await?;
    let client = sim.client();
    let _controller = managing(&sim, &[]).await?;
    annotate(
        &client,
        "node-1",
        json!({
            "pre-drain.nodegrace.io/storage": "",
            "pre-drain.nodegrace.io/backup": "snapshot first",
            "pre-terminate.nodegrace.io/load-balancer": "",
        }),
    )
    .await?;
    let planned = plan(&sim, "node-1", false)?;
    ensure!(
        planned.contains("Pre-drain hooks:         backup, storage")
            && planned.contains("Pre-terminate hooks:     load-balancer"),
        "{planned}"
    );
    delete_node(&client, "node-1").await?;
    terminating_with(
        &client,
        "node-1",
        "AwaitingPreDrainHooks",
        "pre-drain hook(s) backup, storage",
    )
    .await?;
    event_seen(&client, "node-1", "AwaitingPreDrainHooks").await?;
    ensure!(
        !is_cordoned(&client, "node-1").await?,
        "held before the cordon"
    );

    annotate(
        &client,
        "node-1",
        json!({"pre-drain.nodegrace.io/backup": null}),
    )
    .await?;
    terminating_with(
        &client,
        "node-1",
        "AwaitingPreDrainHooks",
        "pre-drain hook(s) storage",
    )
    .await?;
    ensure!(
        !is_cordoned(&client, "node-1").await?,
        "one hook still holds it"
    );

    annotate(
        &client,
        "node-1",
        json!({"pre-drain.nodegrace.io/storage": null}),
    )
    .await?;
    terminating_with(
        &client,
        "node-1",
        "AwaitingPreTerminateHooks",
        "pre-terminate hook(s) load-balancer",
    )
    .await?;
    ensure!(
        pods_on(&client, "node-1")
            .await?
            .iter()
            .all(|pod| pod.metadata.deletion_timestamp.is_some()),
        "drained before the pre-terminate hooks are looked at"
    );
    ensure!(
        terminate_calls(&sim, "node-1") == 0,
        "the machine waits for its hook"
    );

    annotate(
        &client,
        "node-1",
        json!({"pre-terminate.nodegrace.io/load-balancer": null}),
    )
    .await?;
    wait_for("node-1 to go once its hooks are gone", || {
        node_gone(&client, "node-1")
    })
    .await?;
    ensure!(terminate_calls(&sim, "node-1") == 1);
    ensure!(sim.world().audit().violations().is_empty());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_hook_timeout_a_forgotten_hook_holds_the_node_only_that_long() -> Result<()> {
    let sim = sim(2).await?;
    let client = sim.client();
    let _controller = managing(&sim, &["--hook-timeout=1s"]).await?;
    annotate(
        &client,
        "node-1",
        json!({"pre-drain.nodegrace.io/forgotten": ""}),
    )
    .await?;
    delete_node(&client, "node-1").await?;
    terminating_with(&client, "node-1", "AwaitingPreDrainHooks", "forgotten").await?;
    wait_for("node-1 to go after the hook timeout", || {
        node_gone(&client, "node-1")
    })
    .await?;
    event_seen(&client, "node-1", "HookTimeout").await?;
    Ok(())
}
