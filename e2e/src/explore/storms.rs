//! Invariant 13, no storm against the provider or the API server.
//! - A call that changes a machine (EC2's terminate and power calls, a Redfish reset, a
//!   Cluster API Machine's delete or patch) is sent to one machine at most
//!   [`CALLS_PER_WINDOW`] times within any [`WINDOW`], counted at the interposer: a refused or
//!   failed call waits out its backoff whatever wakes its loop (the outside check found 91
//!   StopInstances in 12 s for one machine an IAM policy refused). Requests the interposer
//!   answered as throttled are the client's own retries of one call and are not counted.
//! - No program writes one Node more than [`NODE_WRITES_PER_WINDOW`] times within any
//!   [`WINDOW`], counted by kube-sim's audit of Node writes: a write of our own that wakes our
//!   own loop must not become a write per pass.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use kube_sim::audit::NodeWrite;
use provider_testbed::interposer::Seen;

use super::invariants::Violation;

/// The window the calls are counted in.
pub const WINDOW: Duration = Duration::from_secs(10);
/// The most calls of one action to one machine within [`WINDOW`]: the faster backoff of the
/// two programs (termination-controller's, 1 s doubling) allows 4 tries in 10 s (at 0, 1, 3
/// and 7 s); a new leader or a restarted replica counts afresh, so twice that, and one more
/// for a call in flight at the handover.
pub const CALLS_PER_WINDOW: usize = 9;

const CHANGING: [&str; 3] = ["TerminateInstances", "StopInstances", "StartInstances"];

pub fn provider_calls(seen: &[Seen]) -> Vec<Violation> {
    let mut calls: BTreeMap<(String, String), Vec<SystemTime>> = BTreeMap::new();
    for request in seen.iter().filter(|request| !request.throttled) {
        for key in changing(request) {
            calls.entry(key).or_default().push(request.at);
        }
    }
    calls
        .into_iter()
        .filter_map(|((action, id), mut times)| {
            times.sort();
            let (start, count) = busiest(&times, CALLS_PER_WINDOW)?;
            Some(violation(
                start,
                format!(
                    "{count} {action} calls to machine {id} within {} s (at most \
                     {CALLS_PER_WINDOW}): a failed call retried faster than its backoff",
                    WINDOW.as_secs()
                ),
            ))
        })
        .collect()
}

/// The changes one request asks for, as (action, machine): EC2's terminate and power calls
/// per instance, a Redfish `ComputerSystem.Reset` per system and reset type, a Cluster API
/// Machine's delete or patch.
fn changing(request: &Seen) -> Vec<(String, String)> {
    if let Some(action) = request
        .field("Action")
        .filter(|action| CHANGING.contains(&action.as_str()))
    {
        return request
            .instance_ids()
            .into_iter()
            .map(|id| (action.clone(), id))
            .collect();
    }
    if let Some((system, reset_type)) = request.redfish_reset() {
        return vec![(format!("Reset {reset_type}"), system)];
    }
    let path = request.path.split('?').next().unwrap_or_default();
    match path.rsplit_once("/machines/") {
        Some((_, name)) if matches!(request.method.as_str(), "DELETE" | "PATCH") => {
            vec![(format!("{} Machine", request.method), name.to_owned())]
        }
        _ => Vec::new(),
    }
}

/// The most writes one program sends to one Node within [`WINDOW`]. A drain's steps write a
/// Node a handful of times (the finalizer, the cordon and its taint, a condition per step, the
/// release); a fence's a few more (the step label, the taint, the condition, the recovery).
/// The busiest windows of the recorded seeds on every provider held 17 (see
/// docs/explore.md); a write per failed try, as the outside check saw (about 195 relabels in
/// 12 s), is far above.
pub const NODE_WRITES_PER_WINDOW: usize = 30;

/// The second half of invariant 13: no program writes one Node more than
/// [`NODE_WRITES_PER_WINDOW`] times within any [`WINDOW`], counted by the API server's audit.
pub fn node_writes(writes: &[NodeWrite], programs: &[&str]) -> Vec<Violation> {
    times_by_node(writes, programs)
        .into_iter()
        .filter_map(|((user, node), times)| {
            let (start, count) = busiest(&times, NODE_WRITES_PER_WINDOW)?;
            Some(violation(
                start,
                format!(
                    "{user} wrote node {node} {count} times within {} s (at most \
                     {NODE_WRITES_PER_WINDOW}): a write per try, not per step",
                    WINDOW.as_secs()
                ),
            ))
        })
        .collect()
}

/// The most writes of one program to one Node within a [`WINDOW`], for the docs' figure.
pub fn busiest_node_writes(writes: &[NodeWrite], programs: &[&str]) -> usize {
    times_by_node(writes, programs)
        .values()
        .filter_map(|times| {
            window_counts(times)
                .into_iter()
                .map(|(_, count)| count)
                .max()
        })
        .max()
        .unwrap_or(0)
}

/// Each program's writes of each Node name, in time order.
fn times_by_node(
    writes: &[NodeWrite],
    programs: &[&str],
) -> BTreeMap<(String, String), Vec<SystemTime>> {
    let mut by_node: BTreeMap<(String, String), Vec<SystemTime>> = BTreeMap::new();
    for write in writes
        .iter()
        .filter(|write| programs.contains(&write.user.as_str()))
    {
        if let Ok(at) = write.at.parse::<jiff::Timestamp>() {
            by_node
                .entry((write.user.clone(), write.name.clone()))
                .or_default()
                .push(SystemTime::from(at));
        }
    }
    for times in by_node.values_mut() {
        times.sort();
    }
    by_node
}

