//! The kubelet's pod lifecycle (pkg/kubelet/kubelet.go's SyncPod and SyncTerminatingPod, the
//! status manager's writes): a bound pod starts once its volumes are attached, turns Ready,
//! finishes (its containers' exit codes, a graceful deletion completed), and every status
//! write is guarded by the pod's UID.

use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::Signal;
use serde_json::{Value, json};

use super::{Action, Kubelets, container_names, containers, exit_reason, seconds_annotation, text};
use crate::conditions::is_finished;
use crate::store::Part;
use crate::store::timestamps::now_rfc3339;
use crate::world::{READY_AFTER_ANNOTATION, STOP_SECONDS_ANNOTATION, probes};

impl Kubelets {
    pub(super) fn pod_changed(&mut self, pod: &Arc<Value>) {
        let node = text(&pod["spec"]["nodeName"]);
        if node.is_empty() || !self.kubelet_running(&node) {
            return;
        }
        let meta = &pod["metadata"];
        let (namespace, name, uid) = (
            text(&meta["namespace"]),
            text(&meta["name"]),
            text(&meta["uid"]),
        );
        if meta["deletionTimestamp"].is_string() {
            if is_finished(pod) {
                return;
            }
            let grace =
                Duration::from_secs(meta["deletionGracePeriodSeconds"].as_u64().unwrap_or(0));
            let processes = self.runtime.any_running(&uid);
            // Processes end when they end, or are killed when the grace is over.
            let stop_after = if processes {
                grace
            } else {
                seconds_annotation(pod, STOP_SECONDS_ANNOTATION).min(grace)
            };
            let killed = processes || seconds_annotation(pod, STOP_SECONDS_ANNOTATION) > grace;
            let due = tokio::time::Instant::now() + stop_after;
            if !self.stops.contains_key(&uid) {
                self.runtime.signal(&uid, Signal::SIGTERM);
                for container in container_names(pod) {
                    self.record(
                        pod,
                        Some(&container),
                        "Killing",
                        &format!("Stopping container {container}"),
                    );
                }
            }
            match self.stops.get(&uid) {
                Some((_, scheduled)) if *scheduled <= due => {}
                Some((key, _)) => {
                    let key = *key;
                    self.timers.reset_at(&key, due);
                    self.stops.insert(uid, (key, due));
                }
                None => {
                    let key = self.timers.insert_at(
                        Action::Stopped {
                            namespace,
                            name,
                            uid: uid.clone(),
                            killed,
                        },
                        due,
                    );
                    self.stops.insert(uid, (key, due));
                }
            }
            return;
        }
        if pod["status"]["phase"] == "Pending" {
            if self.options.attach_detach && !self.volumes_attached(&node, pod) {
                // The volume manager waits for every claim's volume to be attached; the
                // attach/detach controller's change to the node brings the pod back here.
                return;
            }
            // A pod whose containers run as processes gets its own address, and stays Pending
            // (ContainerCreating) until its volumes and environment can be set up.
            let processes = containers(pod).any(|c| self.runtime.runs(c));
            let pod_ip = if processes {
                self.pod_ips
                    .entry(uid.clone())
                    .or_insert_with(|| self.pod_addresses.allocate())
                    .clone()
            } else {
                format!(
                    "10.244.{}.{}",
                    rand::random_range(0..255),
                    rand::random_range(1..255)
                )
            };
            let mut addressed = (**pod).clone();
            addressed["status"]["podIP"] = json!(pod_ip);
            let launches = match self.prepare_all(&addressed) {
                Ok(launches) => launches,
                Err(error) => {
                    if self.retrying.insert(uid.clone()) {
                        self.record(pod, None, "FailedMount", &error);
                        self.timers.insert(
                            Action::Retry {
                                namespace,
                                name,
                                uid,
                            },
                            Duration::from_secs(1),
                        );
                    }
                    return;
                }
            };
            for container in container_names(pod) {
                let image = pod["spec"]["containers"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|c| c["name"] == container.as_str())
                    .and_then(|c| c["image"].as_str())
                    .unwrap_or_default();
                self.record(
                    pod,
                    Some(&container),
                    "Pulled",
                    &format!("Container image \"{image}\" already present on machine"),
                );
                self.record(
                    pod,
                    Some(&container),
                    "Created",
                    &format!("Created container: {container}"),
                );
                self.record(
                    pod,
                    Some(&container),
                    "Started",
                    &format!("Started container {container}"),
                );
            }
            // Without a readiness delay the pod is Ready in the same status write that makes
            // it Running, as the kubelet's status manager reports a container without a
            // readiness probe; a process with one waits for it to pass.
            let ready_after = seconds_annotation(pod, READY_AFTER_ANNOTATION);
            self.start(&namespace, &name, &uid, ready_after.is_zero(), &pod_ip);
            self.start_processes(&addressed, launches);
            self.sync_volumes_in_use(&node, pod);
            if !ready_after.is_zero() {
                self.timers.insert(
                    Action::Ready {
                        namespace,
                        name,
                        uid,
                    },
                    ready_after,
                );
            }
        }
    }

