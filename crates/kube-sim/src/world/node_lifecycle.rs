//! The node lifecycle controller: a node whose kubelet stopped renewing its Lease turns
//! Ready=Unknown after the node-monitor grace period, and its pods' Ready conditions turn False
//! (upstream's `MarkPodsNotReady`); the not-ready/unreachable taints follow the Ready condition;
//! and NoExecute taints evict the pods that do not tolerate them, after their
//! tolerationSeconds counted from when the taint manager first saw the pod under the taints
//! (upstream's `pkg/controller/tainteviction`, which never reads a taint's `timeAdded`).

use std::collections::HashMap;
use std::time::Duration;

use jiff::Timestamp;
use serde_json::{Value, json};

use crate::conditions::tolerations_for;
use crate::store::timestamps::now_rfc3339;
use crate::store::{Change, DeleteOptions, Part, Store};
use crate::world::events::{self, Source};

const UNREACHABLE: &str = "node.kubernetes.io/unreachable";
const NOT_READY: &str = "node.kubernetes.io/not-ready";

pub fn concerns(change: &Change) -> bool {
    matches!(change.collection.as_str(), "/nodes" | "/pods")
}

fn timestamp(value: &Value) -> Option<Timestamp> {
    value.as_str()?.parse().ok()
}

fn ready_status(node: &Value) -> Option<String> {
    node["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Ready")
        .and_then(|c| c["status"].as_str())
        .map(str::to_owned)
}

/// The taint manager's scheduled evictions: pod UID → when it was first seen tolerating the
/// node's NoExecute taints for a limited time (upstream's `TimedWorker.CreatedAt`).
#[derive(Debug, Default)]
pub struct Memory {
    tolerating_since: HashMap<String, Timestamp>,
    /// Node → the Lease `renewTime` last seen and when this controller saw it change (upstream's
    /// `nodeHealthData.probeTimestamp`): silence is judged on this clock, so a kubelet whose
    /// clock is off still counts as alive while its renewTime keeps changing.
    probes: HashMap<String, (Option<String>, Timestamp)>,
}

