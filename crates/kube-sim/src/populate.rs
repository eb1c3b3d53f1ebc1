//! `--nodes N --pods-per-node M`: a ready-made cluster of Ready nodes, each with Running pods
//! owned by a ReplicaSet of its own.

use serde_json::{Value, json};

use crate::error::ApiError;
use crate::store::timestamps::now_rfc3339;
use crate::store::{Part, Store};

/// A Ready node as a kubelet would register it.
pub fn node(name: &str) -> Value {
    let now = now_rfc3339();
    json!({
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"}},
        "spec": {"providerID": format!("sim:///{name}")},
        "status": {
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status", "lastHeartbeatTime": now, "lastTransitionTime": now}],
            "nodeInfo": {"kubeletVersion": "v1.33.0-sim", "architecture": "amd64", "operatingSystem": "linux"},
            "capacity": {"cpu": "8", "memory": "32Gi", "pods": "110"},
            "allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110"},
        },
    })
}

pub fn populate(store: &Store, nodes: usize, pods_per_node: usize) -> Result<(), ApiError> {
    let node_kind = store.kind("", "nodes");
    let pod_kind = store.kind("", "pods");
    let replicaset_kind = store.kind("apps", "replicasets");
    for index in 0..nodes {
        let name = format!("node-{index}");
        store.create(&node_kind, None, node(&name))?;
        if pods_per_node == 0 {
            continue;
        }
        let app = format!("app-{index}");
        let replicaset = store.create(&replicaset_kind, Some("default"), json!({
            "metadata": {"name": app, "labels": {"app": app}},
            "spec": {"replicas": pods_per_node, "selector": {"matchLabels": {"app": app}}, "template": {
                "metadata": {"labels": {"app": app}},
                "spec": {"containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10"}]},
            }},
        }))?;
        let uid = replicaset["metadata"]["uid"].clone();
        let now = now_rfc3339();
        for pod in 0..pods_per_node {
            store.create(&pod_kind, Some("default"), json!({
                "metadata": {
                    "name": format!("{app}-{pod}"),
                    "labels": {"app": app},
                    "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": app, "uid": uid, "controller": true, "blockOwnerDeletion": true}],
                },
                "spec": {"nodeName": name, "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10"}]},
            }))?;
            // Created Pending, as any pod; its kubelet reports it running.
            store.update(&pod_kind, Some("default"), &format!("{app}-{pod}"), Part::Status, |created| {
                let mut running = created.clone();
                running["status"] = json!({
                    "phase": "Running",
                    "qosClass": "BestEffort",
                    "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now}],
                    "containerStatuses": [{"name": "app", "ready": true, "restartCount": 0, "image": "registry.k8s.io/pause:3.10", "imageID": "", "started": true, "state": {"running": {"startedAt": now}}}],
                });
                Ok(running)
            })?;
        }
        // The fixtures start the cluster's history, as a restored backup would: keeping their
        // creations and first status writes (each change holds the object before and after)
        // would only hold a second copy of every pod for watches nobody can have started.
        store.compact();
    }
    Ok(())
}