    /// Whether every claim of `pod` is bound and its volume attached to `node`.
    pub(super) fn volumes_attached(&self, node: &str, pod: &Value) -> bool {
        let claims = crate::world::attach_detach::pod_claims(pod);
        if claims.is_empty() {
            return true;
        }
        let volumes = crate::world::attach_detach::pod_volumes(&self.store, pod);
        if volumes.len() < claims.len() {
            return false;
        }
        let nodes = self.store.kind("", "nodes");
        let Ok(node) = self.store.get(&nodes, None, node) else {
            return false;
        };
        let attached = node["status"]["volumesAttached"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        volumes
            .iter()
            .filter_map(|pv| crate::world::attach_detach::csi_volume(&self.store, pv))
            .filter(crate::world::attach_detach::CsiVolume::needs_attaching)
            .all(|volume| {
                attached
                    .iter()
                    .any(|entry| entry["name"] == volume.unique_name.as_str())
            })
    }

    /// A pod object is gone: its processes are killed and its node's kubelet forgets its
    /// volumes.
    pub(super) fn pod_gone(&mut self, pod: &Arc<Value>) {
        let uid = text(&pod["metadata"]["uid"]);
        self.runtime.signal(&uid, Signal::SIGKILL);
        self.stop_probing(&uid, None);
        self.pod_ips.remove(&uid);
        self.exit_codes.retain(|(pod, _), _| *pod != uid);
        self.mounted.remove(&uid);
        let node = text(&pod["spec"]["nodeName"]);
        if !node.is_empty() && self.kubelet_running(&node) {
            self.sync_volumes_in_use(&node, pod);
        }
    }

    pub(super) fn record(&self, pod: &Value, container: Option<&str>, reason: &str, message: &str) {
        let node = pod["spec"]["nodeName"].as_str();
        let source = crate::world::events::Source {
            component: "kubelet",
            host: node,
        };
        crate::world::events::record(&self.store, source, pod, container, reason, message);
    }

    pub(super) fn update_pod(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        change: impl FnOnce(&mut Value),
    ) {
        let pods = self.store.kind("", "pods");
        let _ = self
            .store
            .update(&pods, Some(namespace), name, Part::Status, |current| {
                if current["metadata"]["uid"] != uid
                    || current["metadata"]["deletionTimestamp"].is_string()
                {
                    return Ok(current.clone());
                }
                let mut updated = current.clone();
                change(&mut updated);
                Ok(updated)
            });
    }

    /// The containers ended: the pod's terminal phase (getPhase for a terminal pod: Succeeded
    /// when every container exited 0), unready, its containers terminated.
    pub(super) fn finish(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        killed: bool,
    ) -> Option<Arc<Value>> {
        let pods = self.store.kind("", "pods");
        self.store
            .update(&pods, Some(namespace), name, Part::Status, |current| {
                let mut updated = current.clone();
                if current["metadata"]["uid"] != uid || is_finished(current) {
                    return Ok(updated);
                }
                let now = now_rfc3339();
                let mut all_succeeded = true;
                if let Some(statuses) = updated["status"]["containerStatuses"].as_array_mut() {
                    for status in statuses {
                        if let Some(code) = status["state"]["terminated"]["exitCode"].as_i64() {
                            // Ended before the deletion, as a process does.
                            all_succeeded &= code == 0;
                            continue;
                        }
                        let container = text(&status["name"]);
                        let code = self
                            .exit_codes
                            .get(&(uid.to_owned(), container))
                            .copied()
                            .unwrap_or(if killed { 137 } else { 0 });
                        all_succeeded &= code == 0;
                        let started = status["state"]["running"]["startedAt"].clone();
                        status["ready"] = json!(false);
                        status["started"] = json!(false);
                        status["state"] = json!({"terminated": {"exitCode": code, "reason": exit_reason(code), "startedAt": started, "finishedAt": now}});
                    }
                }
                if let Some(conditions) = updated["status"]["conditions"].as_array_mut() {
                    for condition in conditions
                        .iter_mut()
                        .filter(|c| c["type"] == "Ready" || c["type"] == "ContainersReady")
                    {
                        if condition["status"] != "False" {
                            condition["status"] = json!("False");
                            condition["reason"] = json!("PodCompleted");
                            condition["lastTransitionTime"] = json!(now);
                        }
                    }
                }
                updated["status"]["phase"] =
                    json!(if all_succeeded { "Succeeded" } else { "Failed" });
                Ok(updated)
            })
            .ok()
    }

    /// Whether a just started container counts as ready: a process with a readiness probe
    /// waits for it to pass.
    pub(super) fn ready_at_start(&self, container: &Value) -> bool {
        !(self.runtime.runs(container) && probes::has_readiness_probe(container))
    }

    pub(super) fn start(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        no_delay: bool,
        pod_ip: &str,
    ) {
        self.update_pod(namespace, name, uid, |pod| {
            let now = now_rfc3339();
            let ready = no_delay && containers(pod).all(|c| self.ready_at_start(c));
            let ready_status = if ready { "True" } else { "False" };
            let statuses: Vec<Value> = pod["spec"]["containers"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|c| {
                    let ready = no_delay && self.ready_at_start(c);
                    json!({"name": c["name"], "image": c["image"], "imageID": "", "ready": ready, "started": true, "restartCount": 0, "state": {"running": {"startedAt": now}}})
                })
                .collect();
            pod["status"]["phase"] = json!("Running");
            pod["status"]["startTime"] = json!(now);
            pod["status"]["podIP"] = json!(pod_ip);
            pod["status"]["podIPs"] = json!([{"ip": pod_ip}]);
            pod["status"]["containerStatuses"] = json!(statuses);
            pod["status"]["conditions"] = json!([
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
                {"type": "Initialized", "status": "True", "lastTransitionTime": now},
                {"type": "ContainersReady", "status": ready_status, "lastTransitionTime": now},
                {"type": "Ready", "status": ready_status, "lastTransitionTime": now},
            ]);
        });
    }

    /// The ready-after delay is over, or a container restarted: containers without a readiness
    /// probe to wait for are ready.
    pub(super) fn mark_ready(&self, namespace: &str, name: &str, uid: &str) {
        self.update_readiness(namespace, name, uid, |spec| {
            self.ready_at_start(spec).then_some(true)
        });
    }

    /// Sets what `decide` says (per container spec; `None` leaves it) on running containers,
    /// and the pod's Ready and ContainersReady conditions from all of them.
    pub(super) fn update_readiness(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        decide: impl Fn(&Value) -> Option<bool>,
    ) {
        self.update_pod(namespace, name, uid, |pod| {
            let now = now_rfc3339();
            let specs: Vec<Value> = containers(pod).cloned().collect();
            let mut all_ready = true;
            if let Some(statuses) = pod["status"]["containerStatuses"].as_array_mut() {
                for status in statuses {
                    let running = status["state"]["running"].is_object();
                    let spec = specs.iter().find(|c| c["name"] == status["name"]);
                    if let Some(ready) = spec.and_then(&decide) {
                        status["ready"] = json!(ready && running);
                    }
                    all_ready &= status["ready"].as_bool() == Some(true);
                }
            }
            let (wanted, reason) = if all_ready {
                ("True", None)
            } else {
                ("False", Some("ContainersNotReady"))
            };
            if let Some(conditions) = pod["status"]["conditions"].as_array_mut() {
                for condition in conditions
                    .iter_mut()
                    .filter(|c| c["type"] == "Ready" || c["type"] == "ContainersReady")
                {
                    if condition["status"] != wanted {
                        condition["status"] = json!(wanted);
                        condition["lastTransitionTime"] = json!(now);
                        match reason {
                            Some(reason) => condition["reason"] = json!(reason),
                            None => {
                                condition.as_object_mut().map(|c| c.remove("reason"));
                            }
                        }
                    }
                }
            }
        });
    }

    /// The pod a process belongs to (processes know their pod by UID only).
    pub(super) fn pod_by_uid(&self, uid: &str) -> Option<Arc<Value>> {
        let pods = self.store.kind("", "pods");
        self.store
            .list(&pods, None, None, 1, &|pod| pod["metadata"]["uid"] == uid)
            .items
            .into_iter()
            .next()
    }
}