/// Returns how soon a toleration runs out, when one is running.
pub fn reconcile(store: &Store, grace: Duration, memory: &mut Memory) -> Option<Duration> {
    let nodes = store.kind("", "nodes");
    let leases = store.kind("coordination.k8s.io", "leases");
    let now = Timestamp::now();
    let mut probes = HashMap::new();
    for node in store.all(&nodes) {
        let name = node["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let renewed = store
            .get(&leases, Some("kube-node-lease"), &name)
            .ok()
            .and_then(|lease| lease["spec"]["renewTime"].as_str().map(str::to_owned));
        let last_seen = match memory.probes.get(&name) {
            Some((seen, at)) if *seen == renewed => *at,
            // First sight of the node: upstream starts from its creation until a Lease shows.
            None if renewed.is_none() => {
                timestamp(&node["metadata"]["creationTimestamp"]).unwrap_or(now)
            }
            _ => now,
        };
        probes.insert(name.clone(), (renewed, last_seen));
        let silent = now.duration_since(last_seen).unsigned_abs() > grace;
        let before = ready_status(&node);
        if silent && before.as_deref() != Some("Unknown") {
            let flipped = store.update(&nodes, None, &name, Part::Status, |current| {
                let mut updated = current.clone();
                let conditions = updated["status"]["conditions"].as_array_mut();
                if let Some(conditions) = conditions {
                    for condition in conditions.iter_mut().filter(|c| c["type"] == "Ready") {
                        condition["status"] = json!("Unknown");
                        condition["reason"] = json!("NodeStatusUnknown");
                        condition["message"] = json!("Kubelet stopped posting node status.");
                        condition["lastTransitionTime"] = json!(now_rfc3339());
                    }
                }
                Ok(updated)
            });
            // Only the controller's own True → Unknown flip marks the pods, as upstream's
            // monitorNodeHealth does; a kubelet that posted False itself is left to its probes.
            if flipped.is_ok() && before.as_deref() == Some("True") {
                mark_pods_not_ready(store, &name);
            }
        }
        sync_taints(store, &name);
    }
    memory.probes = probes;
    evict_untolerating(store, memory)
}

/// Upstream's `MarkPodsNotReady`: each pod's Ready condition turns False (reason and message
/// kept, transition time now), with a `NodeNotReady` Warning on the pod.
fn mark_pods_not_ready(store: &Store, node: &str) {
    let pods = store.kind("", "pods");
    let on_node = store.pods_on_node(node);
    for pod in on_node {
        let (namespace, name) = (
            pod["metadata"]["namespace"].as_str(),
            pod["metadata"]["name"].as_str().unwrap_or_default(),
        );
        let mut flipped = false;
        let marked = store.update(&pods, namespace, name, Part::Status, |current| {
            let mut updated = current.clone();
            let ready = updated["status"]["conditions"]
                .as_array_mut()
                .and_then(|conditions| conditions.iter_mut().find(|c| c["type"] == "Ready"));
            if let Some(ready) = ready
                && ready["status"] != "False"
            {
                ready["status"] = json!("False");
                ready["lastTransitionTime"] = json!(now_rfc3339());
                flipped = true;
            }
            Ok(updated)
        });
        if let Ok(marked) = marked
            && flipped
        {
            events::warn(
                store,
                Source {
                    component: "node-controller",
                    host: None,
                },
                &marked,
                "NodeNotReady",
                "Node is not ready",
            );
        }
    }
}

/// The not-ready/unreachable taints (NoSchedule and NoExecute) mirror the Ready condition.
fn sync_taints(store: &Store, name: &str) {
    let nodes = store.kind("", "nodes");
    let _ = store.update(&nodes, None, name, Part::Main, |current| {
        let wanted = match ready_status(current).as_deref() {
            Some("True") | None => None,
            Some("False") => Some(NOT_READY),
            Some(_) => Some(UNREACHABLE),
        };
        let mut updated = current.clone();
        let mut taints: Vec<Value> = current["spec"]["taints"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let before = taints.len();
        taints.retain(|t| {
            let key = t["key"].as_str().unwrap_or_default();
            !((key == UNREACHABLE || key == NOT_READY) && Some(key) != wanted)
        });
        let mut changed = taints.len() != before;
        if let Some(key) = wanted {
            for effect in ["NoSchedule", "NoExecute"] {
                if !taints
                    .iter()
                    .any(|t| t["key"] == key && t["effect"] == effect)
                {
                    let mut taint = json!({"key": key, "effect": effect});
                    if effect == "NoExecute" {
                        taint["timeAdded"] = json!(now_rfc3339());
                    }
                    taints.push(taint);
                    changed = true;
                }
            }
        }
        if changed {
            // The store leaves an emptied list out, as Go's omitempty does.
            updated["spec"]["taints"] = json!(taints);
        }
        Ok(updated)
    });
}

/// How long a pod may stay on a node with these NoExecute taints (upstream's
/// `GetMatchingTolerations` + `getMinTolerationTime`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stay {
    No,
    Forever,
    Seconds(i64),
}

fn stay(pod: &Value, taints: &[Value]) -> Stay {
    let mut shortest: Option<i64> = None;
    for taint in taints {
        let mut matching = tolerations_for(&pod["spec"], taint).peekable();
        if matching.peek().is_none() {
            return Stay::No;
        }
        for seconds in matching.filter_map(|t| t["tolerationSeconds"].as_i64()) {
            shortest = Some(shortest.map_or(seconds, |s| s.min(seconds)));
        }
    }
    shortest.map_or(Stay::Forever, |seconds| Stay::Seconds(seconds.max(0)))
}

fn evict_untolerating(store: &Store, memory: &mut Memory) -> Option<Duration> {
    let nodes = store.kind("", "nodes");
    let pods = store.kind("", "pods");
    let now = Timestamp::now();
    let mut still_timed = HashMap::new();
    let mut next: Option<Duration> = None;
    for node in store.all(&nodes) {
        let taints: Vec<Value> = node["spec"]["taints"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|t| t["effect"] == "NoExecute")
            .cloned()
            .collect();
        if taints.is_empty() {
            continue;
        }
        let name = node["metadata"]["name"].as_str().unwrap_or_default();
        let on_node = store.pods_on_node(name);
        let running = on_node
            .into_iter()
            .filter(|pod| !pod["metadata"]["deletionTimestamp"].is_string());
        for pod in running {
            let uid = pod["metadata"]["uid"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            let due = match stay(&pod, &taints) {
                Stay::No => true,
                Stay::Forever => false,
                Stay::Seconds(seconds) => {
                    let since = memory.tolerating_since.get(&uid).copied().unwrap_or(now);
                    still_timed.insert(uid, since);
                    let left = Duration::from_secs(seconds.unsigned_abs())
                        .saturating_sub(now.duration_since(since).unsigned_abs());
                    if !left.is_zero() {
                        next = Some(next.map_or(left, |next| next.min(left)));
                    }
                    left.is_zero()
                }
            };
            if due {
                let (namespace, pod_name) = (
                    pod["metadata"]["namespace"].as_str(),
                    pod["metadata"]["name"].as_str().unwrap_or_default(),
                );
                let _ = store.update(&pods, namespace, pod_name, Part::Status, |current| {
                    let patch = json!({"status": {"conditions": [{"type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager", "message": "Taint manager: deleting due to NoExecute taint", "lastTransitionTime": now_rfc3339()}]}});
                    crate::patch::apply(current, crate::patch::PatchType::StrategicMerge, &patch, false)
                });
                let _ = store.delete(&pods, namespace, pod_name, &DeleteOptions::default());
            }
        }
    }
    // A pod gone, tolerating for good, or on a node without NoExecute taints any more has its
    // scheduled eviction cancelled: a later taint counts afresh.
    memory.tolerating_since = still_timed;
    next
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shortest_toleration_of_all_taints_decides() {
        let unreachable = json!({"key": UNREACHABLE, "effect": "NoExecute"});
        let out = json!({"key": "node.kubernetes.io/out-of-service", "effect": "NoExecute"});
        let pod = |tolerations: Value| json!({"spec": {"tolerations": tolerations}});
        let both = [unreachable.clone(), out.clone()];
        let cases = [
            (json!([]), Stay::No),
            (json!([{"operator": "Exists"}]), Stay::Forever),
            (
                json!([{"key": UNREACHABLE, "operator": "Exists", "tolerationSeconds": 30}]),
                Stay::No,
            ),
            (
                json!([
                    {"key": UNREACHABLE, "operator": "Exists", "tolerationSeconds": 30},
                    {"key": "node.kubernetes.io/out-of-service", "operator": "Exists"},
                ]),
                Stay::Seconds(30),
            ),
            (
                json!([{"operator": "Exists", "tolerationSeconds": 60}, {"operator": "Exists", "tolerationSeconds": 5}]),
                Stay::Seconds(5),
            ),
            (
                json!([{"operator": "Exists", "tolerationSeconds": -3}]),
                Stay::Seconds(0),
            ),
        ];
        for (tolerations, expected) in cases {
            assert_eq!(
                stay(&pod(tolerations.clone()), &both),
                expected,
                "{tolerations}"
            );
        }
    }
}
