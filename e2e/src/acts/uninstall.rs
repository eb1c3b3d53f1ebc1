//! Act: `helm uninstall termination-controller`. Its pre-delete hook stops the controller and
//! takes the finalizer off every node, so a Node deleted afterwards goes at once instead of
//! waiting for ever on a finalizer nobody removes.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{DeleteParams, ListParams};

use super::Act;
use crate::chart;
use crate::stage::{AGENTS_NAMESPACE, Stage, TERMINATION_CONTROLLER};
use crate::timeline::seconds;
use crate::wait::poll_until;

pub const ACT: Act = Act {
    slug: "uninstall",
    title: "helm uninstall termination-controller: every node released, a later delete completes",
    play: |stage| Box::pin(play(stage)),
};

const FINALIZER: &str = "nodegrace.io/termination";
const TIMEOUT: Duration = Duration::from_secs(30);

fn held(node: &Node) -> bool {
    node.metadata
        .finalizers
        .iter()
        .flatten()
        .any(|finalizer| finalizer == FINALIZER)
}

async fn nodes_held(nodes: &Api<Node>) -> Result<Vec<String>> {
    Ok(nodes
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter(|node| held(node))
        .filter_map(|node| node.metadata.name.clone())
        .collect())
}

async fn play(stage: &mut Stage) -> Result<()> {
    let stage = &*stage;
    let timeline = &stage.timeline;
    let nodes: Api<Node> = Api::all(stage.client().clone());
    let held_before = nodes_held(&nodes).await?;
    if held_before.is_empty() {
        bail!(
            "no node carries {FINALIZER} before the uninstall: nothing would show the hook's work"
        );
    }
    timeline.event(&format!("{} carry {FINALIZER}", held_before.join(", ")));
    let started = Instant::now();
    chart::uninstall(
        &stage.helm,
        stage.kubeconfig(),
        TERMINATION_CONTROLLER,
        AGENTS_NAMESPACE,
    )?;
    timeline.event(&format!(
        "helm uninstall {TERMINATION_CONTROLLER} -n {AGENTS_NAMESPACE} returned after {}: its pre-delete hook Job ran `termination-controller release-nodes`",
        seconds(started.elapsed())
    ));
    let still = nodes_held(&nodes).await?;
    if !still.is_empty() {
        bail!(
            "after the uninstall {} still carry {FINALIZER}",
            still.join(", ")
        );
    }
    let pods: Api<Pod> = Api::namespaced(stage.client().clone(), AGENTS_NAMESPACE);
    let left = pods
        .list(
            &ListParams::default()
                .labels(&format!("app.kubernetes.io/name={TERMINATION_CONTROLLER}")),
        )
        .await?
        .items
        .len();
    timeline.event(&format!(
        "no node carries {FINALIZER}; {left} termination-controller pod(s) left"
    ));
    timeline.show(
        "kubectl get nodes -o custom-columns=NAME:.metadata.name,FINALIZERS:.metadata.finalizers",
    );
    let node = held_before
        .iter()
        .find(|name| name.as_str() != "node-0")
        .context("no node but node-0 to delete")?
        .clone();
    let deleted = Instant::now();
    nodes
        .delete(&node, &DeleteParams::default())
        .await
        .with_context(|| format!("kubectl delete node {node}"))?;
    timeline.event(&format!("kubectl delete node {node}"));
    let gone = poll_until(TIMEOUT, || async {
        matches!(nodes.get_opt(&node).await, Ok(None))
    })
    .await;
    if !gone {
        bail!("{node} still exists {TIMEOUT:?} after its delete, with nothing left to hold it");
    }
    timeline.pass(&format!(
        "{node} deleted and gone {} after the delete: nothing of the controller holds a node",
        seconds(deleted.elapsed())
    ));
    Ok(())
}
