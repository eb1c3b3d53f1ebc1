//! The evictionrequest-controller of Kubernetes 1.37 (alpha, kube-controller-manager;
//! pkg/controller/evictionrequest at kubernetes/kubernetes 202c97a7, in the 1.37 types' names):
//! - the EvictionRequests naming one pod (by UID) become one `Eviction`, named
//!   `pod-<n>-<pod>`, labelled with each requester and responder, owned by every request (so
//!   the garbage collector removes it once no request is left);
//! - its `targetResponders` are the pod's `spec.evictionResponders` and the default
//!   `imperative-eviction.k8s.io/evictor` at priority 100, by priority, one `Active` at a time;
//! - an Active responder that set `completionTime` is `Completed`; one whose heartbeat (or, before
//!   the first, its start) is older than the deadline is `Interrupted`; the next takes over, and
//!   when none is left the Eviction `Failed` (`NoFurtherResponder`);
//! - with every requester withdrawn (a deleted request counts) the active responder is
//!   `Canceled` and the Eviction `Failed` (`CanceledDueToNoRequesters`);
//! - the target deleted or finished makes it `TargetEvicted` (after a 5 s grace for the active
//!   responder to report its completion);
//! - a final Eviction is never reopened: a request that still wants the pod gets a new one;
//! - each request's status mirrors its Eviction's conditions.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::conditions::is_finished;
use crate::store::lifecycle_validation::{IMPERATIVE_EVICTOR, IMPERATIVE_EVICTOR_PRIORITY};
use crate::store::timestamps::now_rfc3339;
use crate::store::{Change, Part, Store};

/// How long after its target went the active responder may still report completion.
const GRACEFUL_COMPLETION_DELAY: Duration = Duration::from_secs(5);

pub fn concerns(change: &Change) -> bool {
    matches!(
        change.collection.as_str(),
        "lifecycle.k8s.io/evictionrequests" | "lifecycle.k8s.io/evictions" | "/pods"
    )
}

/// When each Eviction's target was first seen gone while its responder had not reported.
#[derive(Debug, Default)]
pub struct Memory {
    gone_since: HashMap<String, Instant>,
}

fn text(value: &Value) -> &str {
    value.as_str().unwrap_or_default()
}

/// (namespace, target pod UID): what requests and Evictions are grouped by.
type TargetKey = (String, String);

/// A target's requests and Evictions.
#[derive(Default)]
struct Named {
    requests: Vec<Arc<Value>>,
    evictions: Vec<Arc<Value>>,
}

fn target_key(object: &Value) -> TargetKey {
    (
        text(&object["metadata"]["namespace"]).to_owned(),
        text(&object["spec"]["target"]["pod"]["uid"]).to_owned(),
    )
}

