//! `termination-controller release-nodes`, run by the chart's pre-delete hook on `helm
//! uninstall`: stops the controller, then removes its finalizer from every node, so no Node
//! delete after the uninstall waits for a controller that is gone.
//!
//! Why a hook Job and not the last replica on SIGTERM: a replica cannot tell an uninstall from
//! a rollout or an eviction (releasing nodes in a rollout would let deletions skip the drain),
//! and by the time its SIGTERM arrives helm is already deleting its RBAC. The hook runs before
//! helm deletes anything, with RBAC of its own, and helm waits for it.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams};
use nodegrace_core::k8s::api_errors::status_code;
use nodegrace_core::k8s::cached_node::CachedNode;
use nodegrace_core::k8s::node_identity::NodeIdentity;

use crate::termination::{has_finalizer, remove_finalizer};

/// What the hook releases, and how long it waits for the controller to stop.
#[derive(Debug, Clone)]
pub struct Release {
    pub namespace: String,
    pub deployment: String,
    pub stop_timeout: Duration,
}

/// Scales the controller's Deployment to zero, waits until none of its pods is left, then
/// removes the finalizer from every node that has it. Returns the nodes released.
pub async fn release_nodes(client: &kube::Client, release: &Release) -> Result<Vec<String>> {
    stop_controller(client, release).await?;
    let nodes: Api<CachedNode> = Api::all(client.clone());
    let mut released = Vec::new();
    for node in nodes.list(&ListParams::default()).await?.items {
        if !has_finalizer(&node) {
            continue;
        }
        let Some(identity) = NodeIdentity::of(&node) else {
            continue;
        };
        remove_finalizer(client, &identity)
            .await
            .with_context(|| format!("remove the finalizer from node {}", identity.name()))?;
        tracing::info!(node = identity.name(), "removed the termination finalizer");
        released.push(identity.name().to_owned());
    }
    Ok(released)
}

/// No replica may run while the finalizers go: it would add them again on sight.
async fn stop_controller(client: &kube::Client, release: &Release) -> Result<()> {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &release.namespace);
    let Some(deployment) = deployments.get_opt(&release.deployment).await? else {
        tracing::info!(
            deployment = release.deployment,
            "the controller's Deployment is gone already"
        );
        return Ok(());
    };
    let selector = match_labels(&deployment).with_context(|| {
        format!(
            "Deployment {}/{} has no spec.selector.matchLabels to find its pods by",
            release.namespace, release.deployment
        )
    })?;
    let scale = serde_json::json!({"spec": {"replicas": 0}});
    match deployments
        .patch_scale(
            &release.deployment,
            &PatchParams::default(),
            &Patch::Merge(&scale),
        )
        .await
    {
        Ok(_) => {}
        Err(error) if status_code(&error) == Some(404) => return Ok(()),
        Err(error) => return Err(error).context("scale the controller's Deployment to 0"),
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), &release.namespace);
    let params = ListParams::default().labels(&selector);
    let deadline = tokio::time::Instant::now() + release.stop_timeout;
    let mut pause = Duration::from_millis(100);
    loop {
        let left = pods.list(&params).await?.items.len();
        if left == 0 {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            bail!(
                "{left} pod(s) of Deployment {}/{} still run after {:?}; the finalizers stay. \
                 Find out why they do not stop (`kubectl -n {} get pods -l {selector}`), or \
                 uninstall with --no-hooks and remove the finalizer nodegrace.io/termination by hand",
                release.namespace,
                release.deployment,
                release.stop_timeout,
                release.namespace
            );
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(2));
    }
}

fn match_labels(deployment: &Deployment) -> Option<String> {
    let labels: &BTreeMap<String, String> = deployment
        .spec
        .selector
        .match_labels
        .as_ref()
        .filter(|labels| !labels.is_empty())?;
    Some(
        labels
            .iter()
            .map(|(key, value)| format!("{key}={value}"))
            .collect::<Vec<_>>()
            .join(","),
    )
}
