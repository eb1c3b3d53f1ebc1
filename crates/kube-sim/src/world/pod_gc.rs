//! kube-controller-manager's pod garbage collector (pkg/controller/podgc/gc_controller.go). A
//! sweep every period (20 s upstream) reads every pod and node once, then, in upstream's order:
//! 1. `gcTerminated`, when the threshold is above 0: of the finished pods (phase neither
//!    Pending, Running nor Unknown), all but the newest `terminated_threshold` are deleted,
//!    evicted ones first, then the oldest.
//! 2. `gcTerminating` (KEP-2268): pods being deleted on a node that is not Ready and has a taint
//!    with the key `node.kubernetes.io/out-of-service` (any value or effect; tolerations are not
//!    looked at).
//! 3. `gcOrphaned`: pods bound to a node name no Node has. A name is first quarantined (40 s
//!    upstream), in case the node is still on its way to the caches; a sweep after the quarantine
//!    that still finds no such Node, on a fresh read, deletes the pods bound to it, each marked
//!    with the `DisruptionTarget` condition `DeletionByPodGC`.
//! 4. `gcUnscheduledTerminating`: pods being deleted that were never bound to a node.
//!
//! Every deletion is `markFailedAndDeletePod`: a pod not yet finished is first marked Failed
//! (and given the condition) by a status write that carries its UID, so a namesake made since
//! is left alone, then deleted with grace 0. The sweep does not wait for changes: it reads the
//! state when its timer fires.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::conditions::{is_finished, is_out_of_service, is_ready, set_condition};
use crate::store::timestamps::now_rfc3339;
use crate::store::{DeleteOptions, Part, Preconditions, Store};

/// The collector's timings and its one flag.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// How often a sweep runs (`gcCheckPeriod`, 20 s).
    pub period: Duration,
    /// How long a missing node's name waits before its pods count as orphaned
    /// (`quarantineTime`, 40 s).
    pub quarantine: Duration,
    /// `--terminated-pod-gc-threshold` (12,500 by default); 0 turns `gcTerminated` off.
    pub terminated_threshold: usize,
}

pub async fn run(store: Store, settings: Settings, stop: CancellationToken) {
    let mut collector = PodGc::new(store, settings);
    let mut sweep = tokio::time::interval(settings.period);
    sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // `interval` fires at once; the controller's first sweep comes one period after start.
    sweep.tick().await;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = sweep.tick() => collector.sweep(Instant::now()),
        }
    }
}

pub struct PodGc {
    store: Store,
    settings: Settings,
    /// The names of missing nodes, each with the time its quarantine ends (upstream's delaying
    /// `nodeQueue`: seeing a name again does not move its time).
    quarantined: HashMap<String, Instant>,
}

impl PodGc {
    pub fn new(store: Store, settings: Settings) -> Self {
        Self {
            store,
            settings,
            quarantined: HashMap::new(),
        }
    }

    pub fn sweep(&mut self, now: Instant) {
        let pods = self.store.all(&self.store.kind("", "pods"));
        let nodes: HashMap<String, Arc<Value>> = self
            .store
            .all(&self.store.kind("", "nodes"))
            .into_iter()
            .map(|node| (text(&node["metadata"]["name"]).to_owned(), node))
            .collect();
        if self.settings.terminated_threshold > 0 {
            self.gc_terminated(&pods);
        }
        self.gc_terminating(&pods, &nodes);
        self.gc_orphaned(&pods, &nodes, now);
        self.gc_unscheduled_terminating(&pods);
    }

    fn gc_terminated(&self, pods: &[Arc<Value>]) {
        let mut terminated: Vec<&Arc<Value>> =
            pods.iter().filter(|pod| is_terminated(pod)).collect();
        let Some(excess) = terminated
            .len()
            .checked_sub(self.settings.terminated_threshold)
            .filter(|excess| *excess > 0)
        else {
            return;
        };
        terminated.sort_by(|a, b| {
            is_evicted(b)
                .cmp(&is_evicted(a))
                .then_with(|| created(a).cmp(created(b)))
                .then_with(|| text(&a["metadata"]["name"]).cmp(text(&b["metadata"]["name"])))
        });
        for pod in terminated.into_iter().take(excess) {
            self.mark_failed_and_delete(pod, None);
        }
    }

    fn gc_terminating(&self, pods: &[Arc<Value>], nodes: &HashMap<String, Arc<Value>>) {
        for pod in pods.iter().filter(|pod| is_terminating(pod)) {
            let on_out_of_service_node = nodes
                .get(text(&pod["spec"]["nodeName"]))
                .is_some_and(|node| out_of_service(node));
            if on_out_of_service_node {
                self.mark_failed_and_delete(pod, None);
            }
        }
    }