fn condition_true(object: &Value, kind: &str) -> bool {
    object["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|condition| condition["type"] == kind && condition["status"] == "True")
}

pub fn is_final(eviction: &Value) -> bool {
    condition_true(eviction, "TargetEvicted") || condition_true(eviction, "Failed")
}

/// The `<n>` of `pod-<n>-<pod>`.
fn sequence(eviction: &Value) -> u64 {
    text(&eviction["metadata"]["name"])
        .strip_prefix("pod-")
        .and_then(|rest| rest.split_once('-'))
        .and_then(|(n, _)| n.parse().ok())
        .unwrap_or(0)
}

/// A request's intent, a request being deleted having withdrawn it.
fn wants_eviction(request: &Value) -> bool {
    request["spec"]["intent"] == "Eviction" && !request["metadata"]["deletionTimestamp"].is_string()
}

/// What became of the target pod.
enum Target {
    Live(Arc<Value>),
    Gone,
    Finished(String),
}

impl Target {
    fn of(store: &Store, namespace: &str, name: &str, uid: &str) -> Self {
        match store.get(&store.kind("", "pods"), Some(namespace), name) {
            Ok(pod) if pod["metadata"]["uid"] == uid => {
                if is_finished(&pod) {
                    Self::Finished(text(&pod["status"]["phase"]).to_owned())
                } else {
                    Self::Live(pod)
                }
            }
            _ => Self::Gone,
        }
    }
}

fn condition(kind: &str, status: bool, reason: &str, message: &str) -> Value {
    json!({"type": kind, "status": if status { "True" } else { "False" }, "reason": reason, "message": message})
}

fn awaiting() -> [Value; 2] {
    [
        condition("TargetEvicted", false, "AwaitingEviction", ""),
        condition("Failed", false, "AwaitingEviction", ""),
    ]
}

fn failed(reason: &str, message: &str) -> [Value; 2] {
    [
        condition("Failed", true, reason, message),
        condition("TargetEvicted", false, "EvictionFailed", ""),
    ]
}

fn evicted(reason: &str, message: &str) -> [Value; 2] {
    [
        condition("Failed", false, "Succeeded", ""),
        condition("TargetEvicted", true, reason, message),
    ]
}

/// Sets `conditions` on `object`'s status, each keeping its transition time while its status
/// stays.
fn set_conditions(object: &mut Value, conditions: &[Value], now: &str) {
    for condition in conditions {
        crate::conditions::set_condition(object, condition.clone(), now);
    }
}

/// Among responders of one priority: by domain from its top label down, then by key.
fn domain_order(name: &str) -> (Vec<String>, String) {
    let (domain, key) = name.split_once('/').unwrap_or((name, ""));
    (
        domain.rsplit('.').map(str::to_owned).collect(),
        key.to_owned(),
    )
}

fn target_responders(pod: &Value) -> Vec<(String, i64)> {
    let mut all: Vec<(String, i64)> = pod["spec"]["evictionResponders"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|responder| {
            (
                text(&responder["name"]).to_owned(),
                responder["priority"].as_i64().unwrap_or(0),
            )
        })
        .collect();
    all.push((IMPERATIVE_EVICTOR.to_owned(), IMPERATIVE_EVICTOR_PRIORITY));
    all.sort_by_key(|(name, priority)| (std::cmp::Reverse(*priority), domain_order(name)));
    all
}

/// Everything that passes in one reconciliation, for `run_timed`.
pub fn reconcile(store: &Store, deadline: Duration, memory: &mut Memory) -> Option<Duration> {
    let requests = store.all(&store.kind("lifecycle.k8s.io", "evictionrequests"));
    let evictions = store.all(&store.kind("lifecycle.k8s.io", "evictions"));
    let mut by_target: BTreeMap<TargetKey, Named> = BTreeMap::new();
    for request in requests {
        by_target
            .entry(target_key(&request))
            .or_default()
            .requests
            .push(request);
    }
    for eviction in evictions {
        by_target
            .entry(target_key(&eviction))
            .or_default()
            .evictions
            .push(eviction);
    }
    let live: HashSet<String> = by_target
        .values()
        .flat_map(|named| {
            named
                .evictions
                .iter()
                .map(|e| text(&e["metadata"]["uid"]).to_owned())
        })
        .collect();
    memory.gone_since.retain(|uid, _| live.contains(uid));
    let now = jiff::Timestamp::now();
    let mut due: Option<Duration> = None;
    for (
        (namespace, uid),
        Named {
            requests,
            evictions,
        },
    ) in by_target
    {
        // An Eviction made by hand, with no request, is left alone.
        let Some(first) = requests.first() else {
            continue;
        };
        let name = text(&first["spec"]["target"]["pod"]["name"]).to_owned();
        let target = Target::of(store, &namespace, &name, &uid);
        let pass = Pass {
            store,
            namespace: &namespace,
            requests: &requests,
            target: &target,
            now,
            deadline,
        };
        let soon = pass.reconcile(&name, &evictions, memory);
        due = match (due, soon) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
    due
}

/// One target's requests and what became of its pod.
struct Pass<'a> {
    store: &'a Store,
    namespace: &'a str,
    requests: &'a [Arc<Value>],
    target: &'a Target,
    now: jiff::Timestamp,
    deadline: Duration,
}

impl Pass<'_> {
    fn reconcile(
        &self,
        pod_name: &str,
        evictions: &[Arc<Value>],
        memory: &mut Memory,
    ) -> Option<Duration> {
        let latest = evictions.iter().max_by_key(|eviction| sequence(eviction));
        let mut due = None;
        let mut mirrored = latest.cloned();
        match latest {
            Some(eviction) if !is_final(eviction) => {
                let (updated, soon) = self.progress(eviction, memory);
                due = soon;
                mirrored = updated.or(mirrored);
            }
            _ => {
                if let Target::Live(pod) = self.target
                    && self.requests.iter().any(|request| wants_eviction(request))
                    && let Some(created) = self.open(pod, latest.map_or(0, |e| sequence(e)) + 1)
                {
                    mirrored = Some(created);
                }
            }
        }
        for request in self.requests {
            self.mirror(request, mirrored.as_deref(), pod_name);
        }
        due
    }

    /// A new Eviction for the pod, its status initialised with the first responder Active.
    fn open(&self, pod: &Value, sequence: u64) -> Option<Arc<Value>> {
        let kind = self.store.kind("lifecycle.k8s.io", "evictions");
        let pod_name = text(&pod["metadata"]["name"]);
        let mut name = format!("pod-{sequence}-{pod_name}");
        name.truncate(253);
        let name = name.trim_end_matches(['-', '.']).to_owned();
        let responders = target_responders(pod);
        let labels: serde_json::Map<String, Value> = responders
            .iter()
            .map(|(responder, _)| (responder.clone(), json!("responder")))
            .collect();
        let mut eviction = json!({
            "metadata": {"name": name, "namespace": self.namespace, "labels": labels, "ownerReferences": []},
            "spec": {"target": {"pod": {"name": pod_name, "uid": pod["metadata"]["uid"]}}},
        });
        for request in self.requests {
            join_as_requester(&mut eviction, request);
        }
        let created = self
            .store
            .create(&kind, Some(self.namespace), eviction)
            .ok()?;
        let now = now_rfc3339();
        let status = json!({
            "observedGeneration": created["metadata"]["generation"],
            "requesters": self.requesters(&[]),
            "targetResponders": responders.iter().enumerate().map(|(index, (name, priority))| {
                json!({"name": name, "priority": priority, "state": if index == 0 { "Active" } else { "Inactive" }})
            }).collect::<Vec<_>>(),
            "responders": responders.iter().enumerate().map(|(index, (name, _))| {
                if index == 0 { json!({"name": name, "startTime": now}) } else { json!({"name": name}) }
            }).collect::<Vec<_>>(),
        });
        self.store
            .update(
                &kind,
                Some(self.namespace),
                &name,
                Part::Status,
                |current| {
                    let mut updated = current.clone();
                    updated["status"] = status.clone();
                    set_conditions(&mut updated, &awaiting(), &now);
                    Ok(updated)
                },
            )
            .ok()
    }

    /// `status.requesters`: those already there (never dropped), each with its live intent; a
    /// requester whose requests are all gone has withdrawn.
    fn requesters(&self, known: &[Value]) -> Vec<Value> {
        let mut intents: BTreeMap<String, bool> = known
            .iter()
            .map(|requester| (text(&requester["name"]).to_owned(), false))
            .collect();
        for request in self.requests {
            let wants = intents
                .entry(text(&request["spec"]["requester"]).to_owned())
                .or_default();
            *wants |= wants_eviction(request);
        }
        let order: Vec<String> = known
            .iter()
            .map(|requester| text(&requester["name"]).to_owned())
            .chain(intents.keys().cloned())
            .fold(Vec::new(), |mut seen, name| {
                if !seen.contains(&name) {
                    seen.push(name);
                }
                seen
            });
        order
            .into_iter()
            .map(|name| {
                let intent = if intents[&name] {
                    "Eviction"
                } else {
                    "Withdrawn"
                };
                json!({"name": name, "intent": intent})
            })
            .collect()
    }

    /// Moves an open Eviction along; returns it as written and when time alone will next
    /// change it.
    fn progress(
        &self,
        eviction: &Value,
        memory: &mut Memory,
    ) -> (Option<Arc<Value>>, Option<Duration>) {
        let kind = self.store.kind("lifecycle.k8s.io", "evictions");
        let name = text(&eviction["metadata"]["name"]).to_owned();
        self.adopt(eviction);
        let now = now_rfc3339();
        let mut status = eviction["status"].clone();
        let known = status["requesters"].as_array().cloned().unwrap_or_default();
        status["requesters"] = json!(self.requesters(&known));
        let anyone_wants = status["requesters"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|requester| requester["intent"] == "Eviction");
        let active = status["targetResponders"]
            .as_array()
            .and_then(|states| states.iter().position(|state| state["state"] == "Active"));
        let mut due = None;
        let eviction_uid = text(&eviction["metadata"]["uid"]).to_owned();
        let conditions = match self.target {
            Target::Gone | Target::Finished(_) => {
                if let Some(index) = active {
                    let completed = status["responders"][index]["completionTime"].is_string();
                    let since = *memory
                        .gone_since
                        .entry(eviction_uid)
                        .or_insert_with(Instant::now);
                    let waited = since.elapsed();
                    if !completed && waited < GRACEFUL_COMPLETION_DELAY {
                        return (None, Some(GRACEFUL_COMPLETION_DELAY.saturating_sub(waited)));
                    }
                    status["targetResponders"][index]["state"] = json!(if completed {
                        "Completed"
                    } else {
                        "Interrupted"
                    });
                }
                match self.target {
                    Target::Finished(phase) => evicted(
                        "PodTerminal",
                        &format!("Pod has reached terminal state (phase={phase})"),
                    ),
                    _ => evicted("PodDeleted", "Target pod has been deleted"),
                }
            }
            Target::Live(_) if !anyone_wants => {
                if let Some(index) = active {
                    status["targetResponders"][index]["state"] = json!("Canceled");
                }
                failed("CanceledDueToNoRequesters", "No active requesters")
            }
            Target::Live(_) => {
                let (next, soon) = self.advance(&mut status, active, &now);
                due = soon;
                if next {
                    awaiting()
                } else {
                    failed(
                        "NoFurtherResponder",
                        "every responder completed without evicting the target or was interrupted",
                    )
                }
            }
        };
        status["observedGeneration"] = eviction["metadata"]["generation"].clone();
        let written = self
            .store
            .update(
                &kind,
                Some(self.namespace),
                &name,
                Part::Status,
                |current| {
                    let mut updated = current.clone();
                    let kept = updated["status"]["conditions"].take();
                    updated["status"] = status.clone();
                    updated["status"]["conditions"] = kept;
                    set_conditions(&mut updated, &conditions, &now);
                    Ok(updated)
                },
            )
            .ok();
        (written, due)
    }

    /// Hands the eviction on from an Active responder that completed or went silent. Returns
    /// whether a responder is (still) active, and when the active one's heartbeat runs out.
    fn advance(
        &self,
        status: &mut Value,
        active: Option<usize>,
        now: &str,
    ) -> (bool, Option<Duration>) {
        let count = status["targetResponders"].as_array().map_or(0, Vec::len);
        let Some(index) = active else {
            return (false, None);
        };
        let entry = &status["responders"][index];
        if entry["completionTime"].is_string() {
            status["targetResponders"][index]["state"] = json!("Completed");
        } else {
            let last = entry["heartbeatTime"]
                .as_str()
                .or_else(|| entry["startTime"].as_str())
                .and_then(|time| time.parse::<jiff::Timestamp>().ok())
                .unwrap_or(self.now);
            let silent = Duration::try_from(self.now.duration_since(last)).unwrap_or_default();
            if silent < self.deadline {
                return (true, Some(self.deadline.saturating_sub(silent)));
            }
            status["targetResponders"][index]["state"] = json!("Interrupted");
        }
        let next = index + 1;
        if next >= count {
            return (false, None);
        }
        status["targetResponders"][next]["state"] = json!("Active");
        status["responders"][next]["startTime"] = json!(now);
        (true, Some(self.deadline))
    }

    /// Labels a request that joined after the Eviction opened as a requester, and makes the
    /// Eviction its dependent.
    fn adopt(&self, eviction: &Value) {
        let missing: Vec<&Arc<Value>> = self
            .requests
            .iter()
            .filter(|request| {
                !eviction["metadata"]["ownerReferences"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|owner| owner["uid"] == request["metadata"]["uid"])
            })
            .collect();
        if missing.is_empty() {
            return;
        }
        let kind = self.store.kind("lifecycle.k8s.io", "evictions");
        let _ = self.store.update(
            &kind,
            Some(self.namespace),
            text(&eviction["metadata"]["name"]),
            Part::Main,
            |current| {
                let mut updated = current.clone();
                for request in &missing {
                    join_as_requester(&mut updated, request);
                }
                Ok(updated)
            },
        );
    }

    /// A request's status: its Eviction's conditions, or why it can have none.
    fn mirror(&self, request: &Value, eviction: Option<&Value>, pod_name: &str) {
        let observed = request["status"]["observedGeneration"].is_i64();
        let conditions: Vec<Value> = match (eviction, self.target) {
            (Some(eviction), _) => eviction["status"]["conditions"]
                .as_array()
                .cloned()
                .unwrap_or_default(),
            (None, Target::Gone) if !observed => {
                let why = if request["spec"]["target"]["pod"]["name"] == pod_name {
                    format!(
                        "pod {}/{pod_name} not found or UID mismatch",
                        self.namespace
                    )
                } else {
                    "the target pod was not found".to_owned()
                };
                failed("EvictionInvalid", &why).to_vec()
            }
            (None, Target::Gone) => evicted("PodDeleted", "Target pod has been deleted").to_vec(),
            (None, Target::Finished(phase)) => evicted(
                "PodTerminal",
                &format!("Pod has reached terminal state (phase={phase})"),
            )
            .to_vec(),
            (None, Target::Live(_)) => Vec::new(),
        };
        let kind = self.store.kind("lifecycle.k8s.io", "evictionrequests");
        let now = now_rfc3339();
        let _ = self.store.update(
            &kind,
            Some(self.namespace),
            text(&request["metadata"]["name"]),
            Part::Status,
            |current| {
                let mut updated = current.clone();
                updated["status"]["observedGeneration"] = current["metadata"]["generation"].clone();
                for condition in &conditions {
                    let mut condition = condition.clone();
                    if let Some(map) = condition.as_object_mut() {
                        map.remove("lastTransitionTime");
                    }
                    crate::conditions::set_condition(&mut updated, condition, &now);
                }
                Ok(updated)
            },
        );
    }
}

