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

mod node_status;
mod pods;
mod processes;

use std::collections::HashMap;
use std::time::Duration;

use futures::StreamExt;
use nix::sys::signal::Signal;
use serde_json::Value;
use tokio::sync::broadcast::error::RecvError;
use tokio_util::sync::CancellationToken;
use tokio_util::time::{DelayQueue, delay_queue};

use super::launch::InCluster;
use super::probes;
use super::runtime::{Logs, Runtime};
use super::{CLOCK_SKEW_ANNOTATION, KUBELET_ANNOTATION, WorldOptions};
use crate::store::{DeleteOptions, Preconditions, Store};

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
    /// The volumes each pod's were mounted by (their unique names), by pod UID: the volume
    /// manager's actual state, kept whatever becomes of the PersistentVolumes afterwards.
    mounted: HashMap<String, Vec<String>>,
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
        mounted: HashMap::new(),
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
}