    fn gc_orphaned(
        &mut self,
        pods: &[Arc<Value>],
        nodes: &HashMap<String, Arc<Value>>,
        now: Instant,
    ) {
        for pod in pods {
            let node = text(&pod["spec"]["nodeName"]);
            if !node.is_empty() && !nodes.contains_key(node) {
                self.quarantined
                    .entry(node.to_owned())
                    .or_insert(now + self.settings.quarantine);
            }
        }
        let deleted = self.discover_deleted_nodes(nodes, now);
        if deleted.is_empty() {
            return;
        }
        let condition = json!({
            "type": "DisruptionTarget",
            "status": "True",
            "reason": "DeletionByPodGC",
            "message": "PodGC: node no longer exists",
        });
        for pod in pods {
            if deleted.contains(text(&pod["spec"]["nodeName"])) {
                self.mark_failed_and_delete(pod, Some(&condition));
            }
        }
    }

    /// The names whose quarantine ended and that still name no Node, on a fresh read; every name
    /// whose quarantine ended leaves the queue (seen missing again, it starts a new one).
    fn discover_deleted_nodes(
        &mut self,
        nodes: &HashMap<String, Arc<Value>>,
        now: Instant,
    ) -> HashSet<String> {
        let node_kind = self.store.kind("", "nodes");
        let mut deleted = HashSet::new();
        self.quarantined.retain(|name, ends| {
            if *ends > now {
                return true;
            }
            if !nodes.contains_key(name) && self.store.get(&node_kind, None, name).is_err() {
                deleted.insert(name.clone());
            }
            false
        });
        deleted
    }

    fn gc_unscheduled_terminating(&self, pods: &[Arc<Value>]) {
        for pod in pods {
            if is_terminating(pod) && text(&pod["spec"]["nodeName"]).is_empty() {
                self.mark_failed_and_delete(pod, None);
            }
        }
    }

    /// `markFailedAndDeletePodWithCondition`: the status write carries the pod's UID (as
    /// `PatchPodStatus` does), and a refused one deletes nothing; the delete, by name with grace
    /// 0, carries no precondition upstream either.
    fn mark_failed_and_delete(&self, pod: &Value, condition: Option<&Value>) {
        let pods = self.store.kind("", "pods");
        let namespace = pod["metadata"]["namespace"].as_str();
        let name = text(&pod["metadata"]["name"]);
        // A pod already finished is not marked again.
        if !is_finished(pod) {
            let judged = Preconditions {
                uid: pod["metadata"]["uid"].as_str().map(str::to_owned),
                resource_version: None,
            };
            let marked = self
                .store
                .update(&pods, namespace, name, Part::Status, |current| {
                    judged.check(&pods, name, current)?;
                    let mut failed = current.clone();
                    failed["status"]["phase"] = json!("Failed");
                    if let Some(condition) = condition {
                        set_condition(&mut failed, condition.clone(), &now_rfc3339());
                    }
                    Ok(failed)
                });
            if marked.is_err() {
                return;
            }
        }
        let _ = self
            .store
            .delete(&pods, namespace, name, &DeleteOptions::immediate());
    }
}

fn text(value: &Value) -> &str {
    value.as_str().unwrap_or_default()
}

fn is_terminating(pod: &Value) -> bool {
    pod["metadata"]["deletionTimestamp"].is_string()
}

/// `isPodTerminated`: any phase but Pending, Running and Unknown (an empty one included).
fn is_terminated(pod: &Value) -> bool {
    !matches!(
        pod["status"]["phase"].as_str(),
        Some("Pending" | "Running" | "Unknown")
    )
}

/// The kubelet's `PodIsEvicted`.
fn is_evicted(pod: &Value) -> bool {
    pod["status"]["phase"] == "Failed" && pod["status"]["reason"] == "Evicted"
}

/// RFC 3339 in UTC with whole seconds, as the store writes it: ordered as text.
fn created(pod: &Value) -> &str {
    text(&pod["metadata"]["creationTimestamp"])
}

