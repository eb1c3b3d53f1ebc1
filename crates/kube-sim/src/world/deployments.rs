//! The Deployment controller, reduced: each Deployment owns a ReplicaSet per pod template
//! (named by the template's hash, as pkg/controller/deployment/sync.go names them); the current
//! one is scaled to the Deployment's replicas and older ones to zero at once (no rolling
//! surge), and the status carries what `kubectl rollout status` reads.

use std::sync::Arc;

use serde_json::{Value, json};

use crate::store::timestamps::now_rfc3339;
use crate::store::{Part, Store};

fn text(value: &Value) -> &str {
    value.as_str().unwrap_or_default()
}

/// rand.SafeEncodeString of the template's 32-bit FNV-1a hash, as `pod-template-hash` looks.
pub fn template_hash(template: &Value) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut hash: u32 = 0x811c_9dc5;
    for byte in serde_json::to_vec(template).unwrap_or_default() {
        hash ^= u32::from(byte);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    hash.to_string()
        .bytes()
        .map(|digit| ALPHABET[usize::from(digit) % ALPHABET.len()] as char)
        .collect()
}

pub fn controlled_by<'a>(objects: &'a [Arc<Value>], owner: &Value) -> Vec<&'a Arc<Value>> {
    objects
        .iter()
        .filter(|object| {
            object["metadata"]["ownerReferences"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|o| o["controller"] == true && o["uid"] == owner["metadata"]["uid"])
        })
        .collect()
}

fn replica_set_for(deployment: &Value, hash: &str) -> Value {
    let name = text(&deployment["metadata"]["name"]);
    let mut template = deployment["spec"]["template"].clone();
    template["metadata"]["labels"]["pod-template-hash"] = json!(hash);
    let mut selector = deployment["spec"]["selector"].clone();
    selector["matchLabels"]["pod-template-hash"] = json!(hash);
    json!({
        "metadata": {
            "name": format!("{name}-{hash}"),
            "labels": template["metadata"]["labels"],
            "annotations": {"deployment.kubernetes.io/revision": "1"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": name, "uid": deployment["metadata"]["uid"], "controller": true, "blockOwnerDeletion": true}],
        },
        "spec": {"replicas": deployment["spec"]["replicas"], "selector": selector, "template": template},
    })
}

fn count(replica_sets: &[&Arc<Value>], field: &str) -> i64 {
    replica_sets
        .iter()
        .map(|rs| rs["status"][field].as_i64().unwrap_or(0))
        .sum()
}

pub fn reconcile(store: &Store) {
    let kind = store.kind("apps", "deployments");
    let rs_kind = store.kind("apps", "replicasets");
    let all_replica_sets = store.all(&rs_kind);
    for deployment in store.all(&kind) {
        if deployment["metadata"]["deletionTimestamp"].is_string() {
            continue;
        }
        let namespace = text(&deployment["metadata"]["namespace"]);
        let name = text(&deployment["metadata"]["name"]);
        let desired = deployment["spec"]["replicas"].as_i64().unwrap_or(1);
        let hash = template_hash(&deployment["spec"]["template"]);
        let owned = controlled_by(&all_replica_sets, &deployment);
        let current_name = format!("{name}-{hash}");
        if !owned
            .iter()
            .any(|rs| rs["metadata"]["name"] == current_name.as_str())
        {
            let _ = store.create(
                &rs_kind,
                Some(namespace),
                replica_set_for(&deployment, &hash),
            );
        }
        for replica_set in &owned {
            let rs_name = text(&replica_set["metadata"]["name"]);
            let wanted = if rs_name == current_name { desired } else { 0 };
            if replica_set["spec"]["replicas"].as_i64() != Some(wanted) {
                let _ = store.update(&rs_kind, Some(namespace), rs_name, Part::Main, |current| {
                    let mut scaled = current.clone();
                    scaled["spec"]["replicas"] = json!(wanted);
                    Ok(scaled)
                });
            }
        }
        let current: Vec<&Arc<Value>> = owned
            .iter()
            .copied()
            .filter(|rs| rs["metadata"]["name"] == current_name.as_str())
            .collect();
        let replicas = count(&owned, "replicas");
        let updated = count(&current, "replicas");
        let ready = count(&owned, "readyReplicas");
        let available = count(&owned, "availableReplicas");
        let complete = updated == desired && replicas == desired && available == desired;
        let _ = store.update(&kind, Some(namespace), name, Part::Status, |current| {
            let now = now_rfc3339();
            let mut status = json!({
                "observedGeneration": current["metadata"]["generation"],
                "replicas": replicas,
                "updatedReplicas": updated,
                "readyReplicas": ready,
                "availableReplicas": available,
                "unavailableReplicas": (desired - available).max(0),
            });
            let previous = &current["status"]["conditions"];
            status["conditions"] = json!([
                condition(
                    previous,
                    "Available",
                    available >= desired,
                    if available >= desired {
                        "MinimumReplicasAvailable"
                    } else {
                        "MinimumReplicasUnavailable"
                    },
                    &now
                ),
                condition(
                    previous,
                    "Progressing",
                    true,
                    if complete {
                        "NewReplicaSetAvailable"
                    } else {
                        "ReplicaSetUpdated"
                    },
                    &now
                ),
            ]);
            let mut updated = current.clone();
            updated["status"] = status;
            Ok(updated)
        });
    }
}

/// A condition that keeps its transition time while its status stays.
fn condition(previous: &Value, kind: &str, status: bool, reason: &str, now: &str) -> Value {
    let status = if status { "True" } else { "False" };
    let before = previous
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == kind);
    let since = before
        .filter(|c| c["status"] == status)
        .map_or_else(|| json!(now), |c| c["lastTransitionTime"].clone());
    let updated = before
        .filter(|c| c["status"] == status && c["reason"] == reason)
        .map_or_else(|| json!(now), |c| c["lastUpdateTime"].clone());
    json!({"type": kind, "status": status, "reason": reason, "lastTransitionTime": since, "lastUpdateTime": updated})
}
