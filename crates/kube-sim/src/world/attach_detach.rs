//! Volume attachments, as the attach/detach controller
//! (pkg/controller/volume/attachdetach/reconciler/reconciler.go) and a CSI external attacher
//! handle them:
//! - a PVC-backed volume of the simulated CSI driver, of a pod on a node, while the pod is not
//!   terminated, is wanted there: a VolumeAttachment is created and the attacher reports it
//!   attached (another driver's volume is mounted without one, as with `attachRequired: false`);
//! - a volume no longer wanted is detached (its VolumeAttachment deleted) only once the kubelet
//!   unmounted it (it left `node.status.volumesInUse`), or, on a node that is not Ready, after
//!   `maxWaitForUnmountDuration`, or at once when the node has the
//!   `node.kubernetes.io/out-of-service` taint;
//! - the attacher finishes a detach after the detach delay by dropping its finalizer;
//! - a volume whose PersistentVolume allows neither ReadWriteMany nor ReadOnlyMany is attached
//!   to one node at a time: while it is attached (or still detaching) elsewhere, the pod gets a
//!   `FailedAttachVolume` Multi-Attach error and waits (the reconciler's
//!   `isMultiAttachForbidden`).
//!
//! `node.status.volumesAttached` lists what is attached, and the kubelet lists in
//! `volumesInUse` what it mounted, both by the CSI plugin's unique name
//! `kubernetes.io/csi/<driver>^<volumeHandle>` from the PersistentVolume's `spec.csi`.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::conditions::{is_finished, is_out_of_service, is_ready};
use crate::store::{Change, DeleteOptions, Part, Store};

pub const DRIVER: &str = "sim.csi.nodegrace.io";
const FINALIZER: &str = "external-attacher/sim-csi-nodegrace-io";

pub fn concerns(change: &Change) -> bool {
    matches!(
        change.collection.as_str(),
        "/pods" | "/persistentvolumeclaims" | "/nodes" | "storage.k8s.io/volumeattachments"
    )
}

/// The VolumeAttachment name for a volume on a node (the real one hashes the same inputs).
pub fn attachment_name(volume: &str, node: &str) -> String {
    format!("csi-{volume}-{node}")
}

/// The name the kubelet and the attach/detach controller give a CSI volume in a node's
/// `volumesInUse` and `volumesAttached` (the CSI plugin's `GetVolumeName`).
pub fn unique_volume_name(driver: &str, volume_handle: &str) -> String {
    format!("kubernetes.io/csi/{driver}^{volume_handle}")
}

/// A PersistentVolume with a CSI source, as the kubelet and the attach/detach controller know it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CsiVolume {
    /// The PersistentVolume's name (a VolumeAttachment's `source.persistentVolumeName`).
    pub pv: String,
    pub driver: String,
    /// `kubernetes.io/csi/<driver>^<volumeHandle>`.
    pub unique_name: String,
}

impl CsiVolume {
    /// Only the simulated driver has an external attacher: another driver's volume is mounted
    /// without an attachment, as one whose CSIDriver says `attachRequired: false`.
    pub fn needs_attaching(&self) -> bool {
        self.driver == DRIVER
    }
}

/// The PersistentVolume `pv`, when it exists and has a CSI source (other sources are not
/// attachable here: no attachment, not in `volumesInUse`).
pub fn csi_volume(store: &Store, pv: &str) -> Option<CsiVolume> {
    let found = store
        .get(&store.kind("", "persistentvolumes"), None, pv)
        .ok()?;
    let csi = &found["spec"]["csi"];
    let driver = csi["driver"].as_str().filter(|d| !d.is_empty())?;
    let handle = csi["volumeHandle"].as_str().filter(|h| !h.is_empty())?;
    Some(CsiVolume {
        pv: pv.to_owned(),
        driver: driver.to_owned(),
        unique_name: unique_volume_name(driver, handle),
    })
}

/// The CSI volumes `pod` uses through its bound claims.
pub fn pod_csi_volumes(store: &Store, pod: &Value) -> Vec<CsiVolume> {
    pod_volumes(store, pod)
        .iter()
        .filter_map(|pv| csi_volume(store, pv))
        .collect()
}

#[derive(Debug, Clone, Copy)]
pub struct Timings {
    /// How long the attacher takes to detach.
    pub detach_delay: Duration,
    /// How long an unhealthy node's mounted volume waits before it is detached anyway.
    pub max_wait_for_unmount: Duration,
}

/// What the controller remembers between passes.
#[derive(Debug, Default)]
pub struct Memory {
    /// When each unwanted volume was first seen unwanted (the reconciler's DetachRequestedTime).
    detach_requested: HashMap<String, Instant>,
    /// When each detach began, as the attacher saw it: deletionTimestamp has only whole seconds.
    detaching: HashMap<String, Instant>,
    /// Pods (uid, volume) already told about a Multi-Attach error: upstream reports it once.
    multi_attach_reported: BTreeSet<(String, String)>,
    /// Each attachment's (by UID) volume by its unique name, as first read from its
    /// PersistentVolume and kept while the attachment exists: the reconciler's actual state
    /// holds the volume it attached, whatever becomes of the PersistentVolume (deleted, or
    /// replaced by a namesake of another volume).
    unique_names: HashMap<String, String>,
}