/// For each of the sorted `times`, how many fall within the [`WINDOW`] it starts.
fn window_counts(times: &[SystemTime]) -> Vec<(SystemTime, usize)> {
    let mut end = 0;
    times
        .iter()
        .enumerate()
        .map(|(begin, start)| {
            while end < times.len()
                && times[end]
                    .duration_since(*start)
                    .is_ok_and(|since| since < WINDOW)
            {
                end += 1;
            }
            (*start, end - begin)
        })
        .collect()
}

fn violation(start: SystemTime, what: String) -> Violation {
    Violation {
        invariant: 13,
        at: jiff::Timestamp::try_from(start)
            .map(|at| at.to_string())
            .unwrap_or_default(),
        what,
    }
}

/// The start and count of the first window holding more than `bound` of the sorted `times`.
fn busiest(times: &[SystemTime], bound: usize) -> Option<(SystemTime, usize)> {
    window_counts(times)
        .into_iter()
        .find(|(_, count)| *count > bound)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(action: &str, id: &str, after_ms: u64, throttled: bool) -> Seen {
        Seen {
            throttled,
            ..rest(
                "POST",
                "/",
                &format!("Action={action}&Version=2016-11-15&InstanceId.1={id}"),
                after_ms,
            )
        }
    }

    #[test]
    fn a_storm_of_one_machine_is_caught_and_a_backoff_is_not() {
        // The outside check's storm: a StopInstances every 130 ms, 77 of them in 10 s.
        let storm: Vec<Seen> = (0..91)
            .map(|n| request("StopInstances", "i-1", n * 130, false))
            .collect();
        one_storm(
            &provider_calls(&storm),
            "77 StopInstances calls to machine i-1",
        );
        // A 1 s doubling backoff, twice over (a new leader), and throttled retries.
        let backoff: Vec<Seen> = [0, 1_000, 3_000, 7_000, 15_000, 31_000]
            .into_iter()
            .flat_map(|at| [at, at + 500])
            .map(|at| request("TerminateInstances", "i-2", at, false))
            .chain((0..20).map(|n| request("TerminateInstances", "i-2", n * 100, true)))
            .collect();
        assert_eq!(provider_calls(&backoff), []);
        // Reads are polls, not judged; other machines are counted apart.
        let mixed: Vec<Seen> = (0..40)
            .flat_map(|n| {
                [
                    request("DescribeInstances", "i-3", n * 100, false),
                    request("StopInstances", &format!("i-{n}"), n * 100, false),
                ]
            })
            .collect();
        assert_eq!(provider_calls(&mixed), []);
    }

    fn rest(method: &str, path: &str, body: &str, after_ms: u64) -> Seen {
        Seen {
            method: method.to_owned(),
            path: path.to_owned(),
            body: body.to_owned(),
            at: SystemTime::UNIX_EPOCH + Duration::from_millis(1_000_000 + after_ms),
            throttled: false,
        }
    }

    #[test]
    fn redfish_resets_and_machine_deletes_are_counted_per_machine() {
        let reset = "/redfish/v1/Systems/s-1/Actions/ComputerSystem.Reset";
        let storm: Vec<Seen> = (0..12)
            .map(|n| rest("POST", reset, r#"{"ResetType": "ForceOff"}"#, n * 500))
            .chain((0..12).map(|n| rest("GET", "/redfish/v1/Systems/s-1", "", n * 500)))
            .collect();
        one_storm(
            &provider_calls(&storm),
            "12 Reset ForceOff calls to machine s-1",
        );
        let machine = "/apis/cluster.x-k8s.io/v1beta2/namespaces/machines/machines/node-1-a";
        let deletes: Vec<Seen> = (0..10)
            .map(|n| rest("DELETE", machine, "", n * 100))
            .chain((0..30).map(|n| rest("GET", machine, "", n * 100)))
            .collect();
        one_storm(
            &provider_calls(&deletes),
            "10 DELETE Machine calls to machine node-1-a",
        );
    }

    #[test]
    fn a_program_writing_one_node_per_pass_is_caught_and_a_drain_is_not() {
        let write = |user: &str, node: &str, after_ms: i64| NodeWrite {
            name: node.to_owned(),
            status: true,
            user: user.to_owned(),
            at: (jiff::Timestamp::UNIX_EPOCH + jiff::SignedDuration::from_millis(after_ms))
                .to_string(),
        };
        let programs = ["gc", "tc"];
        // A pass every 15 ms woken by its own write, as out-of-service-gc's cleanup was.
        let storm: Vec<NodeWrite> = (0..200).map(|n| write("gc", "node-4", n * 15)).collect();
        one_storm(
            &node_writes(&storm, &programs),
            "gc wrote node node-4 200 times within 10 s",
        );
        assert_eq!(busiest_node_writes(&storm, &programs), 200);
        // A drain's dozen writes, another node's, and a writer that is not ours.
        let drain: Vec<NodeWrite> = (0..12)
            .map(|n| write("tc", "node-1", n * 300))
            .chain((0..12).map(|n| write("tc", "node-2", n * 300)))
            .chain((0..100).map(|n| write("kubelet", "node-1", n * 10)))
            .collect();
        assert_eq!(node_writes(&drain, &programs), []);
        assert_eq!(busiest_node_writes(&drain, &programs), 12);
    }

    /// `found` is one storm, said as `starts`.
    fn one_storm(found: &[Violation], starts: &str) {
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].what.starts_with(starts), "{found:?}");
    }
}
