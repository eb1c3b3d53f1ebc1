//! `kubectl nodegrace explain pod NS/P`: why a pod was evicted, force-deleted or terminated,
//! and by which program. While the pod exists its `DisruptionTarget` condition says it; once
//! it is gone, its Events do (a real API server keeps them for an hour).

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, Client};
use out_of_service_gc::conditions::Reason as GcReason;
use serde::Serialize;

use crate::lifecycle::{API_VERSION, Program};
use crate::read::{Access, Unread, optional_get};
use crate::timeline::{self, Moment};

/// What ended (or is ending) the pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Verdict {
    /// `None`: not a nodegrace program (the scheduler's preemption, the taint manager, …).
    pub program: Option<Program>,
    /// `evicted`, `force-deleted`, `terminated`, `deleted at the drain deadline`, or the
    /// condition's reason when it is no program's of ours.
    pub how: String,
    pub reason: String,
    pub message: String,
    pub at: Option<Timestamp>,
    /// Where this was read: `DisruptionTarget` or `Event`.
    pub from: &'static str,
    /// The UID of the pod it happened to, when that is not the pod of this name now (a
    /// StatefulSet's earlier pod).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub earlier_uid: Option<String>,
}

/// The last Event in `moments` by which a program of ours ended the pod; `earlier`: the
/// Events are of pods of this name before the one there now.
fn decided(moments: &[Moment], earlier: bool) -> Option<Verdict> {
    moments.iter().rev().find_map(|moment| {
        let program = moment.program()?;
        let how = how(program, &moment.reason)?;
        Some(Verdict {
            program: Some(program),
            how: how.to_owned(),
            reason: moment.reason.clone(),
            message: moment.message.clone(),
            at: moment.at,
            from: "Event",
            earlier_uid: moment.uid.clone().filter(|_| earlier),
        })
    })
}

/// `kubectl nodegrace explain pod NS/P -o json`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodStory {
    pub api_version: &'static str,
    pub kind: &'static str,
    pub observed_at: Timestamp,
    pub pod: String,
    /// Whether a pod of this name exists now (it may be a namesake: see `uid`).
    pub exists: bool,
    pub uid: Option<String>,
    pub node: Option<String>,
    /// `None`: no nodegrace program acted on it, as far as its condition and Events tell.
    pub verdict: Option<Verdict>,
    pub timeline: Vec<Moment>,
    pub unread: Vec<String>,
}

/// How each program's reason on a pod reads.
fn how(program: Program, reason: &str) -> Option<&'static str> {
    match (program, reason) {
        (Program::TerminationController, "Evicted") => Some("evicted"),
        (Program::TerminationController, "DrainDeadline") => Some("deleted at the drain deadline"),
        (Program::OutOfServiceGc, reason)
            if reason == GcReason::ForceDeleted.as_str()
                || reason == GcReason::ForceDeletedHeldByFinalizers.as_str() =>
        {
            Some("force-deleted")
        }
        _ => None,
    }
}

/// The program a `DisruptionTarget` reason names, and how.
fn disruption_target(reason: &str) -> (Option<Program>, &'static str) {
    match reason {
        "TerminationByNodeShutdown" => (Some(Program::GracefulShutdownAgent), "terminated"),
        r if r == GcReason::DeletionByOutOfServiceGC.as_str() => {
            (Some(Program::OutOfServiceGc), "force-deleted")
        }
        "EvictionByEvictionAPI" => (None, "evicted"),
        "PreemptionByScheduler" => (None, "preempted"),
        "DeletionByTaintManager" => (None, "deleted by the taint manager"),
        "DeletionByPodGC" => (None, "deleted by the pod garbage collector"),
        "TerminationByKubelet" => (None, "terminated by the kubelet"),
        _ => (None, "disrupted"),
    }
}

