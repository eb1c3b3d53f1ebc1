//! The default responder `imperative-eviction.k8s.io/evictor` (kube-controller-manager's
//! imperative-eviction-responder, pkg/controller/imperativeevictionresponder at
//! kubernetes/kubernetes 127a4dea): when an Eviction makes it Active, it calls the pod's
//! eviction subresource — PodDisruptionBudgets decide — and reports through its responder
//! status:
//! - refused: `"<pod>" pod deletion via the /eviction subresource failed (attempts=N): <why>`,
//!   tried again after 5 s × 2^(N−1) (at most 10 minutes, at least the server's Retry-After);
//! - accepted or already deleting: `… marked for deletion … terminated gracefully`, its
//!   `expectedCompletionTime` the pod's deletion time;
//! - the pod gone or finished: `completionTime`.
//!
//! It heartbeats at least every 3 minutes upstream; here at least every quarter of the
//! responder heartbeat deadline, so a deadline shortened for tests does not pass it over.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::audit::Audit;
use crate::conditions::is_finished;
use crate::store::lifecycle_validation::IMPERATIVE_EVICTOR;
use crate::store::timestamps::now_rfc3339;
use crate::store::{Change, Part, Store};

/// Whom the audit names for the evictions it makes.
pub const EVICTOR_USER: &str = "system:serviceaccount:kube-system:imperative-eviction-responder";
const FIRST_BACKOFF: Duration = Duration::from_secs(5);
const MAX_BACKOFF: Duration = Duration::from_secs(600);
const HEARTBEAT_MAX: Duration = Duration::from_secs(180);
const FAILED_PREFIX: &str = "pod deletion via the /eviction subresource failed (attempts=";
const EVICTED_BY_US: &str = "pod has been been marked for deletion via the /eviction subresource";

pub fn concerns(change: &Change) -> bool {
    matches!(
        change.collection.as_str(),
        "lifecycle.k8s.io/evictions" | "/pods"
    )
}

/// The last refused eviction of each pod (by UID), for the backoff.
#[derive(Debug, Default)]
pub struct Memory {
    last_refusal: HashMap<String, Instant>,
}

fn text(value: &Value) -> &str {
    value.as_str().unwrap_or_default()
}

/// The attempts a refusal message counts.
fn attempts(message: &str) -> u32 {
    message
        .split_once(FAILED_PREFIX)
        .and_then(|(_, rest)| rest.split_once(')'))
        .and_then(|(count, _)| count.parse().ok())
        .unwrap_or(0)
}

fn backoff(refusals: u32) -> Duration {
    let factor = 2u32.saturating_pow(refusals.saturating_sub(1).min(16));
    FIRST_BACKOFF.saturating_mul(factor).min(MAX_BACKOFF)
}

/// What the evictor reports for one Eviction.
struct Report {
    message: String,
    expected_completion: Option<String>,
    completed: bool,
    again_in: Option<Duration>,
}

pub fn reconcile(
    store: &Store,
    audit: &Audit,
    deadline: Duration,
    memory: &mut Memory,
) -> Option<Duration> {
    let kind = store.kind("lifecycle.k8s.io", "evictions");
    let heartbeat_every = HEARTBEAT_MAX.min(deadline / 4);
    let mut due: Option<Duration> = None;
    let mut pods_seen = HashSet::new();
    for eviction in store.all(&kind) {
        let Some(index) = our_turn(&eviction) else {
            continue;
        };
        let namespace = text(&eviction["metadata"]["namespace"]);
        let target = &eviction["spec"]["target"]["pod"];
        let uid = text(&target["uid"]).to_owned();
        pods_seen.insert(uid.clone());
        let status = &eviction["status"]["responders"][index];
        let last_message = text(&status["message"]);
        let report = respond(store, audit, namespace, target, last_message, memory);
        let beat_due = status["heartbeatTime"]
            .as_str()
            .and_then(|time| time.parse::<jiff::Timestamp>().ok())
            .and_then(|beat| Duration::try_from(jiff::Timestamp::now().duration_since(beat)).ok())
            .is_none_or(|since| since + Duration::from_secs(1) >= heartbeat_every);
        let changed = report.message != last_message
            || report.completed
            || (report.expected_completion.is_some()
                && status["expectedCompletionTime"].as_str()
                    != report.expected_completion.as_deref());
        if beat_due || changed {
            write(store, &eviction, index, &report);
        }
        let again = report
            .again_in
            .unwrap_or(heartbeat_every)
            .min(heartbeat_every);
        if !report.completed {
            due = Some(due.map_or(again, |due| due.min(again)));
        }
    }
    memory.last_refusal.retain(|uid, _| pods_seen.contains(uid));
    due
}

/// The evictor's index when the Eviction wants it now: labelled for it, seen by the
/// evictionrequest-controller, open, the evictor Active and not yet done.
fn our_turn(eviction: &Value) -> Option<usize> {
    let role = text(&eviction["metadata"]["labels"][IMPERATIVE_EVICTOR]);
    if !matches!(role, "responder" | "requester-responder")
        || !eviction["status"]["observedGeneration"].is_i64()
        || super::eviction_requests::is_final(eviction)
    {
        return None;
    }
    let index = eviction["status"]["targetResponders"]
        .as_array()?
        .iter()
        .position(|responder| responder["name"] == IMPERATIVE_EVICTOR)?;
    let status = &eviction["status"]["responders"][index];
    (eviction["status"]["targetResponders"][index]["state"] == "Active"
        && status["name"] == IMPERATIVE_EVICTOR
        && !status["completionTime"].is_string())
    .then_some(index)
}

