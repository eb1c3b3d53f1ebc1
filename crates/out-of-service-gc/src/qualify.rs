//! Which nodes are out of service, and which of their pods must go: the KEP's rules as pure
//! functions of the objects.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, Pod, Taint};
use nodegrace_core::k8s::nodes::{Readiness, readiness, taint_with_key};
use nodegrace_core::k8s::pods::is_terminal;
use nodegrace_core::k8s::tolerations::toleration_time;

use crate::api::{EXPECTED_EFFECT, OUT_OF_SERVICE_TAINT};

/// Where a node stands.
#[derive(Debug, Clone, PartialEq)]
pub enum NodeStatus {
    /// No out-of-service taint: nothing to do.
    InService,
    /// Tainted, but its Ready condition is True: nothing is force-deleted from a Ready node.
    TaintedButReady(Taint),
    /// Tainted and Ready is False or Unknown: its pods may be force-deleted.
    OutOfService(Taint),
}

pub fn node_status(node: &Node) -> NodeStatus {
    let Some(taint) = taint_with_key(node, OUT_OF_SERVICE_TAINT) else {
        return NodeStatus::InService;
    };
    match readiness(node) {
        Readiness::Ready => NodeStatus::TaintedButReady(taint.clone()),
        Readiness::NotReady | Readiness::Unknown => NodeStatus::OutOfService(taint.clone()),
    }
}

/// What happens to one pod bound to an out-of-service node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodVerdict {
    /// No toleration matches the taint: force-delete it now.
    ForceDelete,
    /// A toleration with `tolerationSeconds` matches: force-delete it once that has passed
    /// since the taint was added, as the taint manager would evict it then.
    ForceDeleteAt(Timestamp),
    /// Tolerated for good: left alone.
    Tolerated,
    /// Its deletion was already forced and it is marked finished: only finalizers of another
    /// controller keep the object, and no kubelet runs it. Deleting it again changes nothing,
    /// and its volumes may go.
    Released,
}

/// The verdict for `pod` under `taint`, at `now`, the taint counting from `since` (see
/// `TaintClock`). `tolerationSeconds` only applies to a NoExecute taint, as in the API: for
/// other effects a matching toleration tolerates forever.
pub fn pod_verdict(pod: &Pod, taint: &Taint, since: Timestamp, now: Timestamp) -> PodVerdict {
    let tolerations = pod
        .spec
        .as_ref()
        .and_then(|spec| spec.tolerations.as_deref())
        .unwrap_or_default();
    let verdict = match toleration_time(tolerations, taint) {
        None => PodVerdict::ForceDelete,
        Some(None) => PodVerdict::Tolerated,
        Some(Some(_)) if taint.effect != EXPECTED_EFFECT => PodVerdict::Tolerated,
        Some(Some(seconds)) => {
            let until = since.checked_add(seconds).unwrap_or(Timestamp::MAX);
            if until <= now {
                PodVerdict::ForceDelete
            } else {
                PodVerdict::ForceDeleteAt(until)
            }
        }
    };
    if verdict == PodVerdict::ForceDelete && force_deleted(pod) && is_terminal(pod) {
        return PodVerdict::Released;
    }
    verdict
}

/// Whether the pod's deletion was requested with no grace left (by us or anyone).
fn force_deleted(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
        && pod.metadata.deletion_grace_period_seconds == Some(0)
}

/// Since when each node's out-of-service taint counts: its `timeAdded` when it has one (the
/// node lifecycle controller and `--auto-taint-after` write it), else the moment this process
/// first saw that taint on that node (kubectl writes none) — as upstream's taint eviction
/// controller keeps the time it first saw a pod under a taint, so the deadline never moves.
/// After a restart the count starts again from the restart, as upstream's does.
#[derive(Debug, Default)]
pub struct TaintClock {
    first_seen: Mutex<HashMap<String, (TaintSeen, Timestamp)>>,
}

/// A taint as seen on one node object: a changed value or a replaced node counts afresh.
#[derive(Debug, Clone, PartialEq, Eq)]
struct TaintSeen {
    node_uid: Option<String>,
    value: Option<String>,
    effect: String,
}

