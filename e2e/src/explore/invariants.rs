//! The invariants every history must keep, judged only from what the API server and the
//! simulated cloud saw (kube-sim's audit of deletions and evictions, the cloud's terminate
//! calls, the judge's own watches and reads) — never from the programs' reports.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::Serialize;
use serde_json::Value;

use super::record::{Change, Kind, Seen};

pub const FINALIZER: &str = "nodegrace.io/termination";
pub const DISRUPTED_TAINT: &str = "nodegrace.io/disrupted";
pub const OUT_OF_SERVICE_TAINT: &str = "node.kubernetes.io/out-of-service";
pub const TERMINATION_CONTROLLER_USER: &str =
    "system:serviceaccount:nodegrace:termination-controller";
pub const OUT_OF_SERVICE_GC_USER: &str = "system:serviceaccount:nodegrace:out-of-service-gc";

pub use kube_sim::audit::{Deletion, Disruption, KubeletState, Violation as Unavailability};
pub use kube_sim::world::Instance;

/// One broken invariant: which, when (wall clock, RFC 3339), and what.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Violation {
    pub invariant: u8,
    pub at: String,
    pub what: String,
}

/// 1. No instance is terminated unless a Node that named it (its providerID) was deleted
///    through the API while it carried our finalizer; at most one terminate call per instance.
pub fn terminations(instances: &[Instance], deletions: &[Deletion]) -> Vec<Violation> {
    let mut violations = Vec::new();
    for instance in instances {
        if instance.terminate_calls > 1 {
            violations.push(Violation {
                invariant: 1,
                at: instance
                    .terminate_call_log
                    .get(1)
                    .map(|call| call.at.clone())
                    .unwrap_or_default(),
                what: format!(
                    "instance {} was terminated {} times",
                    instance.provider_id, instance.terminate_calls
                ),
            });
        }
        let Some(first) = instance.terminate_call_log.first() else {
            continue;
        };
        let named_and_deleted = deletions.iter().any(|deletion| {
            deletion.resource == "nodes"
                && deletion.provider_id.as_deref() == Some(instance.provider_id.as_str())
                && deletion.finalizers.iter().any(|f| f == FINALIZER)
                && deletion.revision <= first.revision
        });
        if !named_and_deleted {
            violations.push(Violation {
                invariant: 1,
                at: first.at.clone(),
                what: format!(
                    "instance {} (last registered as {}) was terminated, but no Node naming it was deleted with our finalizer before",
                    instance.provider_id, instance.node
                ),
            });
        }
    }
    violations
}

/// 8. No machine leaks: a machine named by a Node that was deleted with our finalizer ends
///    terminated once no Node names it any more: termination-controller released that Node, and
///    its release says the machine is gone. A Node an operator released by removing our
///    finalizer by hand is owed nothing. A false "not found" (EC2 not yet knowing a machine
///    just launched) that released a live machine shows here.
pub fn leaks(
    deletions: &[Deletion],
    named_now: &BTreeSet<String>,
    released_by_hand: &BTreeSet<String>,
    states: &BTreeMap<String, String>,
) -> Vec<Violation> {
    let mut judged = BTreeSet::new();
    let mut violations = Vec::new();
    for deletion in deletions {
        let Some(machine) = deletion.provider_id.as_ref() else {
            continue;
        };
        if deletion.resource != "nodes"
            || !deletion.finalizers.iter().any(|f| f == FINALIZER)
            || named_now.contains(machine)
            || released_by_hand.contains(machine)
            || !judged.insert(machine.clone())
        {
            continue;
        }
        let state = states.get(machine).map_or("unknown", String::as_str);
        if !matches!(state, "terminated" | "shutting-down") {
            violations.push(Violation {
                invariant: 8,
                at: deletion.at.clone(),
                what: format!(
                    "machine {machine} leaked: node {} was deleted with our finalizer and is gone, but its machine is {state}",
                    deletion.name
                ),
            });
        }
    }
    violations
}

/// 2. No eviction or delete by our programs took a PodDisruptionBudget below `desiredHealthy`,
///    except the deletes of the drain deadline, each named by its `DrainDeadline` Event, and
///    evictions the API server allowed on a budget status that had not yet counted pods turned
///    unhealthy (its `currentHealthy` minus the evicted pod still met `desiredHealthy`): the
///    disruption controller is asynchronous, upstream as in kube-sim, and no client can see
///    past that window.
pub fn availability(
    unavailabilities: &[Unavailability],
    drain_deadline_pods: &BTreeSet<(String, String)>,
) -> Vec<Violation> {
    unavailabilities
        .iter()
        // The default eviction responder evicts only what termination-controller requested.
        .filter(|u| {
            u.user == TERMINATION_CONTROLLER_USER
                || u.user == OUT_OF_SERVICE_GC_USER
                || u.user == kube_sim::world::EVICTOR_USER
        })
        .filter(|u| !deleted_at_the_drain_deadline(u, drain_deadline_pods))
        .filter(|u| !(u.by == Disruption::Eviction && u.status_healthy > u.desired_healthy))
        .map(|u| Violation {
            invariant: 2,
            at: u.at.clone(),
            what: format!(
                "{:?} of {}/{} by {} left PodDisruptionBudget {} with {} healthy pods, below its desiredHealthy {}",
                u.by, u.namespace, u.pod, u.user, u.budget, u.healthy, u.desired_healthy
            ),
        })
        .collect()
}

