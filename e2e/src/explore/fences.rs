//! The invariants of out-of-service-gc's `--fence-after` and `--recover-after-cleanup`, judged
//! from the judge's watches (Nodes and the kubelets' Leases, in the API server's order) and
//! kube-sim's log of power calls:
//!
//! 9.  No machine is powered off by a program unless its Node carried a fence step first
//!     (`nodegrace.io/fence` = `fencing`, or `recovering` for a recovery given up), and no
//!     fence step `fencing` is written on a Node whose kubelet renewed its Lease within the
//!     liveness window before (less the watches' lag, [`WATCH_LAG`]).
//! 10. Never more than `--max-fenced` Nodes carry a fence step at once.
//! 11. A Node that was being recovered and is Ready at the end carries neither the
//!     out-of-service taint nor a fence step.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde_json::Value;

use super::invariants::{Instance, OUT_OF_SERVICE_TAINT, Violation};
use super::record::{Change, Kind, Seen};

pub const FENCE_LABEL: &str = "nodegrace.io/fence";
const NODE_LEASES: &str = "kube-node-lease";
/// How much later the judge's watch may deliver a renewal than the program's did.
pub const WATCH_LAG: Duration = Duration::from_millis(500);

fn step(node: &Value) -> Option<&str> {
    node["metadata"]["labels"][FENCE_LABEL].as_str()
}

fn name(object: &Value) -> &str {
    object["metadata"]["name"].as_str().unwrap_or_default()
}

fn ready(node: &Value) -> bool {
    node["status"]["conditions"].as_array().is_some_and(|c| {
        c.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    })
}

fn tainted(node: &Value) -> bool {
    node["spec"]["taints"]
        .as_array()
        .is_some_and(|t| t.iter().any(|t| t["key"] == OUT_OF_SERVICE_TAINT))
}

/// 9.
pub fn power_offs(recording: &[Seen], instances: &[Instance], window: Duration) -> Vec<Violation> {
    let mut violations = Vec::new();
    // Lease renewals seen, by node: (revision, received).
    let mut renewals: BTreeMap<String, Vec<(u64, jiff::Timestamp)>> = BTreeMap::new();
    let mut last_lease: BTreeMap<String, Value> = BTreeMap::new();
    let mut steps: BTreeMap<String, Option<String>> = BTreeMap::new();
    // (providerID, revision) of every fence step that allows a power-off.
    let mut allowed: Vec<(String, u64)> = Vec::new();
    let limit = jiff::SignedDuration::try_from(window.saturating_sub(WATCH_LAG))
        .unwrap_or(jiff::SignedDuration::ZERO);
    // The revision of the last version the judge saw of each Node.
    let mut last_seen: BTreeMap<String, u64> = BTreeMap::new();
    for seen in recording {
        match (&seen.kind, &seen.change) {
            (Kind::Lease, Change::Upsert(lease))
                if lease["metadata"]["namespace"] == NODE_LEASES =>
            {
                let node = name(lease).to_owned();
                let changed = last_lease.get(&node).is_none_or(|before| {
                    before["metadata"]["resourceVersion"] != lease["metadata"]["resourceVersion"]
                });
                if changed {
                    renewals
                        .entry(node.clone())
                        .or_default()
                        .push((seen.revision, seen.received));
                }
                last_lease.insert(node, lease.clone());
            }
            (Kind::Node, Change::Upsert(node)) => {
                let node_name = name(node).to_owned();
                let now = step(node).map(str::to_owned);
                let before = steps.insert(node_name.clone(), now.clone()).flatten();
                let previous = last_seen.insert(node_name.clone(), seen.revision);
                if now == before {
                    continue;
                }
                let provider_id = node["spec"]["providerID"].as_str().unwrap_or_default();
                if matches!(now.as_deref(), Some("fencing" | "recovering")) {
                    allowed.push((provider_id.to_owned(), seen.revision));
                }
                // `fenced` is written only after `fencing`. Seen first in one of the judge's
                // re-lists, the `fencing` between its last version and this one lived while
                // the judge was blind (seed 40: the `expire-history` fault): a power-off in
                // that stretch cannot be judged, so it is not called a violation.
                if now.as_deref() == Some("fenced")
                    && before.as_deref() != Some("fencing")
                    && seen.relisted
                {
                    allowed.push((provider_id.to_owned(), previous.unwrap_or_default() + 1));
                }
                if now.as_deref() != Some("fencing") {
                    continue;
                }
                let recent = renewals.get(&node_name).and_then(|renewed| {
                    renewed.iter().rev().find(|(revision, received)| {
                        *revision < seen.revision && seen.received.duration_since(*received) < limit
                    })
                });
                if let Some((_, received)) = recent {
                    violations.push(Violation {
                        invariant: 9,
                        at: seen.received.to_string(),
                        what: format!(
                            "{node_name} was marked fencing although its kubelet renewed its \
                             Lease at {received}, within the {window:?} window before"
                        ),
                    });
                }
            }
            (Kind::Node, Change::Removed(node_name)) => {
                steps.remove(node_name);
            }
            _ => {}
        }
    }
    for instance in instances {
        for call in &instance.power_call_log {
            if call.by.is_some() || call.power != "power-off" {
                continue;
            }
            let stepped = allowed
                .iter()
                .any(|(id, revision)| *id == instance.provider_id && *revision <= call.revision);
            if !stepped {
                violations.push(Violation {
                    invariant: 9,
                    at: call.at.clone(),
                    what: format!(
                        "machine {} (node {}) was powered off by a program with no fence step \
                         written on its Node first",
                        instance.id, instance.node
                    ),
                });
            }
        }
    }
    violations
}