impl TaintClock {
    pub fn since(&self, node: &Node, taint: &Taint, now: Timestamp) -> Timestamp {
        if let Some(added) = &taint.time_added {
            return added.0;
        }
        let seen = TaintSeen {
            node_uid: node.metadata.uid.clone(),
            value: taint.value.clone(),
            effect: taint.effect.clone(),
        };
        let name = node.metadata.name.clone().unwrap_or_default();
        let mut first_seen = self
            .first_seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match first_seen.get(&name) {
            Some((known, since)) if *known == seen => *since,
            _ => {
                first_seen.insert(name, (seen, now));
                now
            }
        }
    }

    /// The taint is gone from `node` (or the node is): a later one counts afresh.
    pub fn forget(&self, node: &str) {
        self.first_seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(node);
    }
}

/// How long a node has been NotReady (Ready False or Unknown), from the Ready condition's
/// `lastTransitionTime`; `None` when it is Ready or never said when it changed.
pub fn not_ready_for(node: &Node, now: Timestamp) -> Option<Duration> {
    let since = not_ready_since(node)?;
    Some(Duration::try_from(now.duration_since(since)).unwrap_or(Duration::ZERO))
}

/// When the current NotReady period began (the Ready condition's `lastTransitionTime`);
/// `None` when the node is Ready or never said when it changed.
pub fn not_ready_since(node: &Node) -> Option<Timestamp> {
    (readiness(node) != Readiness::Ready)
        .then(|| ready_transition(node))
        .flatten()
}

/// When the node turned Ready (its Ready condition's `lastTransitionTime`), if it is Ready.
pub fn ready_since(node: &Node) -> Option<Timestamp> {
    (readiness(node) == Readiness::Ready)
        .then(|| ready_transition(node))
        .flatten()
}

