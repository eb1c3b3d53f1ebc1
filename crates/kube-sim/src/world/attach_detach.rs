//! Volume attachments: the attach/detach controller keeps a VolumeAttachment for every
//! PVC-backed volume of a pod on its node and deletes it when no pod there uses the volume;
//! the simulated external attacher finishes a deletion after the detach delay by removing its
//! finalizer.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use serde_json::json;

use crate::store::{Change, DeleteOptions, Part, Store};

pub const DRIVER: &str = "sim.csi.nodegrace.io";
const FINALIZER: &str = "external-attacher/sim-csi-nodegrace-io";

pub fn concerns(change: &Change) -> bool {
    matches!(
        change.collection.as_str(),
        "/pods" | "/persistentvolumeclaims" | "storage.k8s.io/volumeattachments"
    )
}

/// The VolumeAttachment name for a volume on a node (the real one hashes the same inputs).
pub fn attachment_name(volume: &str, node: &str) -> String {
    format!("csi-{volume}-{node}")
}

/// When each detach began, as the attacher saw it: deletionTimestamp has only whole seconds.
pub type DetachStarts = HashMap<String, std::time::Instant>;

pub fn reconcile(store: &Store, detach_delay: Duration, detaching: &mut DetachStarts) {
    let pods = store.kind("", "pods");
    let claims = store.kind("", "persistentvolumeclaims");
    let attachments = store.kind("storage.k8s.io", "volumeattachments");
    let mut wanted: HashMap<String, (String, String)> = HashMap::new();
    for pod in store.all(&pods) {
        let Some(node) = pod["spec"]["nodeName"].as_str().filter(|n| !n.is_empty()) else {
            continue;
        };
        if matches!(
            pod["status"]["phase"].as_str(),
            Some("Succeeded" | "Failed")
        ) {
            continue;
        }
        let namespace = pod["metadata"]["namespace"].as_str();
        for volume in pod["spec"]["volumes"].as_array().into_iter().flatten() {
            let Some(claim) = volume["persistentVolumeClaim"]["claimName"].as_str() else {
                continue;
            };
            let Ok(claim) = store.get(&claims, namespace, claim) else {
                continue;
            };
            let Some(pv) = claim["spec"]["volumeName"]
                .as_str()
                .filter(|v| !v.is_empty())
            else {
                continue;
            };
            wanted.insert(attachment_name(pv, node), (pv.to_owned(), node.to_owned()));
        }
    }
    let existing: HashSet<String> = store
        .all(&attachments)
        .iter()
        .filter_map(|va| va["metadata"]["name"].as_str().map(str::to_owned))
        .collect();
    for (name, (pv, node)) in &wanted {
        if !existing.contains(name) {
            let _ = store.create(&attachments, None, json!({
                "metadata": {"name": name, "finalizers": [FINALIZER]},
                "spec": {"attacher": DRIVER, "nodeName": node, "source": {"persistentVolumeName": pv}},
                "status": {"attached": true},
            }));
        }
    }
    let mut still_detaching = DetachStarts::new();
    for attachment in store.all(&attachments) {
        let name = attachment["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        if attachment["metadata"]["deletionTimestamp"].is_string() {
            let since = detaching
                .get(&name)
                .copied()
                .unwrap_or_else(std::time::Instant::now);
            still_detaching.insert(name.clone(), since);
            if since.elapsed() >= detach_delay {
                let _ = store.update(&attachments, None, &name, Part::Main, |current| {
                    let mut updated = current.clone();
                    if let Some(finalizers) = updated["metadata"]["finalizers"].as_array_mut() {
                        finalizers.retain(|f| f != FINALIZER);
                    }
                    Ok(updated)
                });
            }
        } else if !wanted.contains_key(&name) && attachment["spec"]["attacher"] == DRIVER {
            let _ = store.delete(&attachments, None, &name, &DeleteOptions::default());
        }
    }
    *detaching = still_detaching;
}