fn owner_reference(request: &Value) -> Value {
    json!({
        "apiVersion": "lifecycle.k8s.io/v1alpha1",
        "kind": "EvictionRequest",
        "name": request["metadata"]["name"],
        "uid": request["metadata"]["uid"],
    })
}

/// Labels `eviction` with the request's requester (`requester`, or `requester-responder` where
/// it responds too) and makes the Eviction the request's dependent.
fn join_as_requester(eviction: &mut Value, request: &Value) {
    let requester = text(&request["spec"]["requester"]);
    let labels = &mut eviction["metadata"]["labels"];
    let role = match labels[requester].as_str() {
        Some("responder" | "requester-responder") => "requester-responder",
        _ => "requester",
    };
    labels[requester] = json!(role);
    let owners = &mut eviction["metadata"]["ownerReferences"];
    if !owners.is_array() {
        *owners = json!([]);
    }
    if let Some(owners) = owners.as_array_mut() {
        owners.push(owner_reference(request));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn responders_go_by_priority_then_by_domain_from_the_top_label() {
        let pod = json!({"spec": {"evictionResponders": [
            {"name": "b.example.com/bar", "priority": 1000},
            {"name": "a.example.com/foo", "priority": 1001},
            {"name": "z.example.org/x", "priority": 1000},
            {"name": "a.example.org/y", "priority": 1000},
        ]}});
        let order: Vec<String> = target_responders(&pod)
            .into_iter()
            .map(|(name, _)| name)
            .collect();
        assert_eq!(
            order,
            [
                "a.example.com/foo",
                "b.example.com/bar",
                "a.example.org/y",
                "z.example.org/x",
                IMPERATIVE_EVICTOR
            ]
        );
    }

    #[test]
    fn evictions_are_numbered_per_pod() {
        assert_eq!(sequence(&json!({"metadata": {"name": "pod-12-db-0"}})), 12);
        assert_eq!(sequence(&json!({"metadata": {"name": "by-hand"}})), 0);
    }
}