fn ready_transition(node: &Node) -> Option<Timestamp> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|condition| condition.type_ == "Ready")?
        .last_transition_time
        .as_ref()
        .map(|time| time.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(taints: &serde_json::Value, ready: Option<&str>) -> Node {
        let conditions = ready.map_or(json!([]), |status| {
            json!([{"type": "Ready", "status": status, "lastTransitionTime": "2026-01-01T00:00:00Z"}])
        });
        serde_json::from_value(json!({
            "metadata": {"name": "n"},
            "spec": {"taints": taints},
            "status": {"conditions": conditions},
        }))
        .unwrap()
    }

    #[test]
    fn qualification_table() {
        let taint = |value: Option<&str>, effect: &str| {
            let mut taint = json!({"key": OUT_OF_SERVICE_TAINT, "effect": effect});
            if let Some(value) = value {
                taint["value"] = json!(value);
            }
            json!([taint])
        };
        let taint_variants = [
            (
                "NoExecute with a value",
                taint(Some("nodeshutdown"), "NoExecute"),
            ),
            ("NoExecute without value", taint(None, "NoExecute")),
            ("NoSchedule", taint(Some("x"), "NoSchedule")),
            ("PreferNoSchedule", taint(None, "PreferNoSchedule")),
        ];
        for (name, taints) in &taint_variants {
            for (ready, out_of_service) in [
                (Some("True"), false),
                (Some("False"), true),
                (Some("Unknown"), true),
                (None, true),
            ] {
                let status = node_status(&node(taints, ready));
                match status {
                    NodeStatus::OutOfService(_) => {
                        assert!(out_of_service, "{name}, Ready {ready:?}: {status:?}");
                    }
                    NodeStatus::TaintedButReady(_) => {
                        assert!(!out_of_service, "{name}, Ready {ready:?}: {status:?}");
                    }
                    NodeStatus::InService => panic!("{name}, Ready {ready:?}: lost the taint"),
                }
            }
        }
        let other = json!([{"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}]);
        for ready in [Some("True"), Some("False"), Some("Unknown"), None] {
            assert_eq!(node_status(&node(&other, ready)), NodeStatus::InService);
        }
        assert_eq!(
            node_status(&node(&json!(null), Some("False"))),
            NodeStatus::InService
        );
    }

    fn pod(tolerations: &serde_json::Value) -> Pod {
        serde_json::from_value(json!({"spec": {"containers": [], "tolerations": tolerations}}))
            .unwrap()
    }

    fn taint(value: Option<&str>, effect: &str, added: Option<&str>) -> Taint {
        Taint {
            key: OUT_OF_SERVICE_TAINT.to_owned(),
            value: value.map(str::to_owned),
            effect: effect.to_owned(),
            time_added: added.map(|time| {
                k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(time.parse().unwrap())
            }),
        }
    }

    #[test]
    fn tolerations_decide_which_pods_go() {
        let now: Timestamp = "2026-01-01T00:10:00Z".parse().unwrap();
        let shutdown = taint(
            Some("nodeshutdown"),
            "NoExecute",
            Some("2026-01-01T00:09:00Z"),
        );
        let key = OUT_OF_SERVICE_TAINT;
        let cases = [
            ("no tolerations", json!([]), PodVerdict::ForceDelete),
            (
                "Exists on the key",
                json!([{"key": key, "operator": "Exists"}]),
                PodVerdict::Tolerated,
            ),
            (
                "Exists on everything",
                json!([{"operator": "Exists"}]),
                PodVerdict::Tolerated,
            ),
            (
                "Equal with the value",
                json!([{"key": key, "operator": "Equal", "value": "nodeshutdown"}]),
                PodVerdict::Tolerated,
            ),
            (
                "Equal with another value",
                json!([{"key": key, "operator": "Equal", "value": "hardwarefailure"}]),
                PodVerdict::ForceDelete,
            ),
            (
                "Equal without a value",
                json!([{"key": key, "operator": "Equal"}]),
                PodVerdict::ForceDelete,
            ),
            (
                "effect NoExecute",
                json!([{"key": key, "operator": "Exists", "effect": "NoExecute"}]),
                PodVerdict::Tolerated,
            ),
            (
                "effect NoSchedule only",
                json!([{"key": key, "operator": "Exists", "effect": "NoSchedule"}]),
                PodVerdict::ForceDelete,
            ),
            (
                "other key",
                json!([{"key": "node.kubernetes.io/unreachable", "operator": "Exists"}]),
                PodVerdict::ForceDelete,
            ),
            (
                "tolerationSeconds still running",
                json!([{"key": key, "operator": "Exists", "tolerationSeconds": 300}]),
                PodVerdict::ForceDeleteAt("2026-01-01T00:14:00Z".parse().unwrap()),
            ),
            (
                "tolerationSeconds over",
                json!([{"key": key, "operator": "Exists", "tolerationSeconds": 30}]),
                PodVerdict::ForceDelete,
            ),
            (
                "the shortest matching tolerationSeconds",
                json!([
                    {"key": key, "operator": "Exists", "tolerationSeconds": 3600},
                    {"operator": "Exists", "tolerationSeconds": 120},
                ]),
                PodVerdict::ForceDeleteAt("2026-01-01T00:11:00Z".parse().unwrap()),
            ),
        ];
        let since: Timestamp = "2026-01-01T00:09:00Z".parse().unwrap();
        for (name, tolerations, expected) in cases {
            assert_eq!(
                pod_verdict(&pod(&tolerations), &shutdown, since, now),
                expected,
                "{name}"
            );
        }
    }

    /// A pod whose forced deletion only another controller's finalizer holds up is done with;
    /// one not yet marked failed is deleted (and marked) once more.
    #[test]
    fn a_pod_held_by_a_finalizer_after_its_forced_deletion_is_done_with() {
        let now: Timestamp = "2026-01-01T00:10:00Z".parse().unwrap();
        let since: Timestamp = "2026-01-01T00:09:00Z".parse().unwrap();
        let shutdown = taint(
            Some("nodeshutdown"),
            "NoExecute",
            Some("2026-01-01T00:09:00Z"),
        );
        let key = OUT_OF_SERVICE_TAINT;
        let mut held = pod(&json!([]));
        held.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now));
        held.metadata.deletion_grace_period_seconds = Some(0);
        held.metadata.finalizers = Some(vec!["example.com/hold".to_owned()]);
        assert_eq!(
            pod_verdict(&held, &shutdown, since, now),
            PodVerdict::ForceDelete
        );
        held.status = Some(k8s_openapi::api::core::v1::PodStatus {
            phase: Some("Failed".to_owned()),
            ..Default::default()
        });
        assert_eq!(
            pod_verdict(&held, &shutdown, since, now),
            PodVerdict::Released
        );
        held.metadata.deletion_grace_period_seconds = Some(30);
        assert_eq!(
            pod_verdict(&held, &shutdown, since, now),
            PodVerdict::ForceDelete
        );
        // tolerationSeconds only means something for NoExecute.
        let seconds = json!([{"key": key, "operator": "Exists", "tolerationSeconds": 30}]);
        let no_schedule = taint(None, "NoSchedule", Some("2026-01-01T00:00:00Z"));
        assert_eq!(
            pod_verdict(&pod(&seconds), &no_schedule, since, now),
            PodVerdict::Tolerated
        );
    }

    #[test]
    fn a_taint_without_time_added_counts_from_its_first_sight_until_it_changes() {
        let clock = TaintClock::default();
        let at = |time: &str| -> Timestamp { time.parse().unwrap() };
        let mut down = node(&json!(null), Some("Unknown"));
        down.metadata.uid = Some("u1".into());
        let unstamped = taint(Some("nodeshutdown"), "NoExecute", None);
        let first = at("2026-01-01T00:00:00Z");
        assert_eq!(clock.since(&down, &unstamped, first), first);
        // Every later pass keeps the first sight: the deadline does not move.
        let seconds =
            json!([{"key": OUT_OF_SERVICE_TAINT, "operator": "Exists", "tolerationSeconds": 4}]);
        let later = at("2026-01-01T00:00:03Z");
        let since = clock.since(&down, &unstamped, later);
        assert_eq!(since, first);
        assert_eq!(
            pod_verdict(&pod(&seconds), &unstamped, since, later),
            PodVerdict::ForceDeleteAt(at("2026-01-01T00:00:04Z"))
        );
        let after = at("2026-01-01T00:00:05Z");
        assert_eq!(
            pod_verdict(
                &pod(&seconds),
                &unstamped,
                clock.since(&down, &unstamped, after),
                after
            ),
            PodVerdict::ForceDelete
        );
        // A stamped taint counts from its stamp.
        let stamped = taint(None, "NoExecute", Some("2025-12-31T23:00:00Z"));
        assert_eq!(
            clock.since(&down, &stamped, after),
            at("2025-12-31T23:00:00Z")
        );
        // Another value, a namesake node, or a taint removed and added again: afresh.
        let other = taint(Some("hardwarefailure"), "NoExecute", None);
        assert_eq!(clock.since(&down, &other, after), after);
        let mut namesake = down.clone();
        namesake.metadata.uid = Some("u2".into());
        let again = at("2026-01-01T00:00:06Z");
        assert_eq!(clock.since(&namesake, &other, again), again);
        clock.forget("n");
        let back = at("2026-01-01T00:00:07Z");
        assert_eq!(clock.since(&namesake, &other, back), back);
    }

    #[test]
    fn not_ready_time_counts_from_the_ready_transition() {
        let now: Timestamp = "2026-01-01T00:05:00Z".parse().unwrap();
        let down = node(&json!(null), Some("Unknown"));
        assert_eq!(not_ready_for(&down, now), Some(Duration::from_secs(300)));
        assert_eq!(not_ready_for(&node(&json!(null), Some("True")), now), None);
        assert_eq!(not_ready_for(&node(&json!(null), None), now), None);
        let up = node(&json!(null), Some("True"));
        assert_eq!(
            ready_since(&up),
            Some("2026-01-01T00:00:00Z".parse().unwrap())
        );
        assert_eq!(ready_since(&down), None);
    }
}
