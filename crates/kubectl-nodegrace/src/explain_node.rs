//! `kubectl nodegrace explain node X`: the node's rows with their blockers read in depth (the
//! drain plan for a node held by its pods), its timeline, and the one command that would
//! unblock it.

use std::fmt::Write as _;

use jiff::Timestamp;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{Api, Client};
use nodegrace_controller::InstanceProviderKind;
use nodegrace_core::k8s::node_shutdown::{
    SHUTDOWN_IN_PROGRESS_CONDITION, SHUTDOWN_INHIBITED_CONDITION,
};
use nodegrace_core::k8s::nodes::{NodeFields, Readiness, readiness};
use out_of_service_gc::api::{CLEANUP_CONDITION, FENCE_CONDITION};
use serde::Serialize;
use termination_controller::api::DO_NOT_EVICT;
use termination_controller::conditions::{
    DRAIN_IN_PROGRESS, DRAINED, MAINTENANCE_PLANNED, Reason as TcReason, TERMINATING,
};
use termination_controller::plan::{self, Plan};

use crate::commands::{guarded_patch, widened};
use crate::lifecycle::{API_VERSION, Blocker, Next, NodeLifecycle, ObjectRef, Program, State};
use crate::read::{Access, Unread, optional_get};
use crate::status::Snapshot;
use crate::timeline::{self, Moment};

/// The conditions a node's timeline shows, and who writes each.
const CONDITIONS: [(&str, &str); 9] = [
    ("Ready", "kubelet"),
    (SHUTDOWN_IN_PROGRESS_CONDITION, "graceful-shutdown-agent"),
    (SHUTDOWN_INHIBITED_CONDITION, "shutdown-inhibitor-agent"),
    (CLEANUP_CONDITION, "out-of-service-gc"),
    (FENCE_CONDITION, "out-of-service-gc"),
    (TERMINATING, "termination-controller"),
    (MAINTENANCE_PLANNED, "termination-controller"),
    (DRAIN_IN_PROGRESS, "termination-controller"),
    (DRAINED, "termination-controller"),
];

/// `kubectl nodegrace explain node X -o json`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeStory {
    pub api_version: &'static str,
    pub kind: &'static str,
    pub observed_at: Timestamp,
    pub node: String,
    pub uid: Option<String>,
    /// `Ready`, `NotReady` or `Unknown`.
    pub ready: &'static str,
    /// Where it stands in each program's work (one `healthy` row when in none).
    pub now: Vec<NodeLifecycle>,
    /// Events and conditions, oldest first.
    pub timeline: Vec<Moment>,
    /// The command that would unblock it, when one would.
    pub unblock: Option<String>,
    pub unread: Vec<String>,
}

pub async fn explain(client: &Client, node: &str) -> anyhow::Result<NodeStory> {
    let mut snapshot = Snapshot::read(client, &[node.to_owned()]).await?;
    let now = Timestamp::now();
    let mut rows = snapshot.rows(true, now);
    for row in &mut rows {
        deepen(client, row, &mut snapshot.unread).await?;
    }
    let found = &snapshot.nodes[0];
    let uid = found.metadata.uid.clone();
    let mut moments = timeline::events(client, "Node", None, node, &mut snapshot.unread).await?;
    // Events about a namesake that had the name before are not this node's story. Node
    // Events by name carry the name as their UID (the kubelet's convention, and
    // `nodegrace_core::k8s::nodes::node_reference`'s): those are kept.
    moments.retain(|moment| {
        moment.uid.is_none() || moment.uid == uid || moment.uid.as_deref() == Some(node)
    });
    moments.extend(timeline::conditions(found.conditions(), &CONDITIONS));
    moments.sort_by_key(|moment| moment.at);
    let unblock = rows
        .iter()
        .find_map(|row| row.next.as_ref().and_then(|next| next.command.clone()));
    Ok(NodeStory {
        api_version: API_VERSION,
        kind: "NodeStory",
        observed_at: now,
        node: node.to_owned(),
        uid,
        ready: match readiness(found) {
            Readiness::Ready => "Ready",
            Readiness::NotReady => "NotReady",
            Readiness::Unknown => "Unknown",
        },
        now: rows,
        timeline: moments,
        unblock,
        unread: snapshot.unread.0,
    })
}

/// A drain held by its pods: the drain plan names the pod and its budget.
async fn deepen(
    client: &Client,
    row: &mut NodeLifecycle,
    unread: &mut Unread,
) -> anyhow::Result<()> {
    if row.program != Some(Program::TerminationController) || row.state != State::Deleting {
        return Ok(());
    }
    let step = row.step.as_deref();
    let held_by_pods = [TcReason::Draining, TcReason::BlockedByDoNotEvict]
        .iter()
        .any(|reason| Some(reason.as_str()) == step);
    if !held_by_pods {
        return Ok(());
    }
    let drain_plan = match plan::gather(client, &row.node).await {
        Ok(cluster) => plan::plan(&cluster, InstanceProviderKind::None, Timestamp::now()),
        Err(error) => {
            unread.0.push(format!(
                "could not read the drain plan ({error:#}); the row keeps the controller's words"
            ));
            return Ok(());
        }
    };
    if step == Some(TcReason::BlockedByDoNotEvict.as_str()) {
        if let Some((blocker, next)) = do_not_evict(client, &drain_plan, unread).await? {
            row.blocked_by = Some(blocker);
            row.next = Some(next);
        }
        return Ok(());
    }
    if let Some((blocker, next)) = held_by_budget(client, &drain_plan, unread).await? {
        row.blocked_by = Some(blocker);
        row.next = Some(next);
    }
    Ok(())
}

