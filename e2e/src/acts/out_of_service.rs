//! Act: node-2, running a StatefulSet's pod with its volume, loses power. The pod hangs
//! Terminating and the StatefulSet cannot replace it. The operator marks the node out of
//! service; out-of-service-gc force-deletes the pod and detaches the volume, and the replacement
//! runs on another node with the volume attached. node-2 boots again and the taint goes.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::{Event, Node, PersistentVolumeClaim, Pod, Taint};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::ListParams;
use kube::{Api, Client};
use nodegrace_core::k8s::taints::change_taints;

use super::Act;
use crate::manifests::{self, describe_all};
use crate::observe::{node, node_condition};
use crate::stage::{NODE_MONITOR_GRACE_PERIOD, Stage};
use crate::timeline::{millis, seconds};
use crate::wait::poll_for;

pub const ACT: Act = Act {
    slug: "out-of-service",
    title: "node-2 dies hard: out-of-service-gc moves its StatefulSet pod and volume",
    play: |stage| Box::pin(play(stage)),
};

const NODE: &str = "node-2";
const NAMESPACE: &str = "payments";
const POD: &str = "ledger-0";
const CLAIM: &str = "data-ledger-0";
pub(crate) const LEDGER: &str = include_str!("../../demo/ledger.yaml");
const OUT_OF_SERVICE_TAINT: &str = "node.kubernetes.io/out-of-service";
const CONDITION: &str = "OutOfServiceCleanup";
/// Bounds each wait of a broken run; a working one takes seconds.
const TIMEOUT: Duration = Duration::from_secs(45);

async fn play(stage: &mut Stage) -> Result<()> {
    let client = stage.client().clone();
    let objects = manifests::parse_documents(LEDGER)?;
    for object in &objects {
        manifests::create(&client, object, NAMESPACE).await?;
    }
    stage.timeline.event(&format!(
        "created {} (one replica, a 10Gi ReadWriteOnce volume, prefers {NODE})",
        describe_all(&objects)
    ));
    let first = running_ledger(&client, |node| node == NODE).await?;
    let old_uid = first.metadata.uid.clone().unwrap_or_default();
    let volume = claimed_volume(&client).await?;
    let attachment = attached(&client, &volume, NODE).await?;
    stage.timeline.event(&format!(
        "{NAMESPACE}/{POD} Running on {NODE}; its volume {volume} is attached there (VolumeAttachment {attachment})"
    ));
    stage
        .timeline
        .show(&format!("kubectl -n {NAMESPACE} get pods,pvc -o wide"));
    stage.timeline.show("kubectl get volumeattachments");

    stage.power_off(NODE).await?;
    let died = Instant::now();
    stage.timeline.event(&format!(
        "{NODE} loses power: its processes and elogind are gone, its kubelet stops renewing its Lease"
    ));
    wait_not_ready(&client).await?;
    stage.timeline.event(&format!(
        "{NODE} NotReady after {} (no Lease renewal for the {} node-monitor grace)",
        seconds(died.elapsed()),
        seconds(NODE_MONITOR_GRACE_PERIOD)
    ));
    wait_terminating(&client, &old_uid).await?;
    stage.timeline.event(&format!(
        "the taint manager evicted {POD} after its 5 s toleration: it is Terminating, and with no \
         kubelet to finish it, it stays so; the StatefulSet cannot create {POD} anew meanwhile"
    ));
    stage
        .timeline
        .show(&format!("kubectl -n {NAMESPACE} get pods -o wide"));

    taint_out_of_service(&client).await?;
    let tainted = Instant::now();
    // Told, not offered as a `$` command: typed again on a kept cluster it would take the
    // node, back by then, out of service.
    stage.timeline.event(&format!(
        "the operator confirms {NODE} is off and marks it out of service: \
         `kubectl taint nodes {NODE} {OUT_OF_SERVICE_TAINT}=nodeshutdown:NoExecute`"
    ));
    wait_pod_gone(&client, &old_uid).await?;
    let forced = force_deleted_event(&client, &old_uid).await?;
    stage.timeline.event(&format!(
        "out-of-service-gc force-deleted {POD} {} after the taint: \"{forced}\"",
        millis(tainted.elapsed())
    ));
    wait_detached(&client, &attachment).await?;
    stage.timeline.event(&format!(
        "VolumeAttachment {attachment} gone {} after the taint: the volume detached from {NODE}",
        seconds(tainted.elapsed())
    ));
    let replacement = running_ledger(&client, |node| node != NODE).await?;
    let new_node = node_of(&replacement);
    let moved = attached(&client, &volume, &new_node).await?;
    stage.timeline.event(&format!(
        "the StatefulSet's new {POD} Running on {new_node} with {volume} attached there \
         (VolumeAttachment {moved}), {} after the taint",
        seconds(tainted.elapsed())
    ));
    let done = wait_condition_reason(&client, "Done").await?;
    stage
        .timeline
        .event(&format!("{NODE} has condition {CONDITION} (Done: {done})"));
    // Act 4 deletes node-2: its row is told as run now.
    let status = stage.nodegrace_then(&["status", NODE]).await?;
    if !status.contains("cleaned (Done)") {
        bail!("kubectl nodegrace status does not show {NODE} cleaned:\n{status}");
    }
    let story = stage
        .nodegrace(&["explain", "pod", &format!("{NAMESPACE}/{POD}")])
        .await?;
    if !story.contains("force-deleted by out-of-service-gc") {
        bail!("kubectl nodegrace explain pod does not name out-of-service-gc:\n{story}");
    }
    // Not the Node's condition as a command: act 4 deletes node-2, its Events stay.
    stage
        .timeline
        .show("kubectl get events -A --field-selector reason=ForceDeleted");
    stage.timeline.pass(&format!(
        "the stateful service failed over {} after the taint, its volume with it",
        seconds(tainted.elapsed())
    ));

    stage.timeline.event(&format!(
        "{NODE} boots again: a fresh elogind, its kubelet, the agents' processes"
    ));
    stage.power_on(NODE).await?;
    let booted = Instant::now();
    wait_untainted(&client).await?;
    stage.timeline.event(&format!(
        "out-of-service-gc removed the out-of-service taint {} after the boot (Ready again, \
         nothing from before left)",
        seconds(booted.elapsed())
    ));
    wait_condition_reason(&client, "TaintRemoved").await?;
    stage.timeline.show(&format!(
        "kubectl get events --field-selector involvedObject.name={NODE} --sort-by=.metadata.creationTimestamp"
    ));
    stage.timeline.pass(&format!(
        "{NODE} is back in service, its taint gone without an operator"
    ));
    Ok(())
}

