//! The scheduler and the workload controllers (Deployment, StatefulSet, ReplicaSet, DaemonSet),
//! reduced to what node-lifecycle tests need: replacement pods land on another schedulable
//! node, every eligible node runs its DaemonSet pods, and statuses say what kubectl reads.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::{Value, json};

use super::node_affinity;
use crate::conditions::{is_ready, tolerations_for};
use crate::store::timestamps::now_rfc3339;
use crate::store::{Change, DeleteOptions, Part, Store};

fn text(value: &Value) -> &str {
    value.as_str().unwrap_or_default()
}

pub fn concerns(change: &Change) -> bool {
    matches!(
        change.collection.as_str(),
        "/pods"
            | "/nodes"
            | "apps/replicasets"
            | "apps/daemonsets"
            | "apps/deployments"
            | "apps/statefulsets"
    )
}

/// Whether a pod with `spec` may be placed on `node` by the scheduler.
pub fn fits(spec: &Value, node: &Value) -> bool {
    if node["spec"]["unschedulable"] == true
        || !is_ready(node)
        || node["metadata"]["deletionTimestamp"].is_string()
    {
        return false;
    }
    let taints_ok = node["spec"]["taints"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|taint| matches!(text(&taint["effect"]), "NoSchedule" | "NoExecute"))
        .all(|taint| tolerations_for(spec, taint).next().is_some());
    let selector_ok = spec["nodeSelector"].as_object().is_none_or(|wanted| {
        wanted
            .iter()
            .all(|(key, value)| node["metadata"]["labels"][key] == *value)
    });
    taints_ok && selector_ok && node_affinity::required_by(spec, node)
}

fn controller_uid(pod: &Value) -> Option<&str> {
    pod["metadata"]["ownerReferences"]
        .as_array()?
        .iter()
        .find(|o| o["controller"] == true)
        .and_then(|o| o["uid"].as_str())
}

fn live(pod: &Value) -> bool {
    !pod["metadata"]["deletionTimestamp"].is_string()
        && !matches!(text(&pod["status"]["phase"]), "Succeeded" | "Failed")
}

fn owned_pod(owner: &Value, kind: &str, node: Option<&str>) -> Value {
    let template = &owner["spec"]["template"];
    let owner_name = text(&owner["metadata"]["name"]);
    let mut pod = json!({
        "metadata": {
            "generateName": format!("{owner_name}-"),
            "labels": template["metadata"]["labels"].clone(),
            "annotations": template["metadata"]["annotations"].clone(),
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": kind, "name": owner_name, "uid": owner["metadata"]["uid"], "controller": true, "blockOwnerDeletion": true}],
        },
        "spec": template["spec"].clone(),
    });
    if pod["metadata"]["annotations"].is_null() {
        pod["metadata"]
            .as_object_mut()
            .map(|m| m.remove("annotations"));
    }
    if let Some(node) = node {
        pod["spec"]["nodeName"] = json!(node);
    }
    if kind == "DaemonSet" {
        add_daemon_tolerations(&mut pod["spec"]);
    }
    pod
}

/// pkg/controller/daemon/util.AddOrUpdateDaemonPodTolerations: a daemon pod stays on its node
/// through NotReady and unreachable, and is placed despite pressure and cordoning.
fn add_daemon_tolerations(spec: &mut Value) {
    let mut wanted = vec![
        ("node.kubernetes.io/not-ready", "NoExecute"),
        ("node.kubernetes.io/unreachable", "NoExecute"),
        ("node.kubernetes.io/disk-pressure", "NoSchedule"),
        ("node.kubernetes.io/memory-pressure", "NoSchedule"),
        ("node.kubernetes.io/pid-pressure", "NoSchedule"),
        ("node.kubernetes.io/unschedulable", "NoSchedule"),
    ];
    if spec["hostNetwork"] == true {
        wanted.push(("node.kubernetes.io/network-unavailable", "NoSchedule"));
    }
    if !spec["tolerations"].is_array() {
        spec["tolerations"] = json!([]);
    }
    let Some(tolerations) = spec["tolerations"].as_array_mut() else {
        return;
    };
    for (key, effect) in wanted {
        let toleration = json!({"key": key, "operator": "Exists", "effect": effect});
        if !tolerations.contains(&toleration) {
            tolerations.push(toleration);
        }
    }
}