async fn do_not_evict(
    client: &Client,
    drain_plan: &Plan,
    unread: &mut Unread,
) -> anyhow::Result<Option<(Blocker, Next)>> {
    let Some(first) = drain_plan.blockers.first() else {
        return Ok(None);
    };
    let (namespace, name) = first.pod.split_once('/').unwrap_or(("", &first.pod));
    let pod = optional_get(
        &Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client.clone(), namespace),
        name,
        &Access::get::<k8s_openapi::api::core::v1::Pod>(format!("in namespace {namespace}")),
        unread,
    )
    .await?;
    // The label wins over the annotation, as the controller reads it.
    let labelled = pod
        .as_ref()
        .and_then(|pod| pod.metadata.labels.as_ref())
        .is_some_and(|labels| labels.contains_key(DO_NOT_EVICT));
    let verb = if labelled { "label" } else { "annotate" };
    let until = first.until.as_ref().map_or_else(
        || "for as long as it runs".to_owned(),
        |until| format!("until {until}"),
    );
    let mut text = format!(
        "pod {} has {DO_NOT_EVICT}: no eviction starts {until}",
        first.pod
    );
    if drain_plan.blockers.len() > 1 {
        let _ = write!(text, " (and {} more pod(s))", drain_plan.blockers.len() - 1);
    }
    Ok(Some((
        Blocker {
            text,
            object: Some(ObjectRef::new("Pod", Some(namespace), name).key(DO_NOT_EVICT)),
        },
        Next::run(
            "the pod's owner removes the protection when its work may be interrupted, or the pod \
             finishes",
            format!("kubectl {verb} pod {name} -n {namespace} {DO_NOT_EVICT}-"),
        ),
    )))
}

/// The first PodDisruptionBudget that lets none of the node's pods go now.
async fn held_by_budget(
    client: &Client,
    drain_plan: &Plan,
    unread: &mut Unread,
) -> anyhow::Result<Option<(Blocker, Next)>> {
    let Some(queue) = drain_plan
        .tiers
        .iter()
        .flat_map(|tier| &tier.pods)
        .find(|pod| {
            pod.budget
                .as_ref()
                .is_some_and(|budget| budget.disruptions_allowed == 0)
        })
        .map(|pod| pod.queue.clone())
    else {
        return Ok(None);
    };
    let Some((namespace, name)) = queue.split_once('/') else {
        return Ok(None);
    };
    let Some(pdb) = optional_get(
        &Api::<PodDisruptionBudget>::namespaced(client.clone(), namespace),
        name,
        &Access::get::<PodDisruptionBudget>(format!("in namespace {namespace}")),
        unread,
    )
    .await?
    else {
        return Ok(None);
    };
    Ok(Some(budget_blocker(&pdb)))
}

/// "PodDisruptionBudget fleet/web: 3 healthy, minAvailable 3, allows 0", and the patch that
/// lets one more pod go.
pub fn budget_blocker(pdb: &PodDisruptionBudget) -> (Blocker, Next) {
    let namespace = pdb.metadata.namespace.as_deref().unwrap_or_default();
    let name = pdb.metadata.name.as_deref().unwrap_or_default();
    let spec = pdb.spec.as_ref();
    let status = pdb.status.as_ref();
    let (healthy, allowed) = status.map_or((0, 0), |s| {
        (
            s.current_healthy.unwrap_or(0),
            s.disruptions_allowed.unwrap_or(0),
        )
    });
    let rule = match (
        spec.and_then(|s| s.min_available.as_ref()),
        spec.and_then(|s| s.max_unavailable.as_ref()),
    ) {
        (Some(min), _) => format!("minAvailable {}", int_or_string(min)),
        (None, Some(max)) => format!("maxUnavailable {}", int_or_string(max)),
        (None, None) => "no bound".to_owned(),
    };
    let widened = widened(
        spec.and_then(|s| s.min_available.as_ref()),
        spec.and_then(|s| s.max_unavailable.as_ref()),
    );
    let blocker = Blocker {
        text: format!(
            "PodDisruptionBudget {namespace}/{name}: {healthy} healthy, {rule}, allows {allowed}"
        ),
        object: Some(ObjectRef::new("PodDisruptionBudget", Some(namespace), name)),
    };
    let text = "give its workload one more ready replica, or let the budget allow one more \
                disruption";
    let next = match widened {
        Some(change) => Next::run(text, guarded_patch("pdb", name, Some(namespace), change)),
        None => Next::wait(text),
    };
    (blocker, next)
}

fn int_or_string(value: &IntOrString) -> String {
    match value {
        IntOrString::Int(count) => count.to_string(),
        IntOrString::String(text) => text.clone(),
    }
}