/// A delete that a `DrainDeadline` Event names: made on purpose, at the drain deadline.
pub fn deleted_at_the_drain_deadline(
    unavailability: &Unavailability,
    drain_deadline_pods: &BTreeSet<(String, String)>,
) -> bool {
    unavailability.by == Disruption::Delete
        && drain_deadline_pods
            .contains(&(unavailability.namespace.clone(), unavailability.pod.clone()))
}

/// 4. out-of-service-gc deleted no pod with grace 0 and no VolumeAttachment while the node's
///    kubelet ran (reporting or cut off), and never touched a `keeper` pod (which tolerates the
///    taint for good) or the attachment of a `keeper` volume while a `keeper` pod was bound to
///    that node (by the judge's watch of the `keeper` pods, replayed to the delete).
pub fn out_of_service(
    deletions: &[Deletion],
    keeper_volumes: &BTreeSet<String>,
    recording: &[Seen],
) -> Vec<Violation> {
    let mut violations = Vec::new();
    for deletion in deletions
        .iter()
        .filter(|d| d.user == OUT_OF_SERVICE_GC_USER)
    {
        let kubelet_ran = matches!(
            deletion.kubelet,
            KubeletState::Running | KubeletState::Partitioned
        ) && !just_powered_on(recording, deletion);
        let keeper_volume = keeper_volumes
            .iter()
            .any(|volume| deletion.name.contains(volume.as_str()));
        let what = match deletion.resource.as_str() {
            "pods" if deletion.grace_period_seconds == Some(0) && kubelet_ran => format!(
                "pod {}/{} force-deleted while the kubelet of {} was {:?}",
                deletion.namespace, deletion.name, deletion.node, deletion.kubelet
            ),
            "pods" if deletion.name.starts_with("keeper-") => format!(
                "pod {}/{} tolerates the out-of-service taint, yet was deleted",
                deletion.namespace, deletion.name
            ),
            "volumeattachments" if kubelet_ran => format!(
                "VolumeAttachment {} deleted while the kubelet of {} was {:?}",
                deletion.name, deletion.node, deletion.kubelet
            ),
            "volumeattachments"
                if keeper_volume && keeper_bound(recording, &deletion.node, deletion.revision) =>
            {
                format!(
                    "VolumeAttachment {} deleted while a keeper pod, which tolerates the out-of-service taint, was bound to {}",
                    deletion.name, deletion.node
                )
            }
            _ => continue,
        };
        violations.push(Violation {
            invariant: 4,
            at: deletion.at.clone(),
            what,
        });
    }
    violations
}

/// How often one program may delete one object (by UID): a retry after a lost answer, and once
/// more by a new leader whose cache had not yet seen the first, are legitimate.
const DELETES_PER_OBJECT: usize = 3;

/// 7. No busy loop: neither program deletes one object (by UID) more than
///    [`DELETES_PER_OBJECT`] times — a delete that changes nothing, repeated, is a controller
///    that cannot see it is done (seed 131 found ~1,400 of one pod).
pub fn repeated_deletes(deletions: &[Deletion]) -> Vec<Violation> {
    let mut counts: BTreeMap<(&str, &str), Vec<&Deletion>> = BTreeMap::new();
    for deletion in deletions.iter().filter(|deletion| {
        deletion.user == OUT_OF_SERVICE_GC_USER || deletion.user == TERMINATION_CONTROLLER_USER
    }) {
        counts
            .entry((deletion.user.as_str(), deletion.uid.as_str()))
            .or_default()
            .push(deletion);
    }
    counts
        .into_values()
        .filter(|same| same.len() > DELETES_PER_OBJECT)
        .map(|same| {
            let first = same[0];
            Violation {
                invariant: 7,
                at: same[DELETES_PER_OBJECT].at.clone(),
                what: format!(
                    "{} deleted {} {}/{} {} times (first at {}, last at {})",
                    first.user,
                    first.resource,
                    first.namespace,
                    first.name,
                    same.len(),
                    first.at,
                    same[same.len() - 1].at
                ),
            }
        })
        .collect()
}

