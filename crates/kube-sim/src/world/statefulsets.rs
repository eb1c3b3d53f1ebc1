//! The StatefulSet controller (pkg/controller/statefulset/stateful_set_control.go), reduced to
//! identity: pod `<set>-<i>` for each ordinal, with claims `<template>-<set>-<i>` made from
//! `volumeClaimTemplates` before it; with `OrderedReady` (the default) an ordinal waits for the
//! previous one to be Running and Ready. A pod that failed is deleted, and a replacement is
//! created only once the old pod object is gone: a pod stuck Terminating on a dead node blocks
//! its ordinal, which is what non-graceful node shutdown (KEP-2268) is for.

use std::sync::Arc;

use serde_json::{Value, json};

use super::deployments::{controlled_by, template_hash};
use crate::conditions::is_ready;
use crate::store::{DeleteOptions, Part, Store};

fn text(value: &Value) -> &str {
    value.as_str().unwrap_or_default()
}

fn terminal(pod: &Value) -> bool {
    matches!(text(&pod["status"]["phase"]), "Succeeded" | "Failed")
}

fn running_and_ready(pod: &Value) -> bool {
    pod["status"]["phase"] == "Running"
        && !pod["metadata"]["deletionTimestamp"].is_string()
        && is_ready(pod)
}

fn claim_name(template: &Value, set: &str, ordinal: i64) -> String {
    format!("{}-{set}-{ordinal}", text(&template["metadata"]["name"]))
}

fn claim_for(set: &Value, template: &Value, ordinal: i64) -> Value {
    let name = text(&set["metadata"]["name"]);
    let mut claim = template.clone();
    claim["metadata"]["name"] = json!(claim_name(template, name, ordinal));
    if !claim["metadata"]["labels"].is_object() {
        claim["metadata"]["labels"] = json!({});
    }
    for (key, value) in set["spec"]["selector"]["matchLabels"]
        .as_object()
        .into_iter()
        .flatten()
    {
        claim["metadata"]["labels"][key] = value.clone();
    }
    if let Some(map) = claim.as_object_mut() {
        map.remove("status");
    }
    claim
}

fn pod_for(set: &Value, ordinal: i64, revision: &str) -> Value {
    let name = text(&set["metadata"]["name"]);
    let template = &set["spec"]["template"];
    let pod_name = format!("{name}-{ordinal}");
    let mut labels = template["metadata"]["labels"].clone();
    if !labels.is_object() {
        labels = json!({});
    }
    labels["statefulset.kubernetes.io/pod-name"] = json!(pod_name);
    labels["apps.kubernetes.io/pod-index"] = json!(ordinal.to_string());
    labels["controller-revision-hash"] = json!(revision);
    let mut spec = template["spec"].clone();
    spec["hostname"] = json!(pod_name);
    if let Some(service) = set["spec"]["serviceName"]
        .as_str()
        .filter(|s| !s.is_empty())
    {
        spec["subdomain"] = json!(service);
    }
    let claims: Vec<Value> = set["spec"]["volumeClaimTemplates"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|template| {
            json!({"name": template["metadata"]["name"], "persistentVolumeClaim": {"claimName": claim_name(template, name, ordinal)}})
        })
        .collect();
    if !claims.is_empty() {
        let mut volumes: Vec<Value> = spec["volumes"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|v| !claims.iter().any(|c| c["name"] == v["name"]))
            .collect();
        volumes.extend(claims);
        spec["volumes"] = json!(volumes);
    }
    let mut pod = json!({
        "metadata": {
            "name": pod_name,
            "labels": labels,
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": name, "uid": set["metadata"]["uid"], "controller": true, "blockOwnerDeletion": true}],
        },
        "spec": spec,
    });
    if template["metadata"]["annotations"].is_object() {
        pod["metadata"]["annotations"] = template["metadata"]["annotations"].clone();
    }
    pod
}