pub fn reconcile(store: &Store) {
    super::deployments::reconcile(store);
    super::statefulsets::reconcile(store);
    let pods_kind = store.kind("", "pods");
    let pods = store.all(&pods_kind);
    let nodes = store.all(&store.kind("", "nodes"));
    let mut by_owner: HashMap<String, Vec<Arc<Value>>> = HashMap::new();
    for pod in &pods {
        if let Some(uid) = controller_uid(pod) {
            by_owner
                .entry(uid.to_owned())
                .or_default()
                .push(Arc::clone(pod));
        }
    }
    replicasets(store, &by_owner);
    daemonsets(store, &by_owner, &nodes);
    schedule(store, &pods, &nodes);
}

fn replicasets(store: &Store, by_owner: &HashMap<String, Vec<Arc<Value>>>) {
    let pods_kind = store.kind("", "pods");
    let kind = store.kind("apps", "replicasets");
    for replicaset in store.all(&kind) {
        let uid = text(&replicaset["metadata"]["uid"]);
        let namespace = text(&replicaset["metadata"]["namespace"]);
        let desired =
            usize::try_from(replicaset["spec"]["replicas"].as_i64().unwrap_or(1)).unwrap_or(0);
        let owned: Vec<&Arc<Value>> = by_owner
            .get(uid)
            .map(|pods| pods.iter().filter(|p| live(p)).collect())
            .unwrap_or_default();
        // A ReplicaSet being deleted (its pods first, in the foreground) replaces none.
        let missing = if replicaset["metadata"]["deletionTimestamp"].is_string() {
            0
        } else {
            desired.saturating_sub(owned.len())
        };
        for _ in 0..missing {
            let _ = store.create(
                &pods_kind,
                Some(namespace),
                owned_pod(&replicaset, "ReplicaSet", None),
            );
        }
        for extra in owned.iter().skip(desired) {
            let _ = store.delete(
                &pods_kind,
                Some(namespace),
                text(&extra["metadata"]["name"]),
                &DeleteOptions::default(),
            );
        }
        let ready = owned
            .iter()
            .filter(|p| {
                p["status"]["conditions"].as_array().is_some_and(|c| {
                    c.iter()
                        .any(|c| c["type"] == "Ready" && c["status"] == "True")
                })
            })
            .count();
        let _ = store.update(&kind, Some(namespace), text(&replicaset["metadata"]["name"]), Part::Status, |current| {
            let mut updated = current.clone();
            updated["status"] = json!({"replicas": owned.len(), "readyReplicas": ready, "availableReplicas": ready, "observedGeneration": current["metadata"]["generation"]});
            Ok(updated)
        });
    }
}

fn daemonsets(store: &Store, by_owner: &HashMap<String, Vec<Arc<Value>>>, nodes: &[Arc<Value>]) {
    let pods_kind = store.kind("", "pods");
    let kind = store.kind("apps", "daemonsets");
    for daemonset in store.all(&kind) {
        if daemonset["metadata"]["deletionTimestamp"].is_string() {
            continue;
        }
        let uid = text(&daemonset["metadata"]["uid"]);
        let namespace = text(&daemonset["metadata"]["namespace"]);
        let spec = &daemonset["spec"]["template"]["spec"];
        let owned = by_owner.get(uid).cloned().unwrap_or_default();
        // DaemonSet pods tolerate unschedulable nodes, as the real controller adds that toleration.
        let eligible: Vec<&Arc<Value>> = nodes
            .iter()
            .filter(|node| {
                let mut unschedulable_ok: Value = Value::clone(node);
                unschedulable_ok["spec"]["unschedulable"] = json!(false);
                fits(spec, &unschedulable_ok)
            })
            .collect();
        for node in &eligible {
            let name = text(&node["metadata"]["name"]);
            if !owned
                .iter()
                .any(|pod| live(pod) && pod["spec"]["nodeName"] == name)
            {
                let _ = store.create(
                    &pods_kind,
                    Some(namespace),
                    owned_pod(&daemonset, "DaemonSet", Some(name)),
                );
            }
        }
        // Counted by node, as upstream's `updateDaemonSetStatus` walks the node lister: a pod
        // still bound to a deleted Node is on no node and counts nowhere until the pod GC
        // takes it.
        let (mut desired, mut scheduled, mut misscheduled, mut ready) = (0_usize, 0, 0, 0);
        for node in nodes {
            let name = text(&node["metadata"]["name"]);
            let mut on_node: Vec<&Arc<Value>> = owned
                .iter()
                .filter(|pod| live(pod) && pod["spec"]["nodeName"] == name)
                .collect();
            let should_run = eligible
                .iter()
                .any(|eligible| eligible["metadata"]["name"] == name);
            match (should_run, on_node.is_empty()) {
                (true, true) => desired += 1,
                (true, false) => {
                    desired += 1;
                    scheduled += 1;
                    // The oldest pod speaks for the node.
                    on_node
                        .sort_by_key(|pod| text(&pod["metadata"]["creationTimestamp"]).to_owned());
                    ready += usize::from(is_ready(on_node[0]));
                }
                (false, false) => misscheduled += 1,
                (false, true) => {}
            }
        }
        // What `kubectl rollout status daemonset` compares (every pod is of the current
        // template: updates replace nothing here).
        let _ = store.update(
            &kind,
            Some(namespace),
            text(&daemonset["metadata"]["name"]),
            Part::Status,
            |current| {
                let mut updated = current.clone();
                updated["status"] = json!({
                    "desiredNumberScheduled": desired,
                    "currentNumberScheduled": scheduled,
                    "updatedNumberScheduled": scheduled,
                    "numberMisscheduled": misscheduled,
                    "numberReady": ready,
                    "numberAvailable": ready,
                    "numberUnavailable": desired.saturating_sub(ready),
                    "observedGeneration": current["metadata"]["generation"],
                });
                Ok(updated)
            },
        );
    }
}

