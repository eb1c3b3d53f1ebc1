//! The node lifecycle controller: a node whose kubelet stopped renewing its Lease turns
//! Ready=Unknown after the node-monitor grace period; the not-ready/unreachable taints follow
//! the Ready condition; and NoExecute taints evict the pods that do not tolerate them (after
//! their tolerationSeconds), as the taint manager does.

use std::time::Duration;

use jiff::Timestamp;
use serde_json::{Value, json};

use crate::conditions::tolerations_for;
use crate::store::strategy::now_rfc3339;
use crate::store::{Change, DeleteOptions, Part, Store};

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

pub fn reconcile(store: &Store, grace: Duration) {
    let nodes = store.kind("", "nodes");
    let leases = store.kind("coordination.k8s.io", "leases");
    let now = Timestamp::now();
    for node in store.all(&nodes) {
        let name = node["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let renewed = store
            .get(&leases, Some("kube-node-lease"), &name)
            .ok()
            .and_then(|lease| timestamp(&lease["spec"]["renewTime"]));
        let created = timestamp(&node["metadata"]["creationTimestamp"]).unwrap_or(now);
        let last_seen = renewed.unwrap_or(created);
        let silent = now.duration_since(last_seen).unsigned_abs() > grace;
        if silent && ready_status(&node).as_deref() != Some("Unknown") {
            let _ = store.update(&nodes, None, &name, Part::Status, |current| {
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
        }
        sync_taints(store, &name);
    }
    evict_untolerating(store);
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
            updated["spec"]["taints"] = if taints.is_empty() {
                Value::Null
            } else {
                json!(taints)
            };
            if taints.is_empty() {
                updated["spec"]
                    .as_object_mut()
                    .map(|spec| spec.remove("taints"));
            }
        }
        Ok(updated)
    });
}

/// How long a pod may stay on a node with a NoExecute taint.
enum Stay {
    No,
    Forever,
    Seconds(i64),
}

fn toleration(pod: &Value, taint: &Value) -> Stay {
    let matching: Vec<&Value> = tolerations_for(&pod["spec"], taint).collect();
    if matching.is_empty() {
        return Stay::No;
    }
    matching
        .iter()
        .filter_map(|t| t["tolerationSeconds"].as_i64())
        .min()
        .map_or(Stay::Forever, Stay::Seconds)
}

fn evict_untolerating(store: &Store) {
    let nodes = store.kind("", "nodes");
    let pods = store.kind("", "pods");
    let now = Timestamp::now();
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
        let on_node = store
            .list(&pods, None, None, 0, &|pod| {
                pod["spec"]["nodeName"] == name && !pod["metadata"]["deletionTimestamp"].is_string()
            })
            .items;
        for pod in on_node {
            let due = taints.iter().any(|taint| match toleration(&pod, taint) {
                Stay::No => true,
                Stay::Forever => false,
                Stay::Seconds(seconds) => {
                    let added = timestamp(&taint["timeAdded"]).unwrap_or(now);
                    now.duration_since(added).as_secs() >= seconds
                }
            });
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
}
