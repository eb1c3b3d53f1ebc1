//! Histories an outside test found wrong: a toleration of a taint kubectl added (no
//! `timeAdded`) that never ran out, a fence from an earlier outage taken as proof for a later
//! one, a kubelet renewing on a late clock taken for silent, and a tolerating pod's ephemeral
//! volume detached under it.

use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::common::*;

const FENCED: &str = "nodegrace.io/fenced";

async fn annotate_fence(nodes: &Api<Node>, node: &str, value: Option<&str>) -> Result<()> {
    nodes
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {FENCED: value}}})),
        )
        .await?;
    Ok(())
}

fn fence_of(node: &Node) -> Option<String> {
    node.metadata.annotations.as_ref()?.get(FENCED).cloned()
}

#[tokio::test]
async fn a_toleration_of_a_taint_without_time_added_runs_out_and_the_taint_goes_when_back()
-> Result<()> {
    let sim = sim(2, world()).await?;
    let client = sim.client();
    let gc = controller(&sim, &["--auto-untaint=true"]).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let patient = json!({"spec": {"tolerations": [
        {"key": TAINT, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 4},
    ]}});
    pods.create(&PostParams::default(), &pod("patient", "node-1", &patient)?)
        .await?;
    running_pods(&client, "node-1", 1).await?;
    kill(&client, "node-1").await?;
    let tainted = Instant::now();
    // What `kubectl taint nodes node-1 node.kubernetes.io/out-of-service=nodeshutdown:NoExecute`
    // writes: no timeAdded.
    taint(&client, "node-1").await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let written = nodes.get("node-1").await?.spec.and_then(|s| s.taints);
    ensure!(
        written
            .iter()
            .flatten()
            .any(|t| t.key == TAINT && t.time_added.is_none()),
        "{written:?}"
    );
    wait_for("the patient to be gone", || async {
        Ok(pods.get_opt("patient").await?.is_none())
    })
    .await?;
    let gone = tainted.elapsed();
    eprintln!("the pod tolerating the taint for 4 s went {gone:?} after it");
    ensure!(gone >= Duration::from_secs(4), "gone after {gone:?}");
    // Events are written after the delete, so the pod may be gone first.
    wait_for("our ForceDeleted Event for the patient", || async {
        Ok(events_with_reason(&client, "ForceDeleted")
            .await?
            .iter()
            .any(|e| e.involved_object.name.as_deref() == Some("patient")))
    })
    .await?;
    revive(&client, "node-1").await?;
    wait_for("the taint to go once the node is back", || async {
        Ok(!has_taint(&nodes.get("node-1").await?))
    })
    .await?;
    gc.stop().await
}

#[tokio::test]
async fn a_fence_confirms_only_the_outage_it_was_given_in() -> Result<()> {
    let sim = sim(3, world()).await?;
    let client = sim.client();
    let gc = controller(&sim, &["--auto-taint-after=1s", "--auto-untaint=true"]).await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let unconfirmed = || async {
        Ok::<_, anyhow::Error>(
            events_with_reason(&client, "OutOfServiceNotConfirmed")
                .await?
                .into_iter()
                .filter(|e| e.involved_object.name.as_deref() == Some("node-1"))
                .filter_map(|e| e.message)
                .collect::<Vec<_>>(),
        )
    };
    // Outage 1: not tainted until a fencing agent says when it powered the machine off.
    running_pods(&client, "node-1", 2).await?;
    kill(&client, "node-1").await?;
    wait_for("the first unconfirmed warning", || async {
        Ok(unconfirmed().await?.len() == 1)
    })
    .await?;
    ensure!(!has_taint(&nodes.get("node-1").await?));
    let fenced_at = Timestamp::now().to_string();
    annotate_fence(&nodes, "node-1", Some(&fenced_at)).await?;
    wait_for("outage 1 to be tainted and cleaned", || async {
        Ok(
            has_taint(&nodes.get("node-1").await?)
                && pod_names(&client, "node-1").await?.is_empty(),
        )
    })
    .await?;
    revive(&client, "node-1").await?;
    wait_for("the taint and the fence to go once it is back", || async {
        let node = nodes.get("node-1").await?;
        Ok(!has_taint(&node) && fence_of(&node).is_none())
    })
    .await?;
    // Outage 2, with the old fence put back (an agent that never clears it, say): it is from
    // before this outage began, so it confirms nothing.
    annotate_fence(&nodes, "node-1", Some(&fenced_at)).await?;
    running_pods(&client, "node-1", 2).await?;
    kill(&client, "node-1").await?;
    wait_for("the second unconfirmed warning", || async {
        Ok(unconfirmed().await?.len() == 2)
    })
    .await?;
    let said = unconfirmed().await?;
    ensure!(said[1].contains("earlier outage"), "{said:?}");
    ensure!(
        !has_taint(&nodes.get("node-1").await?),
        "tainted on the fence of outage 1"
    );
    ensure!(pod_names(&client, "node-1").await?.len() == 2);
    ensure!(gc.counter("taints_added").await? == 1);
    gc.stop().await
}