fn node_of(pod: &Pod) -> String {
    pod.spec
        .as_ref()
        .and_then(|spec| spec.node_name.clone())
        .unwrap_or_default()
}

fn ready(conditions: Option<&Vec<k8s_openapi::api::core::v1::PodCondition>>) -> bool {
    conditions.is_some_and(|conditions| {
        conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
    })
}

/// Waits for `ledger-0` Running and Ready on a node `placed` accepts.
pub(crate) async fn running_ledger(client: &Client, placed: impl Fn(&str) -> bool) -> Result<Pod> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let running = poll_for(TIMEOUT, || async {
        let pod = pods.get_opt(POD).await.ok()??;
        let status = pod.status.as_ref()?;
        (pod.metadata.deletion_timestamp.is_none()
            && status.phase.as_deref() == Some("Running")
            && ready(status.conditions.as_ref())
            && placed(&node_of(&pod)))
        .then_some(pod)
    })
    .await;
    if let Some(pod) = running {
        return Ok(pod);
    }
    let now = pods.get_opt(POD).await?;
    bail!(
        "{NAMESPACE}/{POD} is not Running and Ready where expected after {TIMEOUT:?}; it is {}",
        now.map_or_else(
            || "missing".to_owned(),
            |pod| format!(
                "on {:?} in phase {:?}",
                node_of(&pod),
                pod.status.and_then(|s| s.phase)
            )
        )
    )
}

async fn claimed_volume(client: &Client) -> Result<String> {
    let claim = Api::<PersistentVolumeClaim>::namespaced(client.clone(), NAMESPACE)
        .get(CLAIM)
        .await
        .with_context(|| format!("read claim {NAMESPACE}/{CLAIM}"))?;
    claim
        .spec
        .and_then(|spec| spec.volume_name)
        .with_context(|| format!("claim {NAMESPACE}/{CLAIM} is bound to no volume"))
}