fn ordinal_of(pod: &Value, set: &str) -> Option<i64> {
    text(&pod["metadata"]["name"])
        .strip_prefix(set)?
        .strip_prefix('-')?
        .parse()
        .ok()
}

pub fn reconcile(store: &Store) {
    let kind = store.kind("apps", "statefulsets");
    let pods_kind = store.kind("", "pods");
    let claims_kind = store.kind("", "persistentvolumeclaims");
    let all_pods = store.all(&pods_kind);
    for set in store.all(&kind) {
        if set["metadata"]["deletionTimestamp"].is_string() {
            continue;
        }
        let namespace = text(&set["metadata"]["namespace"]);
        let name = text(&set["metadata"]["name"]);
        let desired = set["spec"]["replicas"].as_i64().unwrap_or(1);
        let ordered = set["spec"]["podManagementPolicy"] != "Parallel";
        let revision = format!("{name}-{}", template_hash(&set["spec"]["template"]));
        let owned = controlled_by(&all_pods, &set);
        let at = |ordinal: i64| -> Option<&Arc<Value>> {
            owned
                .iter()
                .copied()
                .find(|pod| ordinal_of(pod, name) == Some(ordinal))
        };
        for ordinal in 0..desired {
            match at(ordinal) {
                // The old pod object must be gone before its ordinal is created again.
                Some(pod) if pod["metadata"]["deletionTimestamp"].is_string() => {
                    if ordered {
                        break;
                    }
                }
                Some(pod) if terminal(pod) => {
                    let _ = store.delete(
                        &pods_kind,
                        Some(namespace),
                        text(&pod["metadata"]["name"]),
                        &DeleteOptions::default(),
                    );
                    if ordered {
                        break;
                    }
                }
                Some(pod) => {
                    if ordered && !running_and_ready(pod) {
                        break;
                    }
                }
                None => {
                    for template in set["spec"]["volumeClaimTemplates"]
                        .as_array()
                        .into_iter()
                        .flatten()
                    {
                        let claim = claim_for(&set, template, ordinal);
                        // Existing claims are kept: the data of the ordinal is in them.
                        let _ = store.create(&claims_kind, Some(namespace), claim);
                    }
                    let _ = store.create(
                        &pods_kind,
                        Some(namespace),
                        pod_for(&set, ordinal, &revision),
                    );
                    if ordered {
                        break;
                    }
                }
            }
        }
        // Scale down from the highest ordinal, one at a time when ordered.
        let mut surplus: Vec<&&Arc<Value>> = owned
            .iter()
            .filter(|pod| ordinal_of(pod, name).is_some_and(|o| o >= desired))
            .collect();
        surplus.sort_by_key(|pod| std::cmp::Reverse(ordinal_of(pod, name)));
        let terminating = surplus
            .iter()
            .any(|pod| pod["metadata"]["deletionTimestamp"].is_string());
        for pod in surplus.iter().take(if ordered { 1 } else { surplus.len() }) {
            if !(ordered && terminating) {
                let _ = store.delete(
                    &pods_kind,
                    Some(namespace),
                    text(&pod["metadata"]["name"]),
                    &DeleteOptions::default(),
                );
            }
        }
        let counted: Vec<&&Arc<Value>> = owned
            .iter()
            .filter(|pod| !pod["metadata"]["deletionTimestamp"].is_string())
            .collect();
        let replicas = counted.len();
        let ready = counted.iter().filter(|pod| running_and_ready(pod)).count();
        let _ = store.update(&kind, Some(namespace), name, Part::Status, |current| {
            let mut updated = current.clone();
            updated["status"] = json!({
                "observedGeneration": current["metadata"]["generation"],
                "replicas": replicas,
                "readyReplicas": ready,
                "availableReplicas": ready,
                "currentReplicas": replicas,
                "updatedReplicas": replicas,
                "currentRevision": revision,
                "updateRevision": revision,
                "collisionCount": 0,
            });
            Ok(updated)
        });
    }
}
