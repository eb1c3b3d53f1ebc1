//! Invariant 12: no pod stays bound to a deleted Node past the pod garbage collector's bound.
//! kube-controller-manager's pod GC (kube-sim's `gcOrphaned`) deletes the pods bound to a node
//! name no Node has, once the name's quarantine has passed; termination-controller's dead-node
//! release and every Node deletion rely on it. A pod left bound to a node that is gone keeps
//! its budget spent for ever, so the next drain of its workload never ends.
//!
//! Judged at the end from a fresh read of the pods and Nodes, and from the judge's watch of
//! Nodes for when each name last went (the watch sees a removal after it happened, never
//! before, so the age it gives is never too large).

use std::collections::{BTreeMap, BTreeSet};

use jiff::{SignedDuration, Timestamp};
use serde_json::Value;

use super::invariants::Violation;
use super::record::{Change, Kind, Seen};

/// The pod GC's timings in the explorer's `kube-sim serve`, and the bound they give.
#[derive(Debug, Clone, Copy)]
pub struct PodGc {
    pub period: SignedDuration,
    pub quarantine: SignedDuration,
}

/// What the bound leaves for the simulator's own delays: a sweep held up on a busy machine.
const SLACK: SignedDuration = SignedDuration::from_secs(5);

impl PodGc {
    /// The sweep after a removal finds the name missing and quarantines it; the first sweep
    /// after the quarantine deletes its pods: the quarantine and two periods at most.
    pub fn bound(&self) -> SignedDuration {
        self.quarantine + self.period * 2 + SLACK
    }

    /// The `kube-sim serve` flags that set these timings.
    pub fn flags(&self) -> Vec<String> {
        vec![
            format!("--pod-gc-period={}ms", self.period.as_millis()),
            format!("--pod-gc-quarantine={}ms", self.quarantine.as_millis()),
        ]
    }
}

/// A pod bound to a node name no Node has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Orphan {
    pub pod: String,
    pub node: String,
    /// When the judge's watch saw the name's last Node go.
    pub node_gone_at: Timestamp,
}

/// When each node name that has no Node now last lost its Node, replayed from the watch in
/// resourceVersion order (a re-list that no longer names a node counts as its removal).
pub fn removals(recording: &[Seen]) -> BTreeMap<String, Timestamp> {
    let mut existing: BTreeSet<String> = BTreeSet::new();
    let mut gone: BTreeMap<String, Timestamp> = BTreeMap::new();
    for seen in recording.iter().filter(|seen| seen.kind == Kind::Node) {
        match &seen.change {
            Change::Upsert(node) => {
                let name = node["metadata"]["name"].as_str().unwrap_or_default();
                existing.insert(name.to_owned());
                gone.remove(name);
            }
            Change::Removed(name) => {
                existing.remove(name);
                gone.insert(name.clone(), seen.received);
            }
            Change::Resync(names) => {
                for name in existing.iter().filter(|name| !names.contains(name)) {
                    gone.insert(name.clone(), seen.received);
                }
                existing = names.iter().cloned().collect();
                gone.retain(|name, _| !existing.contains(name));
            }
        }
    }
    gone
}

/// The pods bound to a node name that lost its Node, of the cluster as read now. A pod whose
/// deletion was forced counts as gone: only another's finalizer keeps its object.
pub fn orphans(
    removals: &BTreeMap<String, Timestamp>,
    nodes: &[Value],
    pods: &[Value],
) -> Vec<Orphan> {
    let named: BTreeSet<&str> = nodes
        .iter()
        .filter_map(|node| node["metadata"]["name"].as_str())
        .collect();
    pods.iter()
        .filter(|pod| {
            !(pod["metadata"]["deletionTimestamp"].is_string()
                && pod["metadata"]["deletionGracePeriodSeconds"] == 0)
        })
        .filter_map(|pod| {
            let node = pod["spec"]["nodeName"].as_str()?;
            if node.is_empty() || named.contains(node) {
                return None;
            }
            Some(Orphan {
                pod: format!(
                    "{}/{}",
                    pod["metadata"]["namespace"].as_str().unwrap_or_default(),
                    pod["metadata"]["name"].as_str().unwrap_or_default()
                ),
                node: node.to_owned(),
                node_gone_at: *removals.get(node)?,
            })
        })
        .collect()
}