#[tokio::test]
async fn a_kubelet_renewing_on_a_late_clock_is_refused_until_it_stops() -> Result<()> {
    let sim = sim(2, world()).await?;
    let client = sim.client();
    let gc = controller(&sim, &["--liveness-guard-window=2s"]).await?;
    let names = running_pods(&client, "node-1", 3).await?;
    // The kubelet lives on (its Lease renewed, on a clock ten minutes late) but reports the node
    // NotReady: its container runtime is down, say. The simulated kubelet stands aside.
    let renewing = CancellationToken::new();
    let renewals = tokio::spawn(renew_late(client.clone(), "node-1", renewing.clone()));
    stop_kubelet(&client, "node-1").await?;
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .patch_status(
            "node-1",
            &PatchParams::default(),
            &Patch::Strategic(json!({"status": {"conditions": [{
                "type": "Ready", "status": "False", "reason": "KubeletNotReady",
                "message": "container runtime is down",
                "lastTransitionTime": Timestamp::now().to_string(),
            }]}})),
        )
        .await?;
    taint(&client, "node-1").await?;
    wait_for("the refusal", || async {
        Ok(condition(&client, "node-1")
            .await?
            .is_some_and(|(_, reason)| reason == "Refused"))
    })
    .await?;
    // Two more windows of renewals: refused all along, said once.
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let renewed = |lease: Lease| lease.spec.and_then(|s| s.renew_time).map(|t| t.0);
    let mut seen = renewed(leases.get("node-1").await?);
    for _ in 0..20 {
        wait_for("a renewal", || async {
            Ok(renewed(leases.get("node-1").await?) != seen)
        })
        .await?;
        seen = renewed(leases.get("node-1").await?);
    }
    let left = pod_names(&client, "node-1").await?;
    ensure!(
        names.iter().all(|name| left.contains(name)),
        "pods were force-deleted while the kubelet renewed: {left:?}"
    );
    ensure!(gc.counter("pods_force_deleted").await? == 0);
    ensure!(gc.counter("refusals").await? == 1);
    wait_for("the refusal's Event", || async {
        Ok(!events_with_reason(&client, "OutOfServiceCleanupRefused")
            .await?
            .is_empty())
    })
    .await?;
    let refused = events_with_reason(&client, "OutOfServiceCleanupRefused").await?;
    let note = refused[0].message.clone().unwrap_or_default();
    ensure!(
        refused.len() == 1 && note.contains("by its own clock"),
        "{refused:?}"
    );
    renewing.cancel();
    let last = renewals.await??;
    wait_for("the pods to go once the renewals stopped", || async {
        Ok(pod_names(&client, "node-1").await?.is_empty())
    })
    .await?;
    let silent = last.elapsed();
    eprintln!("cleaned {silent:?} after the last renewal (window 2 s)");
    ensure!(
        silent >= Duration::from_secs(2),
        "cleaned {silent:?} after the last renewal"
    );
    gc.stop().await
}