pub async fn explain(client: &Client, namespace: &str, name: &str) -> anyhow::Result<PodStory> {
    let mut unread = Unread::default();
    let pod = optional_get(
        &Api::<Pod>::namespaced(client.clone(), namespace),
        name,
        &Access::get::<Pod>(format!("in namespace {namespace}")),
        &mut unread,
    )
    .await?;
    let every = timeline::events(client, "Pod", Some(namespace), name, &mut unread).await?;
    let uid = pod.as_ref().and_then(|pod| pod.metadata.uid.clone());
    // A namesake's Events (a StatefulSet's pod before) are not this pod's story.
    let (moments, earlier): (Vec<Moment>, Vec<Moment>) = every
        .into_iter()
        .partition(|moment| uid.is_none() || moment.uid.is_none() || moment.uid == uid);
    let condition = pod
        .as_ref()
        .and_then(|pod| pod.status.as_ref())
        .and_then(|status| status.conditions.as_ref())
        .and_then(|conditions| {
            conditions
                .iter()
                .find(|c| c.type_ == "DisruptionTarget" && c.status == "True")
        });
    let from_events = || decided(&moments, false);
    let node = pod
        .as_ref()
        .and_then(|pod| pod.spec.as_ref())
        .and_then(|spec| spec.node_name.clone());
    let mut verdict = match condition {
        Some(condition) => {
            let reason = condition.reason.clone().unwrap_or_default();
            let (program, how) = disruption_target(&reason);
            // An eviction is anyone's: the Events say whose.
            let program = program.or_else(|| from_events().and_then(|verdict| verdict.program));
            Some(Verdict {
                program,
                how: how.to_owned(),
                reason,
                message: condition.message.clone().unwrap_or_default(),
                at: condition.last_transition_time.as_ref().map(|time| time.0),
                from: "DisruptionTarget",
                earlier_uid: None,
            })
        }
        None => from_events(),
    };
    if verdict.is_none() {
        verdict = node_shutdown(client, node.as_deref(), &moments, &mut unread).await?;
    }
    if verdict.is_none() {
        // The pod of this name now is a replacement (a StatefulSet's): say what ended the one
        // before it.
        verdict = decided(&earlier, true);
    }
    Ok(PodStory {
        api_version: API_VERSION,
        kind: "PodStory",
        observed_at: Timestamp::now(),
        pod: format!("{namespace}/{name}"),
        exists: pod.is_some(),
        uid,
        node,
        verdict,
        timeline: moments,
        unread: unread.0,
    })
}

/// A pod gone with its node's shutdown: graceful-shutdown-agent writes no Event on the pods it
/// stops (every write of a shutdown is budgeted), so the story is the node's. The pod's last
/// Event from its kubelet names the node; the agent's `NodeShutdown` Event on it, at or before
/// that Event, says the shutdown stopped it.
async fn node_shutdown(
    client: &Client,
    node: Option<&str>,
    moments: &[Moment],
    unread: &mut Unread,
) -> anyhow::Result<Option<Verdict>> {
    let Some(last) = moments.iter().rev().find(|moment| moment.host.is_some()) else {
        return Ok(None);
    };
    let Some(host) = node.or(last.host.as_deref()) else {
        return Ok(None);
    };
    let node_moments = timeline::events(client, "Node", None, host, unread).await?;
    let shutdown = node_moments.iter().rev().find(|moment| {
        moment.program() == Some(Program::GracefulShutdownAgent)
            && moment.reason == "NodeShutdown"
            // core/v1 Event times are whole seconds; the agent's are finer.
            && moment.at.map(Timestamp::as_second) <= last.at.map(Timestamp::as_second)
    });
    Ok(shutdown.map(|shutdown| Verdict {
        program: Some(Program::GracefulShutdownAgent),
        how: "terminated".to_owned(),
        reason: shutdown.reason.clone(),
        message: format!("node {host}'s shutdown: {}", shutdown.message),
        at: shutdown.at,
        from: "Event",
        earlier_uid: None,
    }))
}