/// 12. The orphans whose node went longer than `bound` before `now`.
pub fn overdue(orphans: &[Orphan], now: Timestamp, bound: SignedDuration) -> Vec<Violation> {
    orphans
        .iter()
        .filter(|orphan| now.duration_since(orphan.node_gone_at) > bound)
        .map(|orphan| Violation {
            invariant: 12,
            at: now.to_string(),
            what: format!(
                "pod {} is still bound to node {}, gone since {} ({:.1} s; the pod GC's bound is {:.1} s)",
                orphan.pod,
                orphan.node,
                orphan.node_gone_at,
                now.duration_since(orphan.node_gone_at).as_secs_f64(),
                bound.as_secs_f64()
            ),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + seconds).unwrap_or(Timestamp::UNIX_EPOCH)
    }

    fn seen(revision: u64, seconds: i64, change: Change) -> Seen {
        Seen {
            revision,
            received: at(seconds),
            kind: Kind::Node,
            change,
            relisted: false,
        }
    }

    fn node(name: &str) -> Change {
        Change::Upsert(json!({"metadata": {"name": name}}))
    }

    fn pod(name: &str, node: &str) -> Value {
        json!({"metadata": {"name": name, "namespace": "apps"}, "spec": {"nodeName": node}})
    }

    /// A name's last removal counts; one registered again is not gone; a re-list that leaves
    /// a node out removes it then.
    #[test]
    fn removals_follow_the_names_last_node() {
        let recording = [
            seen(1, 0, node("node-0")),
            seen(2, 0, node("node-1")),
            seen(3, 0, node("node-2")),
            seen(4, 10, Change::Removed("node-0".to_owned())),
            seen(5, 20, node("node-0")),
            seen(6, 30, Change::Removed("node-0".to_owned())),
            seen(7, 40, Change::Removed("node-1".to_owned())),
            seen(8, 45, node("node-1")),
            seen(9, 50, Change::Resync(vec!["node-1".to_owned()])),
        ];
        let removals = removals(&recording);
        assert_eq!(
            removals,
            BTreeMap::from([("node-0".to_owned(), at(30)), ("node-2".to_owned(), at(50))])
        );
    }

    /// A pod of a gone node is overdue only past the bound; one on a live node, one whose
    /// deletion was forced, and one never bound are not orphans.
    #[test]
    fn only_pods_of_a_gone_node_past_the_bound_are_overdue() {
        let removals = BTreeMap::from([("node-0".to_owned(), at(100))]);
        let nodes = [json!({"metadata": {"name": "node-1"}})];
        let mut forced = pod("forced", "node-0");
        forced["metadata"]["deletionTimestamp"] = json!("2026-11-28T00:00:00Z");
        forced["metadata"]["deletionGracePeriodSeconds"] = json!(0);
        let pods = [
            pod("left", "node-0"),
            pod("elsewhere", "node-1"),
            forced,
            pod("pending", ""),
        ];
        let found = orphans(&removals, &nodes, &pods);
        assert_eq!(
            found,
            [Orphan {
                pod: "apps/left".to_owned(),
                node: "node-0".to_owned(),
                node_gone_at: at(100),
            }]
        );
        let bound = SignedDuration::from_secs(10);
        assert!(overdue(&found, at(110), bound).is_empty());
        let late = overdue(&found, at(111), bound);
        assert_eq!(late.len(), 1);
        assert!(late[0].what.contains("apps/left"), "{late:?}");
    }
}