/// How long after its machine came back a delete may still have been decided while it was off:
/// the time a request takes to reach the API server, which no cleanup can shorten (KEP-2268
/// leaves it to the operator's confirmation that the machine is off).
const DECIDED_WHILE_OFF: jiff::SignedDuration = jiff::SignedDuration::from_secs(1);

/// Whether the delete reached the API server within [`DECIDED_WHILE_OFF`] of the node's machine
/// coming back (its kubelet annotation leaving `stopped`/`booting`, by the judge's watch).
fn just_powered_on(recording: &[Seen], deletion: &Deletion) -> bool {
    let Ok(at) = deletion.at.parse::<jiff::Timestamp>() else {
        return false;
    };
    let last_off = recording
        .iter()
        .filter(|seen| seen.kind == Kind::Node && seen.revision <= deletion.revision)
        .filter(|seen| match &seen.change {
            Change::Upsert(node) => {
                node["metadata"]["name"] == deletion.node.as_str()
                    && matches!(
                        node["metadata"]["annotations"]["sim.nodegrace.io/kubelet"].as_str(),
                        Some("stopped" | "booting")
                    )
            }
            _ => false,
        })
        .map(|seen| seen.received)
        .max();
    last_off.is_some_and(|off| at.duration_since(off) < DECIDED_WHILE_OFF)
}