/// 10.
pub fn at_most_fenced(recording: &[Seen], max: usize) -> Vec<Violation> {
    let mut fenced: BTreeMap<String, String> = BTreeMap::new();
    let mut violations = Vec::new();
    for seen in recording {
        match (&seen.kind, &seen.change) {
            (Kind::Node, Change::Upsert(node)) => match step(node) {
                Some(now) => {
                    fenced.insert(name(node).to_owned(), now.to_owned());
                }
                None => {
                    fenced.remove(name(node));
                }
            },
            (Kind::Node, Change::Removed(node)) => {
                fenced.remove(node);
            }
            (Kind::Node, Change::Resync(names)) => fenced.retain(|node, _| names.contains(node)),
            _ => continue,
        }
        if fenced.len() > max {
            violations.push(Violation {
                invariant: 10,
                at: seen.received.to_string(),
                what: format!(
                    "{} nodes carry a fence step at once: {fenced:?}",
                    fenced.len()
                ),
            });
        }
    }
    violations
}

/// 11.
pub fn recovered(recording: &[Seen], nodes: &[Value]) -> Vec<Violation> {
    let recovering: BTreeSet<&str> = recording
        .iter()
        .filter_map(|seen| match (&seen.kind, &seen.change) {
            (Kind::Node, Change::Upsert(node)) if step(node) == Some("recovering") => {
                node["metadata"]["uid"].as_str()
            }
            _ => None,
        })
        .collect();
    nodes
        .iter()
        .filter(|node| {
            node["metadata"]["uid"]
                .as_str()
                .is_some_and(|uid| recovering.contains(uid))
        })
        .filter(|node| ready(node) && (tainted(node) || step(node).is_some()))
        .map(|node| Violation {
            invariant: 11,
            at: jiff::Timestamp::now().to_string(),
            what: format!(
                "{} came back from a recovery Ready but keeps {}",
                name(node),
                if tainted(node) {
                    "the out-of-service taint"
                } else {
                    "its fence step"
                }
            ),
        })
        .collect()
}

/// What keeps a fence from being settled: a step under way, or a Ready node still marked.
pub fn unsettled(node: &Value) -> Option<String> {
    let step = step(node)?;
    let node_name = name(node);
    match step {
        "fencing" => Some(format!("{node_name} is being fenced")),
        "recovery-failed" => None,
        _ if ready(node) => Some(format!("{node_name} is Ready but still marked {step}")),
        "recovering" => Some(format!("{node_name} is being powered on again")),
        _ => None,
    }
}
