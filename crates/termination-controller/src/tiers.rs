//! Which pods of a draining node are evicted, in which order, and which hold the node.
//!
//! Tiers go one after the other, each once the previous one is gone, so a node's own
//! services (log shippers, CNI, critical add-ons) outlive the workloads that use them:
//! non-critical workloads → non-critical DaemonSet pods → critical workloads → critical
//! DaemonSet pods. Critical = the kubelet's `IsCriticalPod` (system-cluster-critical,
//! system-node-critical, or that priority).

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Pod, Taint};
use nodegrace_core::duration::parse_go_duration;
use nodegrace_core::k8s::pods::{is_critical, is_daemonset_pod, is_mirror_pod, is_terminal};
use nodegrace_core::k8s::tolerations::tolerated;

use crate::api::{DISRUPTED_TAINT, DO_NOT_EVICT, DrainBehavior};
use crate::drain_rules::Applied;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Tier {
    Workload,
    DaemonSet,
    CriticalWorkload,
    CriticalDaemonSet,
}

impl Tier {
    pub const ALL: [Self; 4] = [
        Self::Workload,
        Self::DaemonSet,
        Self::CriticalWorkload,
        Self::CriticalDaemonSet,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Self::Workload => "workloads",
            Self::DaemonSet => "DaemonSet pods",
            Self::CriticalWorkload => "critical workloads",
            Self::CriticalDaemonSet => "critical DaemonSet pods",
        }
    }
}

/// Why a pod is left alone (it neither blocks nor is evicted).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    /// A static pod's API mirror: the kubelet owns it, an eviction would not stop it.
    Mirror,
    /// Succeeded or Failed already.
    Terminal,
    /// It tolerates the disrupted taint, so it would be scheduled right back.
    ToleratesDisruption,
    /// A NodeDrainRule (or the pod's own `nodegrace.io/drain: skip`) says so.
    Rule,
}

/// What the drain does with one pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposition {
    Skip(Skip),
    /// Protected by `nodegrace.io/do-not-evict`: never evicted (`until: None`) or not before
    /// `until`; the node waits.
    DoNotEvict {
        until: Option<Timestamp>,
    },
    /// Never evicted; its tier is not done until it finishes (NodeDrainRule WaitCompleted).
    WaitCompleted(Tier),
    /// Evicted in its tier, after the pods of a lower `order` are gone.
    Evict {
        tier: Tier,
        order: i32,
    },
}

pub fn disrupted_taint() -> Taint {
    Taint {
        key: DISRUPTED_TAINT.to_owned(),
        effect: "NoSchedule".to_owned(),
        value: None,
        time_added: None,
    }
}

