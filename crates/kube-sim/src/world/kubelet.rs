//! The simulated kubelets, one per node, driven by the store's change feed: pods bound to a
//! node with a running kubelet start (Running, then Ready after `ready-after-seconds`); a pod
//! being deleted stops after min(`stop-seconds`, its grace period): its containers end
//! (exit 0 within the grace, 137 when killed at its end), the pod turns Succeeded or Failed and
//! unready, its volumes are unmounted, and it is deleted with grace 0 (finalizers, if any, then
//! hold it), as the real kubelet finishes a graceful deletion. Each kubelet reports the volumes
//! its pods mount in `node.status.volumesInUse` and records the usual pod events.
//! A node annotated `sim.nodegrace.io/kubelet: stopped` gets none of that: its pods stay
//! Terminating and its volumes mounted forever, which is the non-graceful shutdown case.
//! `booting` is a machine just powered on: its kubelet renews its Lease and reports Ready
//! before it starts any pod, then drops the annotation. `partitioned` is a kubelet cut off
//! from the API server: its containers keep running, but it
//! writes nothing (no Lease renewal, no pod status, no finished deletion) until the annotation
//! goes. `sim.nodegrace.io/clock-skew-seconds: "-30"` makes its Lease `renewTime` run that far
//! off the true time, as a node with a wrong clock writes it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use nix::sys::signal::Signal;
use serde_json::{Value, json};
use tokio::sync::broadcast::error::RecvError;
use tokio_util::sync::CancellationToken;
use tokio_util::time::{DelayQueue, delay_queue};

use super::launch::{self, InCluster};
use super::probes;
use super::runtime::{Exit, Logs, Runtime};
use super::{
    CLOCK_SKEW_ANNOTATION, KUBELET_ANNOTATION, READY_AFTER_ANNOTATION, STOP_SECONDS_ANNOTATION,
    WorldOptions,
};
use crate::store::strategy::now_rfc3339;
use crate::store::{DeleteOptions, Part, Preconditions, Store};

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Action {
    /// Mark the pod Ready.
    Ready {
        namespace: String,
        name: String,
        uid: String,
    },
    /// The containers have exited (or were killed at the end of the grace): finish the pod.
    Stopped {
        namespace: String,
        name: String,
        uid: String,
        killed: bool,
    },
    /// A container process's back-off is over: run it again.
    Restart {
        namespace: String,
        name: String,
        uid: String,
        container: String,
    },
    /// A pod's volumes could not be set up: try starting it again.
    Retry {
        namespace: String,
        name: String,
        uid: String,
    },
    /// Renew every running kubelet's node lease.
    RenewLeases,
}

struct Kubelets {
    store: Store,
    options: WorldOptions,
    timers: DelayQueue<Action>,
    /// Pending stops by pod UID, with the moment they fire, so a shorter grace can move them.
    stops: HashMap<String, (delay_queue::Key, tokio::time::Instant)>,
    runtime: Runtime,
    /// Exit codes of container processes, by pod UID and container, for the pod's final status.
    exit_codes: HashMap<(String, String), i32>,
    in_cluster: InCluster,
    /// The probes of running container processes, by pod UID and container.
    probing: HashMap<(String, String), CancellationToken>,
    probe_outcomes: tokio::sync::mpsc::UnboundedSender<probes::Outcome>,
    pod_addresses: PodAddresses,
    /// The addresses given to pods whose containers run as processes, by pod UID.
    pod_ips: HashMap<String, String>,
    /// Pods waiting to try setting up their containers again.
    retrying: std::collections::HashSet<String>,
}

/// Pod IPs for pods whose containers run as processes: each its own loopback address, from a
/// /16 of 127.0.0.0/8 picked at random, so that several simulators on one host rarely share
/// one.
struct PodAddresses {
    base: [u8; 2],
    next: u32,
}

impl PodAddresses {
    fn new() -> Self {
        Self {
            base: [rand::random_range(64..100), rand::random_range(0..=255)],
            next: 0,
        }
    }

    fn allocate(&mut self) -> String {
        let index = self.next % (254 * 256);
        self.next += 1;
        let [a, b] = self.base;
        let third = b.wrapping_add(u8::try_from(index / 254).unwrap_or(0));
        let fourth = index % 254 + 1;
        format!("127.{a}.{third}.{fourth}")
    }
}