/// Whether a `keeper` pod was bound to `node` as of `revision`.
fn keeper_bound(recording: &[Seen], node: &str, revision: u64) -> bool {
    let mut bound: BTreeMap<String, String> = BTreeMap::new();
    for seen in recording
        .iter()
        .filter(|seen| seen.kind == Kind::Keeper && seen.revision <= revision)
    {
        match &seen.change {
            Change::Upsert(pod) => {
                let name = pod["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                let node = pod["spec"]["nodeName"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                bound.insert(name, node);
            }
            Change::Removed(name) => {
                bound.remove(name);
            }
            Change::Resync(names) => bound.retain(|name, _| names.contains(name)),
        }
    }
    bound.values().any(|bound_to| bound_to == node)
}

/// A Node as the budget judge needs it.
#[derive(Debug, Clone)]
struct NodeView {
    uid: String,
    labels: BTreeMap<String, String>,
    ready: bool,
    cordoned_by_us: bool,
    deleting: bool,
    ours: bool,
}

/// A JSON map of strings (labels, a selector's `matchLabels`).
fn string_map(value: &Value) -> BTreeMap<String, String> {
    value
        .as_object()
        .map(|map| {
            map.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                .collect()
        })
        .unwrap_or_default()
}

impl NodeView {
    fn of(node: &Value) -> Self {
        let labels = string_map(&node["metadata"]["labels"]);
        let ready = node["status"]["conditions"].as_array().is_some_and(|c| {
            c.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        });
        let cordoned_by_us = node["spec"]["taints"]
            .as_array()
            .is_some_and(|t| t.iter().any(|t| t["key"] == DISRUPTED_TAINT));
        let ours = node["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|f| f.iter().any(|f| f == FINALIZER));
        Self {
            uid: node["metadata"]["uid"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            labels,
            ready,
            cordoned_by_us,
            deleting: node["metadata"]["deletionTimestamp"].is_string(),
            ours,
        }
    }

    /// Disrupted as the documentation counts it: cordoned by us, or going without our
    /// finalizer.
    fn disrupted(&self) -> bool {
        self.cordoned_by_us || (self.deleting && !self.ours)
    }
}

/// A NodeDisruptionBudget's spec as the judge reads it.
#[derive(Debug, Clone)]
struct BudgetView {
    match_labels: BTreeMap<String, String>,
    min_available: Option<Value>,
    max_unavailable: Option<Value>,
}

impl BudgetView {
    fn of(budget: &Value) -> Self {
        let match_labels = string_map(&budget["spec"]["selector"]["matchLabels"]);
        Self {
            match_labels,
            min_available: Some(budget["spec"]["minAvailable"].clone()).filter(|v| !v.is_null()),
            max_unavailable: Some(budget["spec"]["maxUnavailable"].clone())
                .filter(|v| !v.is_null()),
        }
    }

    /// An empty selector selects no node (documented).
    fn selects(&self, node: &NodeView) -> bool {
        !self.match_labels.is_empty()
            && self
                .match_labels
                .iter()
                .all(|(key, value)| node.labels.get(key) == Some(value))
    }

    /// How many selected nodes must stay available; percentages round up.
    fn desired_available(&self, selected: usize) -> Option<usize> {
        let scaled = |value: &Value| -> Option<usize> {
            match value {
                Value::Number(n) => n.as_u64().and_then(|n| usize::try_from(n).ok()),
                Value::String(s) => {
                    let percent: usize = s.strip_suffix('%')?.parse().ok()?;
                    Some((selected * percent).div_ceil(100))
                }
                _ => None,
            }
        };
        match (&self.min_available, &self.max_unavailable) {
            (Some(min), None) => scaled(min),
            (None, Some(max)) => Some(selected.saturating_sub(scaled(max)?)),
            _ => None,
        }
    }

    /// Whether `candidate` may be disrupted now: not Ready, or the selected nodes that are
    /// Ready and not disrupted, `candidate` counted among them, stay at least the desired
    /// number once it is gone.
    fn allows(&self, candidate: &str, nodes: &BTreeMap<String, NodeView>) -> bool {
        let Some(node) = nodes.get(candidate) else {
            return true;
        };
        if !node.ready {
            return true;
        }
        let selected: Vec<(&String, &NodeView)> =
            nodes.iter().filter(|(_, n)| self.selects(n)).collect();
        let Some(desired) = self.desired_available(selected.len()) else {
            // An invalid spec grants nothing; the judge lets it pass (the controller fails
            // closed, which invariant 5 sees).
            return true;
        };
        let available = selected
            .iter()
            .filter(|(name, n)| n.ready && (!n.disrupted() || name.as_str() == candidate))
            .count();
        available > desired
    }
}

/// 3. Each node we cordon (the start of its drain) was, at some instant since its deletion,
///    allowed by every NodeDisruptionBudget that covers it when it is cordoned — counted by
///    the judge from the nodes and each budget's spec, never from the budget's status.
pub fn budgets(recording: &[Seen]) -> Vec<Violation> {
    let mut nodes: BTreeMap<String, NodeView> = BTreeMap::new();
    let mut budgets: BTreeMap<String, BudgetView> = BTreeMap::new();
    // (node uid, budget) → allowed at some instant since the node's deletion.
    let mut allowed_once: HashMap<(String, String), bool> = HashMap::new();
    let mut violations = Vec::new();
    for seen in recording {
        let mut cordoned_now: Vec<String> = Vec::new();
        match (&seen.kind, &seen.change) {
            (Kind::Node, Change::Upsert(node)) => {
                let name = node["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                let view = NodeView::of(node);
                let was_cordoned = nodes
                    .get(&name)
                    .is_some_and(|before| before.uid == view.uid && before.cordoned_by_us);
                if view.cordoned_by_us && !was_cordoned && view.deleting {
                    cordoned_now.push(name.clone());
                }
                nodes.insert(name, view);
            }
            (Kind::Node, Change::Removed(name)) => {
                nodes.remove(name);
            }
            (Kind::Node, Change::Resync(names)) => nodes.retain(|name, _| names.contains(name)),
            (Kind::Budget, Change::Upsert(budget)) => {
                let name = budget["metadata"]["name"].as_str().unwrap_or_default();
                budgets.insert(name.to_owned(), BudgetView::of(budget));
            }
            (Kind::Budget, Change::Removed(name)) => {
                budgets.remove(name);
            }
            (Kind::Budget, Change::Resync(names)) => {
                budgets.retain(|name, _| names.contains(name));
            }
            (Kind::Keeper | Kind::Lease, _) => continue,
        }
        // Every deleting node not yet cordoned: is it allowed now by each budget covering it?
        for (name, node) in nodes
            .iter()
            .filter(|(_, n)| n.deleting && n.ours && !n.cordoned_by_us)
        {
            for (budget_name, budget) in budgets.iter().filter(|(_, b)| b.selects(node)) {
                if budget.allows(name, &nodes) {
                    allowed_once.insert((node.uid.clone(), budget_name.clone()), true);
                }
            }
        }
        for name in cordoned_now {
            let Some(node) = nodes.get(&name) else {
                continue;
            };
            for (budget_name, budget) in budgets.iter().filter(|(_, b)| b.selects(node)) {
                let ever = allowed_once
                    .get(&(node.uid.clone(), budget_name.clone()))
                    .copied()
                    .unwrap_or(false)
                    || budget.allows(&name, &nodes);
                if !ever {
                    let selected: Vec<String> = nodes
                        .iter()
                        .filter(|(_, n)| budget.selects(n))
                        .map(|(n, v)| {
                            let state = match (v.ready, v.disrupted()) {
                                (true, false) => "available",
                                (true, true) => "disrupted",
                                (false, _) => "not ready",
                            };
                            format!("{n} {state}")
                        })
                        .collect();
                    violations.push(Violation {
                        invariant: 3,
                        at: seen.received.to_string(),
                        what: format!(
                            "{name} was cordoned, but NodeDisruptionBudget {budget_name} never allowed it since its deletion (resourceVersion {}; selected: {}; spec minAvailable {:?} maxUnavailable {:?})",
                            seen.revision,
                            selected.join(", "),
                            budget.min_available,
                            budget.max_unavailable,
                        ),
                    });
                }
            }
        }
    }
    violations
}

/// Node views for the progress check.
#[derive(Debug)]
pub struct Settled<'a> {
    pub nodes: &'a [Value],
    pub pods: &'a [Value],
    pub attachments: &'a [Value],
    pub instances: &'a [Instance],
    pub pod_budgets: &'a [Value],
    pub node_budgets: &'a [Value],
}

/// 5. Once the schedule is over and its faults cleared: every Node being deleted with our
///    finalizer names what blocks it (a budget that allows nothing, a do-not-evict pod, a
///    PodDisruptionBudget that allows nothing) — anything else must have finished — and every
///    node out of service whose machine is off is clean.
pub fn progress(settled: &Settled<'_>, termination: bool, out_of_service: bool) -> Vec<String> {
    let mut stuck = Vec::new();
    for node in settled.nodes {
        let name = node["metadata"]["name"].as_str().unwrap_or_default();
        let view = NodeView::of(node);
        if termination && view.deleting && view.ours {
            match blocked_by(node, settled) {
                Ok(()) => {}
                Err(why) => stuck.push(format!("{name} is still being deleted: {why}")),
            }
        }
        if !out_of_service {
            continue;
        }
        let tainted = node["spec"]["taints"]
            .as_array()
            .is_some_and(|t| t.iter().any(|t| t["key"] == OUT_OF_SERVICE_TAINT));
        let provider_id = node["spec"]["providerID"].as_str().unwrap_or_default();
        let off = settled
            .instances
            .iter()
            .any(|i| i.provider_id == provider_id && i.state != "running");
        if !(tainted && off && !view.ready) {
            continue;
        }
        let left: Vec<String> = settled
            .pods
            .iter()
            .filter(|pod| {
                pod["spec"]["nodeName"] == name
                    && !tolerates_out_of_service(pod)
                    && !force_deleted(pod)
            })
            .map(|pod| {
                format!(
                    "pod {}",
                    pod["metadata"]["name"].as_str().unwrap_or_default()
                )
            })
            .chain(
                settled
                    .attachments
                    .iter()
                    .filter(|va| va["spec"]["nodeName"] == name)
                    .filter(|va| !serves_tolerating_pod(va, settled.pods, name))
                    .map(|va| {
                        format!(
                            "VolumeAttachment {}",
                            va["metadata"]["name"].as_str().unwrap_or_default()
                        )
                    }),
            )
            .collect();
        if !left.is_empty() {
            stuck.push(format!(
                "{name} is out of service with its machine off, but {} remain",
                left.join(", ")
            ));
        }
    }
    stuck
}

/// A pod deleted with no grace left: no kubelet runs it; only another's finalizer can keep it.
fn force_deleted(pod: &Value) -> bool {
    pod["metadata"]["deletionTimestamp"].is_string()
        && pod["metadata"]["deletionGracePeriodSeconds"] == 0
}

pub fn tolerates_out_of_service(pod: &Value) -> bool {
    pod["spec"]["tolerations"].as_array().is_some_and(|t| {
        t.iter().any(|t| {
            (t["key"] == OUT_OF_SERVICE_TAINT || (t["key"].is_null() && t["operator"] == "Exists"))
                && (t["effect"].is_null() || t["effect"] == "NoExecute")
        })
    })
}

/// An attachment on `node` of a claim that a tolerating pod there uses stays (as does the pod).
fn serves_tolerating_pod(attachment: &Value, pods: &[Value], node: &str) -> bool {
    let volume = attachment["spec"]["source"]["persistentVolumeName"]
        .as_str()
        .unwrap_or_default();
    !volume.is_empty()
        && pods.iter().any(|pod| {
            pod["spec"]["nodeName"] == node
                && tolerates_out_of_service(pod)
                && pod["metadata"]["name"]
                    .as_str()
                    .is_some_and(|name| name.starts_with("keeper-"))
        })
        && attachment["metadata"]["name"]
            .as_str()
            .is_some_and(|name| name.contains(volume))
}

/// `Ok` when the node's Terminating condition names a blocker the judge can see.
fn blocked_by(node: &Value, settled: &Settled<'_>) -> Result<(), String> {
    let name = node["metadata"]["name"].as_str().unwrap_or_default();
    let condition = node["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "Terminating"));
    let Some(condition) = condition else {
        return Err("no Terminating condition".to_owned());
    };
    let reason = condition["reason"].as_str().unwrap_or_default();
    let message = condition["message"].as_str().unwrap_or_default();
    let on_node: Vec<&Value> = settled
        .pods
        .iter()
        .filter(|pod| {
            pod["spec"]["nodeName"] == name && pod["metadata"]["deletionTimestamp"].is_null()
        })
        .collect();
    let seen = match reason {
        "AwaitingBudget" => settled.node_budgets.iter().any(|budget| {
            budget["metadata"]["name"]
                .as_str()
                .is_some_and(|budget| message.contains(budget))
        }),
        "BlockedByDoNotEvict" => on_node.iter().any(|pod| {
            pod["metadata"]["annotations"]["nodegrace.io/do-not-evict"].is_string()
                || pod["metadata"]["labels"]["nodegrace.io/do-not-evict"].is_string()
        }),
        "Draining" => settled.pod_budgets.iter().any(|budget| {
            budget["status"]["disruptionsAllowed"].as_i64() == Some(0)
                && budget["metadata"]["name"]
                    .as_str()
                    .is_some_and(|budget| message.contains(budget))
        }),
        _ => false,
    };
    if seen {
        Ok(())
    } else {
        Err(format!("Terminating reason {reason}: {message}"))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn deletion(resource: &str, name: &str, user: &str, revision: u64) -> Deletion {
        Deletion {
            resource: resource.to_owned(),
            namespace: String::new(),
            name: name.to_owned(),
            uid: format!("uid-{name}"),
            node: name.to_owned(),
            provider_id: (resource == "nodes").then(|| format!("sim:///{name}")),
            finalizers: vec![FINALIZER.to_owned()],
            grace_period_seconds: None,
            user: user.to_owned(),
            at: "2026-11-25T10:00:00.000Z".to_owned(),
            revision,
            kubelet: KubeletState::Running,
        }
    }

    fn instance(id: &str, calls: &[u64]) -> Instance {
        Instance {
            id: id.to_owned(),
            provider_id: format!("sim:///{id}"),
            node: id.to_owned(),
            state: "terminated".to_owned(),
            terminate_calls: u32::try_from(calls.len()).unwrap_or(u32::MAX),
            terminate_call_log: calls
                .iter()
                .map(|revision| kube_sim::world::Call {
                    at: "2026-11-25T10:00:01.000Z".to_owned(),
                    revision: *revision,
                })
                .collect(),
            power_call_log: Vec::new(),
        }
    }

    #[test]
    fn a_released_node_whose_machine_still_runs_is_a_leak() {
        let deleted = |name: &str| deletion("nodes", name, "kubectl", 5);
        let mut without_ours = deleted("node-5");
        without_ours.finalizers.clear();
        let deletions = [
            deleted("node-1"),
            deleted("node-2"),
            deleted("node-3"),
            deleted("node-4"),
            without_ours,
        ];
        let named_now = BTreeSet::from(["sim:///node-3".to_owned()]);
        let by_hand = BTreeSet::from(["sim:///node-4".to_owned()]);
        let states: BTreeMap<String, String> = [
            ("node-1", "terminated"),
            ("node-2", "running"),
            ("node-3", "running"),
            ("node-4", "stopped"),
            ("node-5", "running"),
        ]
        .into_iter()
        .map(|(node, state)| (format!("sim:///{node}"), state.to_owned()))
        .collect();
        let leaks = leaks(&deletions, &named_now, &by_hand, &states);
        assert_eq!(leaks.len(), 1, "{leaks:?}");
        assert_eq!(leaks[0].invariant, 8);
        assert!(leaks[0].what.contains("sim:///node-2"), "{}", leaks[0].what);
        assert!(leaks[0].what.contains("running"), "{}", leaks[0].what);
    }

    #[test]
    fn a_breach_on_a_stale_budget_status_or_by_the_drain_deadline_is_not_ours() {
        let breach = |by, status_healthy| Unavailability {
            namespace: "apps".to_owned(),
            pod: "web-1".to_owned(),
            budget: "web".to_owned(),
            at: "2026-11-25T10:00:00Z".to_owned(),
            by,
            healthy: 4,
            desired_healthy: 5,
            user: TERMINATION_CONTROLLER_USER.to_owned(),
            revision: 7,
            status_healthy,
        };
        let deadline: BTreeSet<(String, String)> = [("apps".to_owned(), "web-1".to_owned())].into();
        let none = BTreeSet::new();
        // The status still counted 6 healthy: the API server's decision, on a stale status.
        assert!(availability(&[breach(Disruption::Eviction, 6)], &none).is_empty());
        // Allowed although the status itself had no room: not the client's to excuse.
        assert_eq!(
            availability(&[breach(Disruption::Eviction, 5)], &none).len(),
            1
        );
        assert_eq!(
            availability(&[breach(Disruption::Delete, 6)], &none).len(),
            1
        );
        assert!(availability(&[breach(Disruption::Delete, 6)], &deadline).is_empty());
    }

    #[test]
    fn a_machine_is_terminated_once_and_only_after_its_node_was_deleted_with_our_finalizer() {
        let deleted = [deletion("nodes", "node-1", "admin", 10)];
        assert!(terminations(&[instance("node-1", &[12])], &deleted).is_empty());
        // Twice.
        assert_eq!(
            terminations(&[instance("node-1", &[12, 14])], &deleted).len(),
            1
        );
        // Before its node was deleted.
        assert_eq!(terminations(&[instance("node-1", &[9])], &deleted).len(), 1);
        // A namesake's machine: another providerID, never deleted.
        assert_eq!(
            terminations(&[instance("node-1-m1", &[12])], &deleted).len(),
            1
        );
        // Deleted without our finalizer: not ours to terminate.
        let mut bare = deletion("nodes", "node-1", "admin", 10);
        bare.finalizers.clear();
        assert_eq!(terminations(&[instance("node-1", &[12])], &[bare]).len(), 1);
    }

    #[test]
    fn the_same_object_deleted_over_and_over_is_a_busy_loop() {
        let pod = |user| deletion("pods", "held-9", user, 3);
        let legitimate = vec![pod(OUT_OF_SERVICE_GC_USER); DELETES_PER_OBJECT];
        assert!(repeated_deletes(&legitimate).is_empty());
        let mut busy = legitimate.clone();
        busy.push(pod(OUT_OF_SERVICE_GC_USER));
        let found = repeated_deletes(&busy);
        assert_eq!(found.len(), 1);
        assert!(found[0].what.contains("4 times"), "{}", found[0].what);
        // Others' deletes (an operator's, the kubelet's) are not the programs' loops.
        assert!(repeated_deletes(&vec![pod("admin"); 9]).is_empty());
    }

    #[test]
    fn a_pod_force_deleted_but_held_by_another_finalizer_counts_as_cleaned() {
        let node = json!({
            "metadata": {"name": "node-1"},
            "spec": {"providerID": "sim:///node-1", "taints": [{"key": OUT_OF_SERVICE_TAINT, "effect": "NoExecute"}]},
            "status": {"conditions": [{"type": "Ready", "status": "Unknown"}]},
        });
        let mut held = json!({
            "metadata": {"name": "held-9", "finalizers": ["explore.nodegrace.io/hold"],
                         "deletionTimestamp": "2026-11-25T10:00:00Z", "deletionGracePeriodSeconds": 0},
            "spec": {"nodeName": "node-1"},
        });
        let mut off = instance("node-1", &[]);
        off.state = "stopped".to_owned();
        let instances = [off];
        let settled = |pods: &[Value]| {
            progress(
                &Settled {
                    nodes: std::slice::from_ref(&node),
                    pods,
                    attachments: &[],
                    instances: &instances,
                    pod_budgets: &[],
                    node_budgets: &[],
                },
                false,
                true,
            )
        };
        assert!(settled(std::slice::from_ref(&held)).is_empty());
        // Still within its grace period: the cleanup has not forced it.
        held["metadata"]["deletionGracePeriodSeconds"] = json!(30);
        assert_eq!(settled(std::slice::from_ref(&held)).len(), 1);
    }

    #[test]
    fn out_of_service_gc_force_deletes_only_under_a_stopped_kubelet_and_never_a_tolerating_pod() {
        let mut force = deletion("pods", "web-1", OUT_OF_SERVICE_GC_USER, 5);
        force.grace_period_seconds = Some(0);
        force.kubelet = KubeletState::Stopped;
        let none = BTreeSet::new();
        assert!(out_of_service(std::slice::from_ref(&force), &none, &[]).is_empty());
        force.kubelet = KubeletState::Booting;
        assert!(out_of_service(std::slice::from_ref(&force), &none, &[]).is_empty());
        for kubelet in [KubeletState::Running, KubeletState::Partitioned] {
            force.kubelet = kubelet;
            assert_eq!(
                out_of_service(std::slice::from_ref(&force), &none, &[]).len(),
                1
            );
        }
        let mut keeper = force.clone();
        keeper.name = "keeper-0".to_owned();
        keeper.kubelet = KubeletState::Stopped;
        assert_eq!(out_of_service(&[keeper], &none, &[]).len(), 1);
        // Someone else's force delete is not judged here.
        force.user = "admin".to_owned();
        force.kubelet = KubeletState::Running;
        assert!(out_of_service(&[force], &none, &[]).is_empty());
    }

    #[test]
    fn a_delete_decided_while_the_machine_was_off_may_land_just_after_it_came_back() {
        let mut force = deletion("pods", "web-1", OUT_OF_SERVICE_GC_USER, 10);
        force.node = "node-4".to_owned();
        force.grace_period_seconds = Some(0);
        force.at = "2026-11-25T10:00:00.500Z".to_owned();
        let off = |revision, received: &str| Seen {
            revision,
            received: received.parse().unwrap_or(jiff::Timestamp::UNIX_EPOCH),
            kind: Kind::Node,
            change: Change::Upsert(
                json!({"metadata": {"name": "node-4", "annotations": {"sim.nodegrace.io/kubelet": "booting"}}}),
            ),
            relisted: false,
        };
        let none = BTreeSet::new();
        let just_back = [off(9, "2026-11-25T10:00:00.400Z")];
        assert!(out_of_service(std::slice::from_ref(&force), &none, &just_back).is_empty());
        let long_back = [off(9, "2026-11-25T09:59:50.000Z")];
        assert_eq!(
            out_of_service(std::slice::from_ref(&force), &none, &long_back).len(),
            1
        );
        assert_eq!(out_of_service(&[force], &none, &[]).len(), 1);
    }

    #[test]
    fn a_keeper_volume_attachment_may_go_only_once_no_keeper_pod_is_bound_there() {
        let mut attachment = deletion(
            "volumeattachments",
            "csi-pvc-1-node-1",
            OUT_OF_SERVICE_GC_USER,
            10,
        );
        attachment.node = "node-1".to_owned();
        attachment.kubelet = KubeletState::Stopped;
        let volumes: BTreeSet<String> = ["pvc-1".to_owned()].into();
        let keeper = |revision, node: &str| Seen {
            revision,
            received: jiff::Timestamp::UNIX_EPOCH,
            kind: Kind::Keeper,
            change: Change::Upsert(
                json!({"metadata": {"name": "keeper-0"}, "spec": {"nodeName": node}}),
            ),
            relisted: false,
        };
        let bound = [keeper(3, "node-1")];
        assert_eq!(
            out_of_service(std::slice::from_ref(&attachment), &volumes, &bound).len(),
            1
        );
        let moved = [keeper(3, "node-1"), keeper(8, "node-2")];
        assert!(out_of_service(std::slice::from_ref(&attachment), &volumes, &moved).is_empty());
        let later = [keeper(3, "node-2"), keeper(12, "node-1")];
        assert!(out_of_service(&[attachment], &volumes, &later).is_empty());
    }

    fn node(name: &str, revision: u64, labels: &Value, deleting: bool, cordoned: bool) -> Seen {
        let mut node = json!({
            "metadata": {"name": name, "uid": format!("uid-{name}"), "labels": labels, "finalizers": [FINALIZER], "resourceVersion": revision.to_string()},
            "spec": {},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        });
        if deleting {
            node["metadata"]["deletionTimestamp"] = json!("2026-11-25T10:00:00Z");
        }
        if cordoned {
            node["spec"]["taints"] = json!([{"key": DISRUPTED_TAINT, "effect": "NoSchedule"}]);
        }
        Seen {
            revision,
            received: jiff::Timestamp::UNIX_EPOCH,
            kind: Kind::Node,
            change: Change::Upsert(node),
            relisted: false,
        }
    }

    fn budget(revision: u64, labels: &Value) -> Seen {
        Seen {
            revision,
            received: jiff::Timestamp::UNIX_EPOCH,
            kind: Kind::Budget,
            change: Change::Upsert(json!({
                "metadata": {"name": "workers", "resourceVersion": revision.to_string()},
                "spec": {"selector": {"matchLabels": labels}, "maxUnavailable": 1},
            })),
            relisted: false,
        }
    }

    #[test]
    fn a_cordon_the_budget_never_allowed_is_found_and_one_it_allowed_is_not() {
        let pool = json!({"pool": "a"});
        let other = json!({"pool": "b"});
        let mut history = vec![
            node("node-0", 1, &pool, false, false),
            node("node-1", 2, &pool, false, false),
            node("node-2", 3, &other, false, false),
            budget(4, &pool),
            // node-2 drains under no budget of ours…
            node("node-2", 5, &other, true, true),
            node("node-0", 6, &pool, true, false),
        ];
        let mut allowed = history.clone();
        allowed.push(node("node-0", 7, &pool, true, true));
        assert!(budgets(&allowed).is_empty(), "{:?}", budgets(&allowed));
        // …then the budget is re-selected to cover it: node-0 must wait.
        history.push(node("node-2", 7, &pool, true, true));
        history.push(budget(8, &json!({"pool": "a"})));
        let mut spent: Vec<Seen> = history
            .into_iter()
            .filter(|seen| seen.revision != 6)
            .collect();
        spent.push(node("node-0", 9, &pool, true, false));
        spent.push(node("node-0", 10, &pool, true, true));
        let violations = budgets(&spent);
        assert_eq!(violations.len(), 1, "{violations:?}");
        assert!(
            violations[0].what.contains("node-0 was cordoned"),
            "{violations:?}"
        );
    }
}
