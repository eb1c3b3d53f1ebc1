//! The ephemeral volume controller (upstream `pkg/controller/volume/ephemeral`): each generic
//! ephemeral volume of a pod gets its claim `<pod>-<volume>`, made from the volume's
//! `volumeClaimTemplate` and controlled by the pod (so the garbage collector deletes it with the
//! pod). A claim of that name that the pod does not control is left alone, as upstream does: the
//! pod cannot use it, and the attach/detach controller does not count it.

use serde_json::{Value, json};

use crate::store::{Change, Store};

pub fn concerns(change: &Change) -> bool {
    change.collection == "/pods"
}

/// The claim name the controller gives a pod's ephemeral volume (`ephemeral.VolumeClaimName`).
pub fn claim_name(pod: &Value, volume: &Value) -> Option<String> {
    volume["ephemeral"].as_object()?;
    Some(format!(
        "{}-{}",
        pod["metadata"]["name"].as_str().unwrap_or_default(),
        volume["name"].as_str().unwrap_or_default()
    ))
}

/// Whether `claim` is `pod`'s own (`ephemeral.VolumeIsForPod`: the pod is its controller).
pub fn is_for_pod(claim: &Value, pod: &Value) -> bool {
    claim["metadata"]["ownerReferences"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|owner| owner["controller"] == true && owner["uid"] == pod["metadata"]["uid"])
}

pub fn reconcile(store: &Store) {
    let pods = store.kind("", "pods");
    let claims = store.kind("", "persistentvolumeclaims");
    let with_ephemeral = store
        .list(&pods, None, None, 0, &|pod| {
            !pod["metadata"]["deletionTimestamp"].is_string()
                && pod["spec"]["volumes"]
                    .as_array()
                    .is_some_and(|volumes| volumes.iter().any(|v| v["ephemeral"].is_object()))
        })
        .items;
    for pod in with_ephemeral {
        let namespace = pod["metadata"]["namespace"].as_str();
        for volume in pod["spec"]["volumes"].as_array().into_iter().flatten() {
            let Some(name) = claim_name(&pod, volume) else {
                continue;
            };
            if store.get(&claims, namespace, &name).is_ok() {
                continue;
            }
            let template = &volume["ephemeral"]["volumeClaimTemplate"];
            let mut metadata = template["metadata"].clone();
            if !metadata.is_object() {
                metadata = json!({});
            }
            metadata["name"] = json!(name);
            metadata["ownerReferences"] = json!([{
                "apiVersion": "v1",
                "kind": "Pod",
                "name": pod["metadata"]["name"],
                "uid": pod["metadata"]["uid"],
                "controller": true,
                "blockOwnerDeletion": true,
            }]);
            let claim = json!({"metadata": metadata, "spec": template["spec"]});
            // Best effort, as upstream retries: the next change of the pod tries again.
            let _ = store.create(&claims, namespace, claim);
        }
    }
}