fn respond(
    store: &Store,
    audit: &Audit,
    namespace: &str,
    target: &Value,
    last_message: &str,
    memory: &mut Memory,
) -> Report {
    let name = text(&target["name"]);
    let uid = text(&target["uid"]);
    let done = |message: String| Report {
        message,
        expected_completion: None,
        completed: true,
        again_in: None,
    };
    let pod = match store.get(&store.kind("", "pods"), Some(namespace), name) {
        Ok(pod) if pod["metadata"]["uid"] == uid => pod,
        _ => {
            return done(format!(
                "\"{name}\" pod has been deleted and fully terminated"
            ));
        }
    };
    let phase = text(&pod["status"]["phase"]);
    let deleting = pod["metadata"]["deletionTimestamp"].as_str();
    match (deleting, is_finished(&pod)) {
        (Some(_), true) => done(format!(
            "\"{name}\" pod has been deleted and fully terminated (pod phase=\"{phase}\")"
        )),
        (None, true) => done(format!(
            "\"{name}\" pod has been fully terminated (pod phase=\"{phase}\")"
        )),
        (Some(at), false) => {
            let via = if last_message.contains(EVICTED_BY_US) {
                " via the /eviction subresource"
            } else {
                ""
            };
            let now = now_rfc3339();
            Report {
                message: format!(
                    "\"{name}\" pod has been been marked for deletion{via} and is being terminated gracefully"
                ),
                expected_completion: Some(if at < now.as_str() {
                    now
                } else {
                    at.to_owned()
                }),
                completed: false,
                again_in: None,
            }
        }
        (None, false) => evict(store, audit, namespace, name, uid, last_message, memory),
    }
}

/// One call of the eviction subresource, unless the last refusal's backoff still runs.
fn evict(
    store: &Store,
    audit: &Audit,
    namespace: &str,
    name: &str,
    uid: &str,
    last_message: &str,
    memory: &mut Memory,
) -> Report {
    let refused = attempts(last_message);
    if let Some(at) = memory.last_refusal.get(uid) {
        let wait = backoff(refused).saturating_sub(at.elapsed());
        if !wait.is_zero() {
            return Report {
                message: last_message.to_owned(),
                expected_completion: None,
                completed: false,
                again_in: Some(wait),
            };
        }
    }
    let request = json!({
        "metadata": {"name": name, "namespace": namespace},
        "deleteOptions": {"preconditions": {"uid": uid}},
    });
    match crate::eviction::evict(store, audit, EVICTOR_USER, namespace, name, &request, false) {
        Ok(()) => {
            memory.last_refusal.remove(uid);
            Report {
                message: format!("\"{name}\" {EVICTED_BY_US} and will be terminated gracefully"),
                expected_completion: None,
                completed: false,
                again_in: Some(Duration::from_millis(100)),
            }
        }
        Err(error) => {
            memory.last_refusal.insert(uid.to_owned(), Instant::now());
            let suggested = Duration::from_secs(error.retry_after_seconds().unwrap_or(0));
            Report {
                message: format!(
                    "\"{name}\" {FAILED_PREFIX}{}): {}",
                    refused + 1,
                    error.message
                ),
                expected_completion: None,
                completed: false,
                again_in: Some(backoff(refused + 1).max(suggested)),
            }
        }
    }
}

fn write(store: &Store, eviction: &Value, index: usize, report: &Report) {
    let kind = store.kind("lifecycle.k8s.io", "evictions");
    let now = now_rfc3339();
    let mut message = report.message.clone();
    message.truncate(4000);
    let _ = store.update(
        &kind,
        eviction["metadata"]["namespace"].as_str(),
        text(&eviction["metadata"]["name"]),
        Part::Status,
        |current| {
            let mut updated = current.clone();
            let entry = &mut updated["status"]["responders"][index];
            if entry["name"] != IMPERATIVE_EVICTOR || entry["completionTime"].is_string() {
                return Ok(current.clone());
            }
            entry["message"] = json!(message);
            entry["heartbeatTime"] = json!(now);
            if let Some(expected) = &report.expected_completion {
                entry["expectedCompletionTime"] = json!(expected);
            }
            if report.completed {
                entry["expectedCompletionTime"] = json!(now);
                entry["completionTime"] = json!(now);
            }
            Ok(updated)
        },
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_counted_in_the_message_and_back_off_to_ten_minutes() {
        let message = format!("\"db-0\" {FAILED_PREFIX}3): Cannot evict pod");
        assert_eq!(attempts(&message), 3);
        assert_eq!(attempts("anything else"), 0);
        assert_eq!(backoff(1), Duration::from_secs(5));
        assert_eq!(backoff(3), Duration::from_secs(20));
        assert_eq!(backoff(30), MAX_BACKOFF);
    }
}