/// Waits until `volume` is attached to `node`; returns the VolumeAttachment's name.
async fn attached(client: &Client, volume: &str, node: &str) -> Result<String> {
    let attachments: Api<VolumeAttachment> = Api::all(client.clone());
    let found = poll_for(TIMEOUT, || async {
        attachments
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .into_iter()
            .find(|va| {
                va.spec.node_name == node
                    && va.spec.source.persistent_volume_name.as_deref() == Some(volume)
                    && va.metadata.deletion_timestamp.is_none()
                    && va.status.as_ref().is_some_and(|status| status.attached)
            })
            .and_then(|va| va.metadata.name)
    })
    .await;
    found.with_context(|| format!("volume {volume} is not attached to {node} after {TIMEOUT:?}"))
}

pub(crate) async fn wait_not_ready(client: &Client) -> Result<()> {
    let not_ready = poll_for(TIMEOUT, || async {
        let ready = node_condition(client, NODE, "Ready").await.ok()??;
        (ready.status != "True").then_some(())
    })
    .await;
    not_ready.with_context(|| format!("{NODE} is still Ready {TIMEOUT:?} after losing power"))
}

async fn wait_terminating(client: &Client, uid: &str) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let terminating = poll_for(TIMEOUT, || async {
        let pod = pods.get_opt(POD).await.ok()??;
        (pod.metadata.uid.as_deref() == Some(uid) && pod.metadata.deletion_timestamp.is_some())
            .then_some(())
    })
    .await;
    terminating
        .with_context(|| format!("{POD} was not evicted from the dead {NODE} within {TIMEOUT:?}"))
}

/// What `kubectl taint nodes node-2 node.kubernetes.io/out-of-service=nodeshutdown:NoExecute`
/// writes.
pub(crate) async fn taint_out_of_service(client: &Client) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    change_taints(&nodes, NODE, |_, taints| {
        taints.push(Taint {
            key: OUT_OF_SERVICE_TAINT.to_owned(),
            value: Some("nodeshutdown".to_owned()),
            effect: "NoExecute".to_owned(),
            time_added: None,
        });
        true
    })
    .await
    .with_context(|| format!("taint {NODE} out of service"))?;
    Ok(())
}

async fn wait_pod_gone(client: &Client, uid: &str) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let gone = poll_for(TIMEOUT, || async {
        let pod = pods.get_opt(POD).await.ok()?;
        pod.is_none_or(|pod| pod.metadata.uid.as_deref() != Some(uid))
            .then_some(())
    })
    .await;
    gone.with_context(|| {
        format!("the Terminating {POD} is still there {TIMEOUT:?} after the out-of-service taint")
    })
}

/// The note of the controller's `ForceDeleted` Event on the pod with `uid`.
async fn force_deleted_event(client: &Client, uid: &str) -> Result<String> {
    let events: Api<Event> = Api::namespaced(client.clone(), NAMESPACE);
    let note = poll_for(TIMEOUT, || async {
        events
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .into_iter()
            .find(|event| {
                event.reason.as_deref() == Some("ForceDeleted")
                    && event.involved_object.uid.as_deref() == Some(uid)
            })
            .map(|event| event.message.unwrap_or_default())
    })
    .await;
    note.with_context(|| format!("no ForceDeleted Event on {POD} after {TIMEOUT:?}"))
}

async fn wait_detached(client: &Client, attachment: &str) -> Result<()> {
    let attachments: Api<VolumeAttachment> = Api::all(client.clone());
    let gone = poll_for(TIMEOUT, || async {
        attachments
            .get_opt(attachment)
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    gone.with_context(|| format!("VolumeAttachment {attachment} still exists after {TIMEOUT:?}"))
}

/// Waits until node-2's `OutOfServiceCleanup` condition has `reason`; returns its message.
async fn wait_condition_reason(client: &Client, reason: &str) -> Result<String> {
    let message = poll_for(TIMEOUT, || async {
        let condition = node_condition(client, NODE, CONDITION).await.ok()??;
        (condition.reason.as_deref() == Some(reason)).then(|| condition.message.unwrap_or_default())
    })
    .await;
    message.with_context(|| {
        format!("{NODE} has no condition {CONDITION} with reason {reason} after {TIMEOUT:?}")
    })
}

async fn wait_untainted(client: &Client) -> Result<()> {
    let untainted = poll_for(TIMEOUT, || async {
        let node = node(client, NODE).await.ok()?;
        let taints = node.spec.and_then(|spec| spec.taints).unwrap_or_default();
        (!taints.iter().any(|taint| taint.key == OUT_OF_SERVICE_TAINT)).then_some(())
    })
    .await;
    untainted.with_context(|| {
        format!("{NODE} still has the out-of-service taint {TIMEOUT:?} after it booted")
    })
}