/// Whether the node's kubelet runs and reaches the API server.
fn reporting(node: &Value) -> bool {
    !matches!(
        node["metadata"]["annotations"][KUBELET_ANNOTATION].as_str(),
        Some("stopped" | "partitioned" | "booting")
    )
}

/// The time on the node's own clock: the true time moved by its `clock-skew-seconds`.
fn node_clock(node: &Value) -> jiff::Timestamp {
    let now = jiff::Timestamp::now();
    let skew = node["metadata"]["annotations"][CLOCK_SKEW_ANNOTATION]
        .as_str()
        .and_then(|seconds| seconds.parse::<f64>().ok())
        .filter(|seconds| seconds.is_finite())
        .and_then(|seconds| jiff::SignedDuration::try_from_secs_f64(seconds).ok())
        .unwrap_or_default();
    now.checked_add(skew).unwrap_or(now)
}

fn seconds_annotation(object: &Value, annotation: &str) -> Duration {
    object["metadata"]["annotations"][annotation]
        .as_str()
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|v| v.is_finite() && *v > 0.0)
        .map_or(Duration::ZERO, Duration::from_secs_f64)
}

fn text(value: &Value) -> String {
    value.as_str().unwrap_or_default().to_owned()
}

fn terminal(pod: &Value) -> bool {
    matches!(
        pod["status"]["phase"].as_str(),
        Some("Succeeded" | "Failed")
    )
}

/// The reason a runtime gives a terminated container.
fn exit_reason(code: i32) -> &'static str {
    if code == 0 { "Completed" } else { "Error" }
}

fn container_names(pod: &Value) -> Vec<String> {
    pod["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| text(&c["name"]))
        .collect()
}

fn containers(pod: &Value) -> impl Iterator<Item = &Value> {
    pod["spec"]["containers"].as_array().into_iter().flatten()
}

/// The kubelet's crash-loop back-off: 10 s doubling per restart, at most 5 minutes.
fn restart_backoff(restarts: u32) -> Duration {
    Duration::from_secs(10)
        .saturating_mul(2u32.saturating_pow(restarts))
        .min(Duration::from_secs(300))
}

pub async fn run(
    store: Store,
    options: WorldOptions,
    logs: Logs,
    in_cluster: InCluster,
    stop: CancellationToken,
) {
    let Ok(subscription) = store.subscribe(0) else {
        return;
    };
    let (runtime, mut exits) = Runtime::new(
        options.run_images.clone(),
        options.container_init.clone(),
        logs,
    );
    let (probe_outcomes, mut outcomes) = tokio::sync::mpsc::unbounded_channel();
    let mut kubelets = Kubelets {
        store: store.clone(),
        options,
        timers: DelayQueue::new(),
        stops: HashMap::new(),
        runtime,
        exit_codes: HashMap::new(),
        in_cluster,
        probing: HashMap::new(),
        probe_outcomes,
        pod_addresses: PodAddresses::new(),
        pod_ips: HashMap::new(),
        retrying: std::collections::HashSet::new(),
    };
    kubelets.timers.insert(Action::RenewLeases, Duration::ZERO);
    for pod in store.all(&store.kind("", "pods")) {
        kubelets.pod_changed(&pod);
    }
    let mut live = subscription.live;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            Some(expired) = kubelets.timers.next() => kubelets.act(expired.into_inner()),
            Some(exit) = exits.recv() => kubelets.container_exited(exit),
            Some(outcome) = outcomes.recv() => kubelets.probed(&outcome),
            received = live.recv() => match received {
                Ok(change) if change.collection == "/pods" && change.kind == crate::store::ChangeKind::Deleted => kubelets.pod_gone(&change.object),
                Ok(change) if change.collection == "/pods" => kubelets.pod_changed(&change.object),
                Ok(change) if change.collection == "/nodes" && change.kind != crate::store::ChangeKind::Deleted => kubelets.node_changed(&change.object),
                Ok(_) => {}
                // Missed changes: look at every pod again.
                Err(RecvError::Lagged(_)) => {
                    for pod in store.all(&store.kind("", "pods")) {
                        kubelets.pod_changed(&pod);
                    }
                }
                Err(RecvError::Closed) => return,
            },
        }
    }
}

impl Kubelets {
    /// Running and reaching the API server.
    fn kubelet_running(&self, node: &str) -> bool {
        let nodes = self.store.kind("", "nodes");
        self.store
            .get(&nodes, None, node)
            .is_ok_and(|node| reporting(&node))
    }

