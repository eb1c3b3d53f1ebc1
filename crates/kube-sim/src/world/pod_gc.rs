//! kube-controller-manager's pod garbage collector, the part KEP-2268 added (`gcTerminating` in
//! pkg/controller/podgc/gc_controller.go): on a sweep every period (20 s upstream), every pod
//! that is being deleted on a node that is not Ready and carries a taint with the key
//! `node.kubernetes.io/out-of-service` is marked Failed (unless terminal) and deleted with grace
//! 0. Tolerations are not looked at, and the sweep does not wait for changes: it reads its
//! caches when the timer fires.

use std::time::Duration;

use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::conditions::is_ready;
use crate::store::{DeleteOptions, Part, Store};

const OUT_OF_SERVICE: &str = "node.kubernetes.io/out-of-service";

pub async fn run(store: Store, period: Duration, stop: CancellationToken) {
    let mut sweep = tokio::time::interval(period);
    sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // `interval` fires at once; the controller's first sweep comes one period after start.
    sweep.tick().await;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = sweep.tick() => gc_terminating(&store),
        }
    }
}

fn out_of_service(node: &serde_json::Value) -> bool {
    !is_ready(node)
        && node["spec"]["taints"]
            .as_array()
            .is_some_and(|taints| taints.iter().any(|t| t["key"] == OUT_OF_SERVICE))
}

fn gc_terminating(store: &Store) {
    let nodes = store.kind("", "nodes");
    let pods = store.kind("", "pods");
    let terminating = store
        .list(&pods, None, None, 0, &|pod| {
            pod["metadata"]["deletionTimestamp"].is_string()
        })
        .items;
    for pod in terminating {
        let Some(node) = pod["spec"]["nodeName"].as_str().filter(|n| !n.is_empty()) else {
            continue;
        };
        if !store
            .get(&nodes, None, node)
            .is_ok_and(|node| out_of_service(&node))
        {
            continue;
        }
        let namespace = pod["metadata"]["namespace"].as_str();
        let name = pod["metadata"]["name"].as_str().unwrap_or_default();
        let uid = pod["metadata"]["uid"].clone();
        let _ = store.update(&pods, namespace, name, Part::Status, |current| {
            let mut updated = current.clone();
            let terminal = matches!(
                current["status"]["phase"].as_str(),
                Some("Succeeded" | "Failed")
            );
            if current["metadata"]["uid"] == uid && !terminal {
                updated["status"]["phase"] = json!("Failed");
            }
            Ok(updated)
        });
        // Upstream deletes by name with grace 0, without a UID precondition.
        let _ = store.delete(&pods, namespace, name, &DeleteOptions::immediate());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_not_ready_nodes_with_the_taint_key_qualify() {
        let node = |ready: &str, taints: serde_json::Value| json!({"spec": {"taints": taints}, "status": {"conditions": [{"type": "Ready", "status": ready}]}});
        let tainted = json!([{"key": OUT_OF_SERVICE, "value": "x", "effect": "NoSchedule"}]);
        assert!(out_of_service(&node("False", tainted.clone())));
        assert!(out_of_service(&node("Unknown", tainted.clone())));
        assert!(!out_of_service(&node("True", tainted)));
        assert!(!out_of_service(&node(
            "False",
            json!([{"key": "other", "effect": "NoExecute"}])
        )));
    }
}
