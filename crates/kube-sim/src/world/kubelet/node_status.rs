//! The kubelet's reports about its node (pkg/kubelet/kubelet_node_status.go, pkg/kubelet/
//! nodelease): boot, Ready, the Lease renewed on the node's own clock, and
//! `volumesInUse` kept as the attach/detach controller reads it.

use std::sync::Arc;

use nix::sys::signal::Signal;
use serde_json::{Value, json};

use super::{Kubelets, containers, node_clock, reporting, text};
use crate::conditions::is_finished;
use crate::store::Part;
use crate::store::timestamps::now_rfc3339;
use crate::world::KUBELET_ANNOTATION;

impl Kubelets {
    /// `node.status.volumesInUse` after `changed` changed. Only pods with claims (named, or
    /// generic ephemeral volumes') can change it, so others skip the work.
    pub(super) fn sync_volumes_in_use(&mut self, node: &str, changed: &Value) {
        if crate::world::attach_detach::pod_claims(changed).is_empty() {
            return;
        }
        self.report_volumes_in_use(node, &self.bound_to(node));
    }

    /// The pods bound to `node`.
    fn bound_to(&self, node: &str) -> Vec<Arc<Value>> {
        self.store.pods_on_node(node)
    }

    /// `node.status.volumesInUse` from the pods bound to `node`: the volumes of those that have
    /// not finished (the volume manager's mounted volumes; a kubelet coming back finds the
    /// others orphaned and unmounts them), each by the name it was mounted by.
    pub(super) fn report_volumes_in_use(&mut self, node: &str, bound: &[Arc<Value>]) {
        let mut in_use = Vec::new();
        for pod in bound {
            let uid = text(&pod["metadata"]["uid"]);
            if is_finished(pod) {
                self.mounted.remove(&uid);
                continue;
            }
            in_use.extend(self.mounted_volumes(&uid, pod));
        }
        in_use.sort();
        in_use.dedup();
        let nodes = self.store.kind("", "nodes");
        let _ = self
            .store
            .update(&nodes, None, node, Part::Status, |current| {
                let mut updated = current.clone();
                // None left: the store leaves the empty list out.
                updated["status"]["volumesInUse"] = json!(in_use);
                Ok(updated)
            });
    }

    /// The unique names of `pod`'s volumes as they were mounted. A real kubelet mounts a
    /// volume by the name its PersistentVolume gave it then, and keeps reporting that name
    /// until it unmounts it: a PersistentVolume deleted and made again under its name for
    /// another volume does not rename it. Remembered once every claim resolved to a volume.
    fn mounted_volumes(&mut self, uid: &str, pod: &Value) -> Vec<String> {
        if let Some(names) = self.mounted.get(uid) {
            return names.clone();
        }
        let names: Vec<String> = crate::world::attach_detach::pod_csi_volumes(&self.store, pod)
            .into_iter()
            .map(|volume| volume.unique_name)
            .collect();
        let claims = crate::world::attach_detach::pod_claims(pod).len();
        let resolved = crate::world::attach_detach::pod_volumes(&self.store, pod).len();
        if claims > 0 && resolved >= claims {
            self.mounted.insert(uid.to_owned(), names.clone());
        }
        names
    }

    /// A stopped kubelet is a machine gone dark: its container processes die with it. A kubelet
    /// coming back picks up the pods it ignored while stopped and, as after a reboot, starts
    /// again the containers of its running pods that have no process.
    pub(super) fn node_changed(&mut self, node: &Arc<Value>) {
        let name = text(&node["metadata"]["name"]);
        let bound = self.bound_to(&name);
        match node["metadata"]["annotations"][KUBELET_ANNOTATION].as_str() {
            // Cut off, not dead: its containers run on, unseen.
            Some("partitioned") => {}
            Some("booting") => self.boot(node),
            Some("stopped") => {
                for pod in &bound {
                    let uid = text(&pod["metadata"]["uid"]);
                    self.runtime.signal(&uid, Signal::SIGKILL);
                    self.stop_probing(&uid, None);
                    // A machine without power finishes no deletion: the stop it was timing is
                    // forgotten, and begun again when it is back.
                    if let Some((key, _)) = self.stops.remove(&uid) {
                        self.timers.remove(&key);
                    }
                }
            }
            _ => {
                self.report_volumes_in_use(&name, &bound);
                self.node_reporting(bound);
            }
        }
    }