    fn pod_changed(&mut self, pod: &Arc<Value>) {
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
            if terminal(pod) {
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
    fn volumes_attached(&self, node: &str, pod: &Value) -> bool {
        let claims = super::attach_detach::pod_claims(pod);
        if claims.is_empty() {
            return true;
        }
        let volumes = super::attach_detach::pod_volumes(&self.store, pod);
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
        volumes.iter().all(|volume| {
            let unique = super::attach_detach::unique_volume_name(volume);
            attached
                .iter()
                .any(|entry| entry["name"] == unique.as_str())
        })
    }

    /// A pod object is gone: its processes are killed and its node's kubelet forgets its
    /// volumes.
    fn pod_gone(&mut self, pod: &Arc<Value>) {
        let uid = text(&pod["metadata"]["uid"]);
        self.runtime.signal(&uid, Signal::SIGKILL);
        self.stop_probing(&uid, None);
        self.pod_ips.remove(&uid);
        self.exit_codes.retain(|(pod, _), _| *pod != uid);
        let node = text(&pod["spec"]["nodeName"]);
        if !node.is_empty() && self.kubelet_running(&node) {
            self.sync_volumes_in_use(&node, pod);
        }
    }

    fn record(&self, pod: &Value, container: Option<&str>, reason: &str, message: &str) {
        let node = pod["spec"]["nodeName"].as_str();
        let source = super::events::Source {
            component: "kubelet",
            host: node,
        };
        super::events::record(&self.store, source, pod, container, reason, message);
    }

    /// `node.status.volumesInUse`: the volumes of the node's pods that have not finished. Only
    /// pods with claims can change it, so others skip the work.
    fn sync_volumes_in_use(&self, node: &str, changed: &Value) {
        let has_claims = changed["spec"]["volumes"]
            .as_array()
            .is_some_and(|volumes| {
                volumes
                    .iter()
                    .any(|v| v["persistentVolumeClaim"].is_object())
            });
        if !has_claims {
            return;
        }
        let pods = self.store.kind("", "pods");
        let mut in_use: Vec<String> = self
            .store
            .list(&pods, None, None, 0, &|pod| {
                pod["spec"]["nodeName"] == node && !terminal(pod)
            })
            .items
            .iter()
            .flat_map(|pod| super::attach_detach::pod_volumes(&self.store, pod))
            .map(|volume| super::attach_detach::unique_volume_name(&volume))
            .collect();
        in_use.sort();
        in_use.dedup();
        let nodes = self.store.kind("", "nodes");
        let _ = self
            .store
            .update(&nodes, None, node, Part::Status, |current| {
                let mut updated = current.clone();
                if in_use.is_empty() {
                    updated["status"]
                        .as_object_mut()
                        .map(|status| status.remove("volumesInUse"));
                } else {
                    updated["status"]["volumesInUse"] = json!(in_use);
                }
                Ok(updated)
            });
    }

    /// A stopped kubelet is a machine gone dark: its container processes die with it. A kubelet
    /// coming back picks up the pods it ignored while stopped and, as after a reboot, starts
    /// again the containers of its running pods that have no process.
    fn node_changed(&mut self, node: &Arc<Value>) {
        let name = text(&node["metadata"]["name"]);
        let pods = self.store.kind("", "pods");
        let bound: Vec<Arc<Value>> = self
            .store
            .list(&pods, None, None, 0, &|pod| {
                pod["spec"]["nodeName"] == name.as_str()
            })
            .items;
        match node["metadata"]["annotations"][KUBELET_ANNOTATION].as_str() {
            // Cut off, not dead: its containers run on, unseen.
            Some("partitioned") => {}
            Some("booting") => self.boot(node),
            Some("stopped") => {
                for pod in &bound {
                    let uid = text(&pod["metadata"]["uid"]);
                    self.runtime.signal(&uid, Signal::SIGKILL);
                    self.stop_probing(&uid, None);
                }
            }
            _ => self.node_reporting(bound),
        }
    }

    /// A kubelet reporting (again): it catches up with its pods and, as after a reboot, starts
    /// the containers of its running pods that have no process.
    fn node_reporting(&mut self, bound: Vec<Arc<Value>>) {
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

    fn act(&mut self, action: Action) {
        match action {
            Action::Ready {
                namespace,
                name,
                uid,
            } => self.mark_ready(&namespace, &name, &uid),
            Action::Stopped {
                namespace,
                name,
                uid,
                killed,
            } => {
                self.stops.remove(&uid);
                self.runtime.signal(&uid, Signal::SIGKILL);
                let pods = self.store.kind("", "pods");
                let stopped = self.finish(&namespace, &name, &uid, killed);
                if let Some(pod) = &stopped {
                    self.sync_volumes_in_use(text(&pod["spec"]["nodeName"]).as_str(), pod);
                }
                let options = DeleteOptions {
                    preconditions: Preconditions {
                        uid: Some(uid),
                        resource_version: None,
                    },
                    ..DeleteOptions::immediate()
                };
                // Gone already, or replaced by a namesake: nothing left to stop.
                let _ = self.store.delete(&pods, Some(&namespace), &name, &options);
            }
            Action::Restart {
                namespace,
                name,
                uid,
                container,
            } => self.restart(&namespace, &name, &uid, &container),
            Action::Retry {
                namespace,
                name,
                uid,
            } => {
                self.retrying.remove(&uid);
                let pods = self.store.kind("", "pods");
                if let Ok(pod) = self.store.get(&pods, Some(&namespace), &name)
                    && pod["metadata"]["uid"] == uid.as_str()
                {
                    self.pod_changed(&pod);
                }
            }
            Action::RenewLeases => {
                self.renew_leases();
                self.timers
                    .insert(Action::RenewLeases, self.options.lease_renew_interval);
            }
        }
    }

    fn update_pod(&self, namespace: &str, name: &str, uid: &str, change: impl FnOnce(&mut Value)) {
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
    fn finish(&self, namespace: &str, name: &str, uid: &str, killed: bool) -> Option<Arc<Value>> {
        let pods = self.store.kind("", "pods");
        self.store
            .update(&pods, Some(namespace), name, Part::Status, |current| {
                let mut updated = current.clone();
                if current["metadata"]["uid"] != uid || terminal(current) {
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
    fn ready_at_start(&self, container: &Value) -> bool {
        !(self.runtime.runs(container) && probes::has_readiness_probe(container))
    }

    fn start(&self, namespace: &str, name: &str, uid: &str, no_delay: bool, pod_ip: &str) {
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
    fn mark_ready(&self, namespace: &str, name: &str, uid: &str) {
        self.update_readiness(namespace, name, uid, |spec| {
            self.ready_at_start(spec).then_some(true)
        });
    }

    /// Sets what `decide` says (per container spec; `None` leaves it) on running containers,
    /// and the pod's Ready and ContainersReady conditions from all of them.
    fn update_readiness(
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
    fn pod_by_uid(&self, uid: &str) -> Option<Arc<Value>> {
        let pods = self.store.kind("", "pods");
        self.store
            .list(&pods, None, None, 1, &|pod| pod["metadata"]["uid"] == uid)
            .items
            .into_iter()
            .next()
    }

    /// A probe's result changed: readiness sets the container's ready flag, a failed liveness
    /// probe restarts the container (its process is stopped; the restart policy brings it back).
    fn probed(&mut self, outcome: &probes::Outcome) {
        let Some(pod) = self.pod_by_uid(&outcome.uid) else {
            return;
        };
        let pod = &pod;
        if pod["metadata"]["deletionTimestamp"].is_string() {
            return;
        }
        let (namespace, name) = (
            text(&pod["metadata"]["namespace"]),
            text(&pod["metadata"]["name"]),
        );
        if !outcome.healthy {
            self.record(
                pod,
                Some(&outcome.container),
                "Unhealthy",
                &format!("{} probe failed: {}", outcome.kind.name(), outcome.message),
            );
        }
        match outcome.kind {
            probes::Kind::Readiness => {
                self.update_readiness(&namespace, &name, &outcome.uid, |spec| {
                    (spec["name"] == outcome.container.as_str()).then_some(outcome.healthy)
                });
            }
            probes::Kind::Liveness => {
                self.record(
                    pod,
                    Some(&outcome.container),
                    "Killing",
                    &format!(
                        "Container {} failed liveness probe, will be restarted",
                        outcome.container
                    ),
                );
                self.runtime
                    .signal_container(&outcome.uid, &outcome.container, Signal::SIGTERM);
            }
        }
    }

    /// What each container the runtime runs needs to start, or why it cannot yet.
    fn prepare_all(&self, pod: &Value) -> Result<Vec<(Value, launch::Launch)>, String> {
        containers(pod)
            .filter(|c| self.runtime.runs(c))
            .map(|container| Ok((container.clone(), self.prepare(pod, container)?)))
            .collect()
    }

    fn prepare(&self, pod: &Value, container: &Value) -> Result<launch::Launch, String> {
        let uid = text(&pod["metadata"]["uid"]);
        let (program, args) = self.runtime.command(container)?;
        let node = text(&pod["spec"]["nodeName"]);
        let context = launch::Context {
            store: &self.store,
            in_cluster: &self.in_cluster,
            node_root: self
                .options
                .node_roots
                .as_ref()
                .map(|roots| roots.join(&node)),
            pod_dir: self.runtime.pod_dir(&uid),
        };
        launch::prepare(&context, pod, container, program, args)
    }

    /// Starts one container process, and its probes.
    fn spawn(
        &mut self,
        pod: &Value,
        container: &Value,
        prepared: &launch::Launch,
    ) -> Result<(), String> {
        let uid = text(&pod["metadata"]["uid"]);
        let name = text(&container["name"]);
        self.runtime.start(&uid, &name, prepared)?;
        let stop = CancellationToken::new();
        probes::start(
            container,
            &uid,
            text(&pod["status"]["podIP"]).as_str(),
            self.options.probe_period_max,
            &self.probe_outcomes,
            &stop,
        );
        if let Some(previous) = self.probing.insert((uid, name), stop) {
            previous.cancel();
        }
        Ok(())
    }

    fn stop_probing(&mut self, uid: &str, container: Option<&str>) {
        self.probing.retain(|(pod, name), stop| {
            let ends = pod == uid && container.is_none_or(|c| c == name);
            if ends {
                stop.cancel();
            }
            !ends
        });
    }

    /// Starts the prepared processes of the pod's containers; one that cannot start ends at
    /// once, as a container whose start failed.
    fn start_processes(&mut self, pod: &Value, launches: Vec<(Value, launch::Launch)>) {
        let uid = text(&pod["metadata"]["uid"]);
        for (container, prepared) in launches {
            if let Err(error) = self.spawn(pod, &container, &prepared) {
                let container = text(&container["name"]);
                self.record(pod, Some(&container), "Failed", &format!("Error: {error}"));
                self.container_exited(Exit {
                    uid: uid.clone(),
                    container,
                    code: 128,
                });
            }
        }
    }

    /// A container process ended: a deleting pod finishes once all have; otherwise the
    /// container restarts after a back-off when the pod's restartPolicy says so, and a pod
    /// whose containers have all ended for good turns Succeeded or Failed.
    fn container_exited(&mut self, exit: Exit) {
        self.runtime.exited(&exit);
        self.stop_probing(&exit.uid, Some(&exit.container));
        let Some(pod) = self.pod_by_uid(&exit.uid) else {
            return;
        };
        let pod = &pod;
        let (namespace, name) = (
            text(&pod["metadata"]["namespace"]),
            text(&pod["metadata"]["name"]),
        );
        self.exit_codes
            .insert((exit.uid.clone(), exit.container.clone()), exit.code);
        if !self.kubelet_running(text(&pod["spec"]["nodeName"]).as_str()) {
            // The machine is off: nobody reports, nothing restarts until it is back.
            return;
        }
        if pod["metadata"]["deletionTimestamp"].is_string() {
            if !self.runtime.any_running(&exit.uid)
                && let Some((key, _)) = self.stops.remove(&exit.uid)
            {
                self.timers.remove(&key);
                self.act(Action::Stopped {
                    namespace,
                    name,
                    uid: exit.uid,
                    killed: false,
                });
            }
            return;
        }
        if terminal(pod) {
            return;
        }
        let restart = match pod["spec"]["restartPolicy"].as_str() {
            Some("Never") => false,
            Some("OnFailure") => exit.code != 0,
            _ => true,
        };
        let restarts = pod["status"]["containerStatuses"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|s| s["name"] == exit.container.as_str())
            .and_then(|s| s["restartCount"].as_u64())
            .unwrap_or(0);
        let backoff = restart_backoff(u32::try_from(restarts).unwrap_or(u32::MAX));
        let container = exit.container.clone();
        let code = exit.code;
        self.update_pod(&namespace, &name, &exit.uid, |pod| {
            let now = now_rfc3339();
            let mut all_ended = true;
            let mut all_succeeded = true;
            if let Some(statuses) = pod["status"]["containerStatuses"].as_array_mut() {
                for status in statuses {
                    if status["name"] == container.as_str() {
                        let started = status["state"]["running"]["startedAt"].clone();
                        let terminated = json!({"terminated": {"exitCode": code, "reason": exit_reason(code), "startedAt": started, "finishedAt": now}});
                        status["ready"] = json!(false);
                        status["started"] = json!(false);
                        if restart {
                            status["lastState"] = terminated;
                            status["state"] = json!({"waiting": {"reason": "CrashLoopBackOff", "message": format!("back-off {}s restarting failed container={container}", backoff.as_secs())}});
                        } else {
                            status["state"] = terminated;
                        }
                    }
                    let code = status["state"]["terminated"]["exitCode"].as_i64();
                    all_ended &= code.is_some();
                    all_succeeded &= code == Some(0);
                }
            }
            if let Some(conditions) = pod["status"]["conditions"].as_array_mut() {
                for condition in conditions
                    .iter_mut()
                    .filter(|c| c["type"] == "Ready" || c["type"] == "ContainersReady")
                {
                    if condition["status"] != "False" {
                        condition["status"] = json!("False");
                        condition["reason"] = json!(if all_ended { "PodCompleted" } else { "ContainersNotReady" });
                        condition["lastTransitionTime"] = json!(now);
                    }
                }
            }
            if all_ended {
                pod["status"]["phase"] = json!(if all_succeeded { "Succeeded" } else { "Failed" });
            }
        });
        if restart {
            self.record(
                pod,
                Some(&exit.container),
                "BackOff",
                &format!("Back-off restarting failed container {}", exit.container),
            );
            self.timers.insert(
                Action::Restart {
                    namespace,
                    name,
                    uid: exit.uid,
                    container: exit.container,
                },
                backoff,
            );
        } else if let Ok(pod) =
            self.store
                .get(&self.store.kind("", "pods"), Some(&namespace), &name)
        {
            self.sync_volumes_in_use(text(&pod["spec"]["nodeName"]).as_str(), &pod);
        }
    }

    fn restart(&mut self, namespace: &str, name: &str, uid: &str, container: &str) {
        let pods = self.store.kind("", "pods");
        let Ok(pod) = self.store.get(&pods, Some(namespace), name) else {
            return;
        };
        if pod["metadata"]["uid"] != uid
            || pod["metadata"]["deletionTimestamp"].is_string()
            || self.runtime.is_running(uid, container)
            || !self.kubelet_running(text(&pod["spec"]["nodeName"]).as_str())
        {
            return;
        }
        let Some(spec) = containers(&pod).find(|c| c["name"] == container).cloned() else {
            return;
        };
        let started = self
            .prepare(&pod, &spec)
            .and_then(|prepared| self.spawn(&pod, &spec, &prepared));
        if let Err(error) = started {
            self.record(&pod, Some(container), "Failed", &format!("Error: {error}"));
            self.container_exited(Exit {
                uid: uid.to_owned(),
                container: container.to_owned(),
                code: 128,
            });
            return;
        }
        self.record(
            &pod,
            Some(container),
            "Started",
            &format!("Started container {container}"),
        );
        self.update_pod(namespace, name, uid, |pod| {
            let now = now_rfc3339();
            if let Some(status) = pod["status"]["containerStatuses"]
                .as_array_mut()
                .into_iter()
                .flatten()
                .find(|s| s["name"] == container)
            {
                let restarts = status["restartCount"].as_u64().unwrap_or(0);
                status["restartCount"] = json!(restarts + 1);
                status["started"] = json!(true);
                status["state"] = json!({"running": {"startedAt": now}});
            }
        });
        // A restarted container with a readiness probe is unready until the probe passes again.
        self.update_readiness(namespace, name, uid, |spec| {
            (spec["name"] == container).then(|| self.ready_at_start(spec))
        });
    }

    /// A running kubelet reports its node Ready (a node created bare, or coming back).
    fn post_ready(&self, name: &str, node: &Value) {
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

    fn renew_leases(&self) {
        let nodes = self.store.kind("", "nodes");
        for node in self.store.all(&nodes) {
            if reporting(&node) {
                self.renew_lease(&node);
            }
        }
    }

    /// A booting machine's kubelet reports first — its Lease renewed, the node Ready — and
    /// only then runs pods, as a real kubelet needs the API server before it can start any.
    fn boot(&mut self, node: &Value) {
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

    fn renew_lease(&self, node: &Value) {
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