/// The reconciler's `IsPodTerminated`: finished, or being deleted with nothing running.
fn terminated(pod: &Value) -> bool {
    if is_finished(pod) {
        return true;
    }
    pod["metadata"]["deletionTimestamp"].is_string()
        && !pod["status"]["containerStatuses"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|status| status["state"]["running"].is_object())
}

/// The claims `pod` names: its `persistentVolumeClaim` volumes and its generic ephemeral
/// volumes' claims (`<pod>-<volume>`).
pub fn pod_claims(pod: &Value) -> Vec<(String, bool)> {
    pod["spec"]["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(
            |volume| match volume["persistentVolumeClaim"]["claimName"].as_str() {
                Some(claim) => Some((claim.to_owned(), false)),
                None => super::ephemeral::claim_name(pod, volume).map(|claim| (claim, true)),
            },
        )
        .collect()
}

/// The persistent volumes `pod` uses through its claims, resolved as upstream's
/// `CreateVolumeSpec`: an ephemeral volume's claim counts only when the pod controls it.
pub fn pod_volumes(store: &Store, pod: &Value) -> Vec<String> {
    let claims = store.kind("", "persistentvolumeclaims");
    let namespace = pod["metadata"]["namespace"].as_str();
    pod_claims(pod)
        .into_iter()
        .filter_map(|(claim, ephemeral)| {
            store
                .get(&claims, namespace, &claim)
                .ok()
                .filter(|found| !ephemeral || super::ephemeral::is_for_pod(found, pod))
        })
        .filter_map(|claim| {
            claim["spec"]["volumeName"]
                .as_str()
                .filter(|v| !v.is_empty())
                .map(str::to_owned)
        })
        .collect()
}

pub fn reconcile(store: &Store, timings: Timings, memory: &mut Memory) {
    let attachments = store.kind("storage.k8s.io", "volumeattachments");
    let mut wanted: HashMap<String, (String, String)> = HashMap::new();
    let mut wanting_pods: HashMap<String, std::sync::Arc<Value>> = HashMap::new();
    for pod in store.all(&store.kind("", "pods")) {
        let Some(node) = pod["spec"]["nodeName"].as_str().filter(|n| !n.is_empty()) else {
            continue;
        };
        // Most pods name no claim: they are passed over before the store is asked anything.
        if pod_claims(&pod).is_empty() || terminated(&pod) {
            continue;
        }
        for volume in pod_csi_volumes(store, &pod) {
            if !volume.needs_attaching() {
                continue;
            }
            let name = attachment_name(&volume.pv, node);
            wanting_pods
                .entry(name.clone())
                .or_insert_with(|| pod.clone());
            wanted.insert(name, (volume.pv, node.to_owned()));
        }
    }
    let existing: HashMap<String, std::sync::Arc<Value>> = store
        .all(&attachments)
        .into_iter()
        .filter(|va| va["spec"]["attacher"] == DRIVER)
        .map(|va| (text(&va["metadata"]["name"]).to_owned(), va))
        .collect();
    let live: BTreeSet<&str> = existing
        .values()
        .map(|va| text(&va["metadata"]["uid"]))
        .collect();
    memory
        .unique_names
        .retain(|uid, _| live.contains(uid.as_str()));
    for attachment in existing.values() {
        let uid = text(&attachment["metadata"]["uid"]);
        if memory.unique_names.contains_key(uid) {
            continue;
        }
        let pv = text(&attachment["spec"]["source"]["persistentVolumeName"]);
        if let Some(volume) = csi_volume(store, pv) {
            memory
                .unique_names
                .insert(uid.to_owned(), volume.unique_name);
        }
    }
    let mut still_reported = BTreeSet::new();
    for (name, (volume, node)) in &wanted {
        if !existing.contains_key(name) {
            let elsewhere = existing.values().any(|va| {
                va["spec"]["source"]["persistentVolumeName"] == volume.as_str()
                    && va["spec"]["nodeName"] != node.as_str()
            });
            if elsewhere && multi_attach_forbidden(store, volume) {
                if let Some(pod) = wanting_pods.get(name) {
                    let key = (text(&pod["metadata"]["uid"]).to_owned(), volume.clone());
                    if !memory.multi_attach_reported.contains(&key) {
                        report_multi_attach(store, pod, volume);
                    }
                    still_reported.insert(key);
                }
                continue;
            }
            let _ = store.create(&attachments, None, json!({
                "metadata": {"name": name, "finalizers": [FINALIZER]},
                "spec": {"attacher": DRIVER, "nodeName": node, "source": {"persistentVolumeName": volume}},
            }));
        }
    }
    let nodes = store.kind("", "nodes");
    let mut still_requested = HashMap::new();
    let mut still_detaching = HashMap::new();
    for (name, attachment) in &existing {
        if attachment["metadata"]["deletionTimestamp"].is_string() {
            let since = memory
                .detaching
                .get(name)
                .copied()
                .unwrap_or_else(Instant::now);
            still_detaching.insert(name.clone(), since);
            if since.elapsed() >= timings.detach_delay {
                drop_finalizer(store, name);
            }
            continue;
        }
        if attachment["status"]["attached"] != true {
            report_attached(store, name);
        }
        if wanted.contains_key(name) {
            continue;
        }
        let requested = memory
            .detach_requested
            .get(name)
            .copied()
            .unwrap_or_else(Instant::now);
        still_requested.insert(name.clone(), requested);
        let unique_name = memory
            .unique_names
            .get(text(&attachment["metadata"]["uid"]))
            .map(String::as_str);
        let node = store
            .get(&nodes, None, text(&attachment["spec"]["nodeName"]))
            .ok();
        if may_detach(node.as_deref(), unique_name, requested, timings) {
            let _ = store.delete(&attachments, None, name, &DeleteOptions::default());
        }
    }
    memory.detach_requested = still_requested;
    memory.detaching = still_detaching;
    memory.multi_attach_reported = still_reported;
    report_volumes_attached(store, &memory.unique_names);
}