    /// A kubelet reporting (again): it catches up with its pods and, as after a reboot, starts
    /// the containers of its running pods that have no process.
    pub(super) fn node_reporting(&mut self, bound: Vec<Arc<Value>>) {
        for pod in bound {
            self.pod_changed(&pod);
            let running = pod["status"]["phase"] == "Running"
                && pod["metadata"]["deletionTimestamp"].is_null();
            if !running {
                continue;
            }
            let uid = text(&pod["metadata"]["uid"]);
            let dead: Vec<String> = containers(&pod)
                .filter(|c| self.runtime.runs(c))
                .map(|c| text(&c["name"]))
                .filter(|container| !self.runtime.is_running(&uid, container))
                .collect();
            for container in dead {
                self.restart(
                    text(&pod["metadata"]["namespace"]).as_str(),
                    text(&pod["metadata"]["name"]).as_str(),
                    &uid,
                    &container,
                );
            }
        }
    }

    /// A running kubelet reports its node Ready (a node created bare, or coming back).
    pub(super) fn post_ready(&self, name: &str, node: &Value) {
        let ready = node["status"]["conditions"].as_array().is_some_and(|c| {
            c.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        });
        if ready {
            return;
        }
        let nodes = self.store.kind("", "nodes");
        let _ = self.store.update(&nodes, None, name, Part::Status, |current| {
            let now = now_rfc3339();
            let condition = json!({"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status", "lastHeartbeatTime": now, "lastTransitionTime": now});
            let patch = json!({"status": {"conditions": [condition], "nodeInfo": {"kubeletVersion": "v1.33.0-sim"}}});
            crate::patch::apply(current, crate::patch::PatchType::StrategicMerge, &patch, false)
        });
    }

    pub(super) fn renew_leases(&self) {
        let nodes = self.store.kind("", "nodes");
        for node in self.store.all(&nodes) {
            if reporting(&node) {
                self.renew_lease(&node);
            }
        }
    }

    /// A booting machine's kubelet reports first — its Lease renewed, the node Ready — and
    /// only then runs pods, as a real kubelet needs the API server before it can start any.
    pub(super) fn boot(&mut self, node: &Value) {
        self.renew_lease(node);
        let nodes = self.store.kind("", "nodes");
        let name = text(&node["metadata"]["name"]);
        let uid = node["metadata"]["uid"].clone();
        let _ = self
            .store
            .update(&nodes, None, &name, Part::Main, |current| {
                let mut booted = current.clone();
                if current["metadata"]["uid"] == uid
                    && let Some(annotations) = booted["metadata"]["annotations"].as_object_mut()
                {
                    annotations.remove(KUBELET_ANNOTATION);
                }
                Ok(booted)
            });
    }

    pub(super) fn renew_lease(&self, node: &Value) {
        let leases = self.store.kind("coordination.k8s.io", "leases");
        let now = crate::store::timestamps::format_micro_time(node_clock(node));
        let name = text(&node["metadata"]["name"]);
        self.post_ready(&name, node);
        {
            let renewed = self.store.update(
                &leases,
                Some("kube-node-lease"),
                &name,
                Part::Main,
                |current| {
                    let mut lease = current.clone();
                    lease["spec"]["renewTime"] = json!(now);
                    Ok(lease)
                },
            );
            if renewed.is_err() {
                let _ = self.store.create(&leases, Some("kube-node-lease"), json!({
                    "metadata": {
                        "name": name,
                        "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": name, "uid": node["metadata"]["uid"]}],
                    },
                    "spec": {"holderIdentity": name, "leaseDurationSeconds": 40, "renewTime": now},
                }));
            }
        }
    }
}