/// What the drain does with `pod` at `now`, under the drain rule it follows.
pub fn disposition(pod: &Pod, now: Timestamp, rule: &Applied) -> Disposition {
    if is_mirror_pod(pod) {
        return Disposition::Skip(Skip::Mirror);
    }
    if is_terminal(pod) {
        return Disposition::Skip(Skip::Terminal);
    }
    let tolerations = pod
        .spec
        .as_ref()
        .and_then(|spec| spec.tolerations.as_deref())
        .unwrap_or_default();
    if tolerated(tolerations, &disrupted_taint()) {
        return Disposition::Skip(Skip::ToleratesDisruption);
    }
    if let Some(protection) = do_not_evict(pod) {
        let until = match protection {
            Protection::Always => Some(None),
            Protection::For(span) => {
                let started = pod
                    .status
                    .as_ref()
                    .and_then(|status| status.start_time.as_ref())
                    .map_or(now, |time| time.0);
                let until = started
                    .checked_add(
                        jiff::SignedDuration::try_from(span).unwrap_or(jiff::SignedDuration::MAX),
                    )
                    .unwrap_or(Timestamp::MAX);
                (until > now).then_some(Some(until))
            }
        };
        if let Some(until) = until {
            return Disposition::DoNotEvict { until };
        }
    }
    let tier = match (is_critical(pod), is_daemonset_pod(pod)) {
        (false, false) => Tier::Workload,
        (false, true) => Tier::DaemonSet,
        (true, false) => Tier::CriticalWorkload,
        (true, true) => Tier::CriticalDaemonSet,
    };
    match rule.behavior {
        DrainBehavior::Skip => Disposition::Skip(Skip::Rule),
        DrainBehavior::WaitCompleted => Disposition::WaitCompleted(tier),
        DrainBehavior::Drain => Disposition::Evict {
            tier,
            order: rule.order,
        },
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protection {
    Always,
    For(Duration),
}

/// The pod's do-not-evict protection, from its label or annotation (the label wins). `"true"`
/// protects for good, a Go duration for that long after the pod started, `"false"` not at
/// all; any other value protects for good (the safe reading of a typo).
pub fn do_not_evict(pod: &Pod) -> Option<Protection> {
    let value = [&pod.metadata.labels, &pod.metadata.annotations]
        .into_iter()
        .find_map(|map| map.as_ref().and_then(|map| map.get(DO_NOT_EVICT)))?;
    match value.trim() {
        "false" => None,
        "true" => Some(Protection::Always),
        text => Some(parse_go_duration(text).map_or(Protection::Always, Protection::For)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(value: serde_json::Value) -> Pod {
        let mut base = json!({"metadata": {"name": "p", "namespace": "ns"}, "spec": {"containers": []}, "status": {"phase": "Running", "startTime": "2026-11-23T10:00:00Z"}});
        merge(&mut base, value);
        serde_json::from_value(base).unwrap()
    }

    fn merge(base: &mut serde_json::Value, patch: serde_json::Value) {
        match (base, patch) {
            (serde_json::Value::Object(base), serde_json::Value::Object(patch)) => {
                for (key, value) in patch {
                    merge(base.entry(key).or_insert(serde_json::Value::Null), value);
                }
            }
            (base, patch) => *base = patch,
        }
    }

    fn now() -> Timestamp {
        "2026-11-23T10:10:00Z".parse().unwrap()
    }

    #[test]
    fn pods_fall_into_tiers_by_criticality_then_daemonset() {
        let daemon = json!({"metadata": {"ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "d", "uid": "u", "controller": true}]}});
        let critical = json!({"spec": {"priorityClassName": "system-node-critical"}});
        let mut critical_daemon = daemon.clone();
        merge(&mut critical_daemon, critical.clone());
        let cases = [
            (json!({}), Tier::Workload),
            (daemon, Tier::DaemonSet),
            (critical, Tier::CriticalWorkload),
            (
                json!({"spec": {"priority": 2_000_001_000}}),
                Tier::CriticalWorkload,
            ),
            (critical_daemon, Tier::CriticalDaemonSet),
        ];
        for (patch, tier) in cases {
            assert_eq!(
                disposition(&pod(patch.clone()), now(), &Applied::DEFAULT),
                Disposition::Evict { tier, order: 0 },
                "{patch}"
            );
        }
        assert!(Tier::ALL.windows(2).all(|pair| pair[0] < pair[1]));
    }

    #[test]
    fn mirror_terminal_and_tolerating_pods_are_skipped() {
        let cases = [
            (
                json!({"metadata": {"annotations": {"kubernetes.io/config.mirror": "x"}}}),
                Skip::Mirror,
            ),
            (json!({"status": {"phase": "Succeeded"}}), Skip::Terminal),
            (json!({"status": {"phase": "Failed"}}), Skip::Terminal),
            (
                json!({"spec": {"tolerations": [{"operator": "Exists"}]}}),
                Skip::ToleratesDisruption,
            ),
            (
                json!({"spec": {"tolerations": [{"key": DISRUPTED_TAINT, "operator": "Exists", "effect": "NoSchedule"}]}}),
                Skip::ToleratesDisruption,
            ),
        ];
        for (patch, skip) in cases {
            assert_eq!(
                disposition(&pod(patch.clone()), now(), &Applied::DEFAULT),
                Disposition::Skip(skip),
                "{patch}"
            );
        }
        let other_taint =
            json!({"spec": {"tolerations": [{"key": "other", "operator": "Exists"}]}});
        assert_eq!(
            disposition(&pod(other_taint), now(), &Applied::DEFAULT),
            Disposition::Evict {
                tier: Tier::Workload,
                order: 0
            }
        );
    }

    #[test]
    fn do_not_evict_protects_for_good_or_for_a_time_after_start() {
        let label = |value: &str| pod(json!({"metadata": {"labels": {DO_NOT_EVICT: value}}}));
        let annotation =
            |value: &str| pod(json!({"metadata": {"annotations": {DO_NOT_EVICT: value}}}));
        assert_eq!(
            disposition(&label("true"), now(), &Applied::DEFAULT),
            Disposition::DoNotEvict { until: None }
        );
        assert_eq!(
            disposition(&annotation("true"), now(), &Applied::DEFAULT),
            Disposition::DoNotEvict { until: None }
        );
        assert_eq!(
            disposition(&label("yes please"), now(), &Applied::DEFAULT),
            Disposition::DoNotEvict { until: None }
        );
        assert_eq!(
            disposition(&label("false"), now(), &Applied::DEFAULT),
            Disposition::Evict {
                tier: Tier::Workload,
                order: 0
            }
        );
        assert_eq!(
            disposition(&annotation("30m"), now(), &Applied::DEFAULT),
            Disposition::DoNotEvict {
                until: Some("2026-11-23T10:30:00Z".parse().unwrap())
            }
        );
        assert_eq!(
            disposition(&annotation("5m"), now(), &Applied::DEFAULT),
            Disposition::Evict {
                tier: Tier::Workload,
                order: 0
            },
            "expired"
        );
    }
}