/// Only a PersistentVolume says reliably whether it may be attached to several nodes: with
/// access modes and none of them ReadWriteMany or ReadOnlyMany, it may not.
fn multi_attach_forbidden(store: &Store, volume: &str) -> bool {
    let volumes = store.kind("", "persistentvolumes");
    store.get(&volumes, None, volume).is_ok_and(|pv| {
        pv["spec"]["accessModes"].as_array().is_some_and(|modes| {
            !modes.is_empty()
                && !modes
                    .iter()
                    .any(|mode| mode == "ReadWriteMany" || mode == "ReadOnlyMany")
        })
    })
}

fn report_multi_attach(store: &Store, pod: &Value, volume: &str) {
    let source = super::events::Source {
        component: "attachdetach-controller",
        host: None,
    };
    super::events::warn(
        store,
        source,
        pod,
        "FailedAttachVolume",
        &format!(
            "Multi-Attach error for volume \"{volume}\" Volume is already exclusively attached to \
             one node and can't be attached to another"
        ),
    );
}

fn text(value: &Value) -> &str {
    value.as_str().unwrap_or_default()
}

/// The reconciler's rule: a volume still mounted stays attached, unless the node has the
/// out-of-service taint, or is unhealthy and the wait for unmount ran out. A volume whose
/// unique name is unknown (its PersistentVolume never seen) cannot be reported in use.
fn may_detach(
    node: Option<&Value>,
    unique_name: Option<&str>,
    requested: Instant,
    timings: Timings,
) -> bool {
    let Some(node) = node else {
        return true;
    };
    let mounted = unique_name.is_some_and(|unique| {
        node["status"]["volumesInUse"]
            .as_array()
            .is_some_and(|in_use| in_use.iter().any(|v| v == unique))
    });
    let forced = !is_ready(node) && requested.elapsed() >= timings.max_wait_for_unmount;
    !mounted || is_out_of_service(node) || forced
}

fn report_attached(store: &Store, name: &str) {
    let attachments = store.kind("storage.k8s.io", "volumeattachments");
    let _ = store.update(&attachments, None, name, Part::Status, |current| {
        let mut updated = current.clone();
        updated["status"]["attached"] = json!(true);
        Ok(updated)
    });
}

fn drop_finalizer(store: &Store, name: &str) {
    let attachments = store.kind("storage.k8s.io", "volumeattachments");
    let _ = store.update(&attachments, None, name, Part::Main, |current| {
        let mut updated = current.clone();
        if let Some(finalizers) = updated["metadata"]["finalizers"].as_array_mut() {
            finalizers.retain(|f| f != FINALIZER);
        }
        Ok(updated)
    });
}

/// Each node's `status.volumesAttached`: the attached volumes, until their detach completes.
fn report_volumes_attached(store: &Store, unique_names: &HashMap<String, String>) {
    let attachments = store.kind("storage.k8s.io", "volumeattachments");
    let mut by_node: HashMap<String, BTreeSet<String>> = HashMap::new();
    for attachment in store.all(&attachments) {
        let unique_name = unique_names.get(text(&attachment["metadata"]["uid"]));
        if let Some(unique_name) = unique_name
            && attachment["spec"]["attacher"] == DRIVER
            && attachment["status"]["attached"] == true
        {
            by_node
                .entry(text(&attachment["spec"]["nodeName"]).to_owned())
                .or_default()
                .insert(unique_name.clone());
        }
    }
    let nodes = store.kind("", "nodes");
    for node in store.all(&nodes) {
        let name = text(&node["metadata"]["name"]);
        let attached: Vec<Value> = by_node
            .get(name)
            .into_iter()
            .flatten()
            .map(|volume| json!({"name": volume, "devicePath": ""}))
            .collect();
        let current = node["status"]["volumesAttached"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if current == attached {
            continue;
        }
        let _ = store.update(&nodes, None, name, Part::Status, |current| {
            let mut updated = current.clone();
            // None left: the store leaves the empty list out.
            updated["status"]["volumesAttached"] = json!(attached);
            Ok(updated)
        });
    }
}