#[tokio::test]
async fn a_tolerating_pods_ephemeral_volume_stays_attached() -> Result<()> {
    let sim = sim(2, world()).await?;
    let client = sim.client();
    let gc = controller(&sim, &[]).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let claim = claim_spec();
    // A node agent that tolerates the taint and keeps a scratch volume of its own…
    let agent = json!({"spec": {
        "tolerations": [{"key": TAINT, "operator": "Exists"}],
        "volumes": [{"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": claim}}}],
    }});
    pods.create(&PostParams::default(), &pod("agent", "node-1", &agent)?)
        .await?;
    // …next to a database whose volume must move.
    let claims = create_claim(&client, "data").await?;
    let database = json!({"spec": {"volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]}});
    pods.create(&PostParams::default(), &pod("db", "node-1", &database)?)
        .await?;
    let volume_of = |claim: &'static str| {
        let claims = claims.clone();
        async move {
            Ok::<_, anyhow::Error>(
                claims
                    .get_opt(claim)
                    .await?
                    .and_then(|c| c.spec)
                    .and_then(|s| s.volume_name),
            )
        }
    };
    let attachments: Api<VolumeAttachment> = Api::all(client.clone());
    let attached = |volume: Option<String>| {
        let attachments = attachments.clone();
        async move {
            let Some(volume) = volume else {
                return Ok::<_, anyhow::Error>(false);
            };
            Ok(attachments
                .list(&ListParams::default())
                .await?
                .items
                .iter()
                .any(|va| va.spec.source.persistent_volume_name.as_deref() == Some(&volume)))
        }
    };
    wait_for("both volumes to be attached", || async {
        Ok(attached(volume_of("agent-scratch").await?).await?
            && attached(volume_of("data").await?).await?)
    })
    .await?;
    let scratch = volume_of("agent-scratch").await?;
    let data = volume_of("data").await?;
    kill(&client, "node-1").await?;
    taint(&client, "node-1").await?;
    wait_for("the database and its attachment to be gone", || async {
        Ok(pods.get_opt("db").await?.is_none() && !attached(data.clone()).await?)
    })
    .await?;
    let kept = attachments
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .find(|va| va.spec.source.persistent_volume_name == scratch);
    ensure!(
        kept.is_some_and(|va| va.metadata.deletion_timestamp.is_none()),
        "the agent's scratch volume was detached under it"
    );
    ensure!(gc.counter("volumes_force_detached").await? <= 1);
    gc.stop().await
}

/// The cleanup of a deleted node ends with it: a namesake registered under its name (a new
/// machine, a new UID) gets a cleanup of its own, which starts afresh and acts on the
/// namesake's pods — and the old one never writes the new Node.
#[tokio::test]
async fn a_namesake_registered_mid_cleanup_gets_a_cleanup_of_its_own() -> Result<()> {
    let sim = sim(2, world()).await?;
    let client = sim.client();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let held = json!({"metadata": {"finalizers": ["example.com/hold"]}});
    pods.create(&PostParams::default(), &pod("held", "node-1", &held)?)
        .await?;
    running_pods(&client, "node-1", 1).await?;
    kill(&client, "node-1").await?;
    taint(&client, "node-1").await?;
    let gc = controller(&sim, &[]).await?;
    // The first Node's cleanup force-deletes the pod; its finalizer keeps it, so the cleanup
    // goes on waiting for it.
    wait_for("the held pod to be force-deleted", || async {
        Ok(pods
            .get("held")
            .await?
            .metadata
            .deletion_timestamp
            .is_some())
    })
    .await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let first = nodes.get("node-1").await?.metadata.uid;
    nodes
        .delete("node-1", &kube::api::DeleteParams::default())
        .await?;
    wait_for("the first node-1 to be gone", || async {
        Ok(nodes.get_opt("node-1").await?.is_none())
    })
    .await?;
    let namesake: Node = serde_json::from_value(json!({
        "metadata": {"name": "node-1", "annotations": {"sim.nodegrace.io/kubelet": "stopped"}},
        "spec": {"taints": [{"key": TAINT, "value": "nodeshutdown", "effect": "NoExecute"}]},
    }))?;
    let second = nodes
        .create(&PostParams::default(), &namesake)
        .await?
        .metadata
        .uid;
    ensure!(first != second, "a namesake is another object");
    pods.create(
        &PostParams::default(),
        &pod("newcomer", "node-1", &json!({}))?,
    )
    .await?;
    wait_for("the namesake's pod to be force-deleted", || async {
        Ok(pods
            .get_opt("newcomer")
            .await?
            .is_none_or(|pod| pod.metadata.deletion_timestamp.is_some()))
    })
    .await?;
    // Written by the reporter a moment after the deletion.
    wait_for("the namesake's cleanup to say what it did", || async {
        Ok(events_with_reason(&client, "ForceDeleted")
            .await?
            .iter()
            .any(|event| event.involved_object.name.as_deref() == Some("newcomer")))
    })
    .await?;
    let node = nodes.get("node-1").await?;
    ensure!(node.metadata.uid == second && has_taint(&node));
    gc.stop().await
}
