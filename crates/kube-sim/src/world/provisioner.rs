//! Dynamic provisioning, reduced: a claim that names no volume gets a PersistentVolume of the
//! simulated CSI driver, and both are bound (what external-provisioner and the PV controller
//! do for a StorageClass with Immediate binding). Claims that name a volume are left as they are.

use serde_json::{Value, json};

use super::attach_detach::DRIVER;
use crate::store::{Change, Part, Store};

pub fn concerns(change: &Change) -> bool {
    change.collection == "/persistentvolumeclaims"
}

pub fn reconcile(store: &Store) {
    let claims = store.kind("", "persistentvolumeclaims");
    let volumes = store.kind("", "persistentvolumes");
    for claim in store.all(&claims) {
        let named = claim["spec"]["volumeName"]
            .as_str()
            .is_some_and(|v| !v.is_empty());
        if named || claim["metadata"]["deletionTimestamp"].is_string() {
            continue;
        }
        let namespace = claim["metadata"]["namespace"].as_str().unwrap_or_default();
        let name = claim["metadata"]["name"].as_str().unwrap_or_default();
        let uid = claim["metadata"]["uid"].as_str().unwrap_or_default();
        let volume_name = format!("pvc-{uid}");
        let capacity = claim["spec"]["resources"]["requests"]["storage"].clone();
        let volume = json!({
            "metadata": {"name": volume_name, "annotations": {"pv.kubernetes.io/provisioned-by": DRIVER}},
            "spec": {
                "capacity": {"storage": if capacity.is_null() { json!("1Gi") } else { capacity.clone() }},
                "accessModes": claim["spec"]["accessModes"],
                "persistentVolumeReclaimPolicy": "Delete",
                "storageClassName": claim["spec"]["storageClassName"],
                "volumeMode": "Filesystem",
                "csi": {"driver": DRIVER, "volumeHandle": volume_name},
                "claimRef": {"kind": "PersistentVolumeClaim", "apiVersion": "v1", "namespace": namespace, "name": name, "uid": uid},
            },
        });
        if store.create(&volumes, None, volume).is_err() {
            continue;
        }
        let _ = store.update(&volumes, None, &volume_name, Part::Status, |current| {
            let mut bound = current.clone();
            bound["status"] = json!({"phase": "Bound"});
            Ok(bound)
        });
        let bound = store.update(&claims, Some(namespace), name, Part::Main, |current| {
            let mut bound: Value = current.clone();
            bound["spec"]["volumeName"] = json!(volume_name);
            Ok(bound)
        });
        if bound.is_ok() {
            let _ = store.update(&claims, Some(namespace), name, Part::Status, |current| {
                let mut bound = current.clone();
                bound["status"] = json!({"phase": "Bound", "accessModes": current["spec"]["accessModes"], "capacity": {"storage": if capacity.is_null() { json!("1Gi") } else { capacity.clone() }}});
                Ok(bound)
            });
        }
    }
}