fn schedule(store: &Store, pods: &[Arc<Value>], nodes: &[Arc<Value>]) {
    let pods_kind = store.kind("", "pods");
    let mut load: HashMap<&str, usize> = HashMap::new();
    for pod in pods {
        if let Some(node) = pod["spec"]["nodeName"].as_str() {
            *load.entry(node).or_default() += 1;
        }
    }
    for pod in pods
        .iter()
        .filter(|p| p["spec"]["nodeName"].as_str().is_none_or(str::is_empty) && live(p))
    {
        let spec = &pod["spec"];
        let chosen = nodes
            .iter()
            .filter(|node| fits(spec, node))
            // Node affinity preferences before load: the default scheduler profile weighs the
            // NodeAffinity score twice the resource scores.
            .min_by_key(|node| {
                let load = load
                    .get(text(&node["metadata"]["name"]))
                    .copied()
                    .unwrap_or(0);
                (
                    std::cmp::Reverse(node_affinity::preference(spec, node)),
                    load,
                )
            });
        let (namespace, name) = (
            text(&pod["metadata"]["namespace"]),
            text(&pod["metadata"]["name"]),
        );
        let Some(node) = chosen else {
            // Written only when the condition changes, as the scheduler's failure handler does:
            // attempt after attempt on a pod that still fits nowhere writes nothing.
            let _ = store.update(&pods_kind, Some(namespace), name, Part::Status, |current| {
                let mut updated = current.clone();
                let unschedulable = json!({"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0 nodes are available for the pod"});
                crate::conditions::set_condition(&mut updated, unschedulable, &now_rfc3339());
                Ok(updated)
            });
            continue;
        };
        let node_name = text(&node["metadata"]["name"]).to_owned();
        // Binding: the real scheduler posts pods/binding; setting nodeName is its effect.
        let bound = store.update(&pods_kind, Some(namespace), name, Part::Main, |current| {
            let mut updated = current.clone();
            updated["spec"]["nodeName"] = json!(node_name);
            Ok(updated)
        });
        if let Ok(bound) = bound {
            *load.entry(text(&node["metadata"]["name"])).or_default() += 1;
            let source = super::events::Source {
                component: "default-scheduler",
                host: None,
            };
            super::events::record(
                store,
                source,
                &bound,
                None,
                "Scheduled",
                &format!("Successfully assigned {namespace}/{name} to {node_name}"),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scheduling_respects_unschedulable_taints_and_selectors() {
        let ready = json!([{"type": "Ready", "status": "True"}]);
        let node = json!({"metadata": {"name": "n", "labels": {"zone": "a"}}, "spec": {}, "status": {"conditions": ready}});
        let tainted = json!({"metadata": {"name": "n"}, "spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]}, "status": {"conditions": ready}});
        let cordoned = json!({"metadata": {"name": "n"}, "spec": {"unschedulable": true}, "status": {"conditions": ready}});
        let plain = json!({});
        assert!(fits(&plain, &node));
        assert!(!fits(&plain, &tainted));
        assert!(fits(
            &json!({"tolerations": [{"key": "k", "operator": "Exists"}]}),
            &tainted
        ));
        assert!(!fits(&plain, &cordoned));
        assert!(fits(&json!({"nodeSelector": {"zone": "a"}}), &node));
        assert!(!fits(&json!({"nodeSelector": {"zone": "b"}}), &node));
    }
}