fn out_of_service(node: &Value) -> bool {
    !is_ready(node) && is_out_of_service(node)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conditions::OUT_OF_SERVICE_TAINT;
    use crate::resources::Registry;

    #[test]
    fn only_not_ready_nodes_with_the_taint_key_qualify() {
        let node = |ready: &str, taints: Value| json!({"spec": {"taints": taints}, "status": {"conditions": [{"type": "Ready", "status": ready}]}});
        let tainted = json!([{"key": OUT_OF_SERVICE_TAINT, "value": "x", "effect": "NoSchedule"}]);
        assert!(out_of_service(&node("False", tainted.clone())));
        assert!(out_of_service(&node("Unknown", tainted.clone())));
        assert!(!out_of_service(&node("True", tainted)));
        assert!(!out_of_service(&node(
            "False",
            json!([{"key": "other", "effect": "NoExecute"}])
        )));
    }

    fn settings(terminated_threshold: usize) -> Settings {
        Settings {
            period: Duration::from_secs(20),
            quarantine: Duration::from_secs(40),
            terminated_threshold,
        }
    }

    fn pod(store: &Store, name: &str, node: &str, phase: &str) -> Arc<Value> {
        let pods = store.kind("", "pods");
        let created = store
            .create(
                &pods,
                Some("default"),
                json!({"metadata": {"name": name}, "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]}}),
            )
            .unwrap();
        store
            .update(&pods, Some("default"), name, Part::Status, |current| {
                let mut updated = current.clone();
                updated["status"]["phase"] = json!(phase);
                Ok(updated)
            })
            .unwrap_or(created)
    }

    fn names(store: &Store) -> Vec<String> {
        let mut names: Vec<String> = store
            .all(&store.kind("", "pods"))
            .iter()
            .map(|pod| text(&pod["metadata"]["name"]).to_owned())
            .collect();
        names.sort();
        names
    }

    /// The quarantine runs from the first sweep that finds the name missing; seeing it again
    /// does not move it, and a sweep after it deletes the pods bound to it, marked.
    #[test]
    fn orphans_go_after_the_quarantine_counted_from_the_first_sighting() {
        let store = Store::new(Registry::default(), 100);
        pod(&store, "orphan", "gone", "Running");
        let mut collector = PodGc::new(store.clone(), settings(0));
        let start = Instant::now();
        collector.sweep(start);
        collector.sweep(start + Duration::from_secs(20));
        collector.sweep(start + Duration::from_secs(39));
        assert_eq!(names(&store), ["orphan"]);
        pod(&store, "later", "gone", "Running");
        collector.sweep(start + Duration::from_secs(40));
        assert!(names(&store).is_empty(), "{:?}", names(&store));
    }

    /// A node that came back during the quarantine keeps its pods; missing again, its name
    /// starts a new quarantine.
    #[test]
    fn a_node_back_within_the_quarantine_keeps_its_pods() {
        let store = Store::new(Registry::default(), 100);
        let nodes = store.kind("", "nodes");
        pod(&store, "bound", "flaky", "Running");
        let mut collector = PodGc::new(store.clone(), settings(0));
        let start = Instant::now();
        collector.sweep(start);
        store
            .create(&nodes, None, json!({"metadata": {"name": "flaky"}}))
            .unwrap();
        collector.sweep(start + Duration::from_secs(40));
        store
            .delete(&nodes, None, "flaky", &DeleteOptions::default())
            .unwrap();
        collector.sweep(start + Duration::from_secs(60));
        collector.sweep(start + Duration::from_secs(80));
        assert_eq!(names(&store), ["bound"]);
        collector.sweep(start + Duration::from_secs(100));
        assert!(names(&store).is_empty());
    }

    /// The oldest finished pods beyond the threshold go, evicted ones first; running ones stay.
    #[test]
    fn finished_pods_beyond_the_threshold_go_evicted_then_oldest_first() {
        let store = Store::new(Registry::default(), 100);
        let pods = store.kind("", "pods");
        for name in ["done-a", "done-b", "done-c"] {
            pod(&store, name, "", "Succeeded");
        }
        pod(&store, "evicted", "", "Failed");
        store
            .update(&pods, Some("default"), "evicted", Part::Status, |current| {
                let mut updated = current.clone();
                updated["status"]["reason"] = json!("Evicted");
                Ok(updated)
            })
            .unwrap();
        pod(&store, "running", "", "Running");
        PodGc::new(store.clone(), settings(2)).sweep(Instant::now());
        // Created in the same second: the names break the tie.
        assert_eq!(names(&store), ["done-b", "done-c", "running"]);
    }

    /// A pod listed by the sweep and replaced since by a namesake: the status write carries the
    /// listed pod's UID, is refused, and nothing is deleted.
    #[test]
    fn a_namesake_made_since_the_listing_is_left_alone() {
        let store = Store::new(Registry::default(), 100);
        let pods = store.kind("", "pods");
        let listed = pod(&store, "web", "gone", "Running");
        store
            .delete(&pods, Some("default"), "web", &DeleteOptions::immediate())
            .unwrap();
        let namesake = pod(&store, "web", "gone", "Running");
        let collector = PodGc::new(store.clone(), settings(0));
        collector.mark_failed_and_delete(&listed, None);
        let kept = store.get(&pods, Some("default"), "web").unwrap();
        assert_eq!(kept, namesake);
    }
}
