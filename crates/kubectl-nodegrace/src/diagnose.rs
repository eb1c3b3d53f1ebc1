//! Where a node stands in each program's work, read from what the programs write on it: their
//! conditions (whose reasons are each program's step map), taints, annotations and labels. The
//! programs' own words are kept; this adds the object that holds the node and what would move
//! it on.

use std::fmt::Write as _;

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::NodeCondition;
use nodegrace_core::k8s::cached_node::CachedNode;
use nodegrace_core::k8s::node_shutdown::{
    Activity, SHUTDOWN_IN_PROGRESS_CONDITION, SHUTDOWN_INHIBITED_CONDITION, activity,
};
use nodegrace_core::k8s::nodes::{NodeFields, Readiness, readiness, taint_with_key};
use out_of_service_gc::api::{
    CLEANUP_CONDITION, DO_NOT_FENCE_ANNOTATION, FENCE_CONDITION, FENCE_LABEL, NODE_LEASE_NAMESPACE,
    OUT_OF_SERVICE_TAINT,
};
use out_of_service_gc::conditions::Reason as GcReason;
use out_of_service_gc::fence_mark::{self, Step as FenceStep};
use out_of_service_gc::status::after_cleanup;
use termination_controller::api::{FINALIZER, NodeDisruptionBudget};
use termination_controller::conditions::{Reason as TcReason, TERMINATING};
use termination_controller::hooks::{self, Stage};
use termination_controller::waiting_room::{waited_budget, waits_for_a_fix};

use crate::commands::{guarded_patch, release_lease, widened};
use crate::lifecycle::{Blocker, Next, NodeLifecycle, ObjectRef, Program, State};

/// What is known beyond the node itself; `None`: not read (not asked, or not allowed).
#[derive(Debug, Clone, Copy)]
pub struct Facts<'a> {
    pub now: Timestamp,
    /// The Leases named after the node, outside kube-node-lease.
    pub shutdown_leases: Option<&'a [Lease]>,
    /// The kubelet's Lease of the node in kube-node-lease.
    pub heartbeat: Option<&'a Lease>,
    pub budgets: Option<&'a [NodeDisruptionBudget]>,
}

/// Every program's row for `node`; a healthy node gets one row of its own when `named`.
pub fn diagnose(node: &CachedNode, facts: &Facts, named: bool) -> Vec<NodeLifecycle> {
    let name = node.metadata.name.clone().unwrap_or_default();
    let mut rows: Vec<NodeLifecycle> = [
        shutting_down(node, &name),
        shutdown_blocked(node, &name, facts),
        out_of_service(node, &name, facts),
        deleting(node, &name, facts),
    ]
    .into_iter()
    .flatten()
    .collect();
    if rows.is_empty() && named {
        rows.push(NodeLifecycle {
            node: name,
            program: None,
            state: State::Healthy,
            step: None,
            since: None,
            blocked_by: None,
            next: None,
        });
    }
    rows
}

fn condition<'a>(node: &'a CachedNode, type_: &str) -> Option<&'a NodeCondition> {
    node.conditions()
        .iter()
        .find(|condition| condition.type_ == type_)
}

fn since(condition: &NodeCondition) -> Option<Timestamp> {
    condition.last_transition_time.as_ref().map(|time| time.0)
}

fn message(condition: &NodeCondition) -> String {
    condition.message.clone().unwrap_or_default()
}

/// The first line of a program's message: a table cell.
fn first_line(text: &str) -> String {
    text.lines().next().unwrap_or_default().to_owned()
}

#[allow(clippy::unnecessary_wraps)] // every row's `blocked_by` is built by it
fn blocker(text: impl Into<String>, object: Option<ObjectRef>) -> Option<Blocker> {
    Some(Blocker {
        text: text.into(),
        object,
    })
}

/// `4s`, `12m`, `3h5m`, `2d4h`: how long ago, as kubectl's AGE column says it.
pub fn age(now: Timestamp, then: Timestamp) -> String {
    let seconds = now.duration_since(then).as_secs().max(0);
    match seconds {
        0..60 => format!("{seconds}s"),
        60..3600 => format!("{}m", seconds / 60),
        3600..86_400 => format!("{}h{}m", seconds / 3600, seconds % 3600 / 60),
        _ => format!("{}d{}h", seconds / 86_400, seconds % 86_400 / 3600),
    }
}

fn row(name: &str, program: Program, state: State) -> NodeLifecycle {
    NodeLifecycle {
        node: name.to_owned(),
        program: Some(program),
        state,
        step: None,
        since: None,
        blocked_by: None,
        next: None,
    }
}

fn shutting_down(node: &CachedNode, name: &str) -> Option<NodeLifecycle> {
    let condition = condition(node, SHUTDOWN_IN_PROGRESS_CONDITION)?;
    if condition.status != "True" {
        return None;
    }
    Some(NodeLifecycle {
        step: condition.reason.clone(),
        since: since(condition),
        blocked_by: blocker(first_line(&message(condition)), None),
        next: Some(Next::wait(if readiness(node) == Readiness::Ready {
            "the shutdown goes on by itself: pods stop in priority order, then the agent \
             releases logind's delay lock"
        } else {
            "the machine is down: the agent clears the condition when the node boots again"
        })),
        ..row(name, Program::GracefulShutdownAgent, State::ShuttingDown)
    })
}

fn shutdown_blocked(node: &CachedNode, name: &str, facts: &Facts) -> Option<NodeLifecycle> {
    let condition = condition(node, SHUTDOWN_INHIBITED_CONDITION)?;
    if condition.status != "True" {
        return None;
    }
    let held: Vec<(&Lease, String, Timestamp)> = facts
        .shutdown_leases
        .into_iter()
        .flatten()
        .filter_map(|lease| match activity(lease) {
            Activity::Active { holder, acquired } => Some((lease, holder, acquired)),
            _ => None,
        })
        .collect();
    let (blocked_by, next) = match held.first() {
        Some((lease, holder, acquired)) => {
            let namespace = lease.metadata.namespace.as_deref().unwrap_or_default();
            let mut text = format!(
                "Lease {namespace}/{name} holds the shutdown: held by {holder} for {}",
                age(facts.now, *acquired)
            );
            if held.len() > 1 {
                let _ = write!(text, ", and {} more Lease(s)", held.len() - 1);
            }
            let object = ObjectRef::new("Lease", Some(namespace), name);
            let next = Next::run(
                format!(
                    "its holder releases it when its work is done; release it yourself only if \
                     {holder} is gone (the command does nothing once another holds it)"
                ),
                release_lease(name, namespace, holder),
            );
            (blocker(text, Some(object)), next)
        }
        None => (
            blocker(format!("Leases held by {}", message(condition)), None),
            Next::wait("the Leases' holders release them when their work is done"),
        ),
    };
    Some(NodeLifecycle {
        step: condition.reason.clone(),
        since: since(condition),
        blocked_by,
        next: Some(next),
        ..row(
            name,
            Program::ShutdownInhibitorAgent,
            State::ShutdownBlocked,
        )
    })
}

fn gc_reason(condition: &NodeCondition) -> Option<GcReason> {
    condition.reason.as_deref().and_then(GcReason::parse)
}

fn out_of_service(node: &CachedNode, name: &str, facts: &Facts) -> Option<NodeLifecycle> {
    let fence = condition(node, FENCE_CONDITION);
    let fence_reason = fence.and_then(gc_reason);
    if let Some(mark) = fence_mark::mark(node) {
        return Some(fenced(node, name, mark, fence));
    }
    let waiting = matches!(
        fence_reason,
        Some(
            GcReason::NotReadySeen
                | GcReason::FenceHeldDoNotFence
                | GcReason::FenceHeldHeartbeat
                | GcReason::FenceHeldPartition
                | GcReason::FenceHeldMaxFenced
                | GcReason::FenceHeldMachineNotFound
                | GcReason::FenceHeldProvider
                | GcReason::FenceFailed
        )
    ) && readiness(node) != Readiness::Ready;
    if taint_with_key(node, OUT_OF_SERVICE_TAINT).is_some() {
        return Some(tainted(node, name, facts));
    }
    let fence = fence.filter(|_| waiting)?;
    Some(fence_waiting(name, fence, fence_reason?, facts))
}

fn fenced(
    node: &CachedNode,
    name: &str,
    mark: fence_mark::Mark,
    fence: Option<&NodeCondition>,
) -> NodeLifecycle {
    let (state, next) = match mark.step {
        FenceStep::Fencing => (
            State::Fencing,
            Next::wait("the provider confirms the power-off; a failure is retried on a backoff"),
        ),
        FenceStep::Fenced => (
            State::Fenced,
            Next::wait(
                "the machine stays off until it is powered on: by out-of-service-gc once the \
                 node is clean when it runs with --recover-after-cleanup, else by you; the \
                 fence ends once the node is Ready",
            ),
        ),
        FenceStep::Recovering => (
            State::Recovering,
            Next::wait("the node turns Ready (--recover-timeout); then the fence is over"),
        ),
        FenceStep::RecoveryFailed => (
            State::RecoveryFailed,
            Next::run(
                "the machine stays off until someone looks at it; removing the label lets \
                 out-of-service-gc power it on and watch it again",
                format!("kubectl label node {name} {FENCE_LABEL}-"),
            ),
        ),
    };
    // A fenced machine is held by nothing but its cleanup while that runs; the other steps
    // wait on what the fence's own message says.
    let cleaning = condition(node, CLEANUP_CONDITION)
        .filter(|cleanup| cleanup.reason.as_deref() == Some(GcReason::Cleaning.as_str()));
    let said = if mark.step == FenceStep::Fenced {
        cleaning
    } else {
        fence
    };
    NodeLifecycle {
        step: fence.and_then(|fence| fence.reason.clone()),
        since: mark.since.or_else(|| fence.and_then(since)),
        blocked_by: said.and_then(|said| blocker(first_line(&message(said)), None)),
        next: Some(next),
        ..row(name, Program::OutOfServiceGc, state)
    }
}

fn fence_waiting(
    name: &str,
    fence: &NodeCondition,
    reason: GcReason,
    facts: &Facts,
) -> NodeLifecycle {
    let said = first_line(&message(fence));
    let (blocked_by, next) = match reason {
        GcReason::FenceHeldDoNotFence => (
            blocker(
                format!("the fence is held: the node carries {DO_NOT_FENCE_ANNOTATION}"),
                Some(ObjectRef::new("Node", None, name).key(DO_NOT_FENCE_ANNOTATION)),
            ),
            Next::run(
                "remove the annotation to let out-of-service-gc fence the node",
                format!("kubectl annotate node {name} {DO_NOT_FENCE_ANNOTATION}-"),
            ),
        ),
        GcReason::FenceHeldHeartbeat => (
            blocker(
                heartbeat_text(facts).unwrap_or(said),
                Some(ObjectRef::new("Lease", Some(NODE_LEASE_NAMESPACE), name)),
            ),
            Next::wait(
                "the kubelet still reports: a machine that runs is not fenced; the fence goes \
                 on once its Lease is silent for the guard's window",
            ),
        ),
        GcReason::NotReadySeen => (
            blocker(said, None),
            Next::wait("fenced at the time said, unless the node comes back"),
        ),
        _ => (
            blocker(said, None),
            Next::wait("out-of-service-gc tries again on its backoff"),
        ),
    };
    NodeLifecycle {
        step: fence.reason.clone(),
        since: since(fence),
        blocked_by,
        next: Some(next),
        ..row(name, Program::OutOfServiceGc, State::FenceWaiting)
    }
}

/// "the fence is held: the kubelet renewed its Lease 4s ago".
fn heartbeat_text(facts: &Facts) -> Option<String> {
    let renewed = facts.heartbeat?.spec.as_ref()?.renew_time.as_ref()?.0;
    Some(format!(
        "the fence is held: the kubelet renewed its Lease {} ago",
        age(facts.now, renewed)
    ))
}

fn tainted(node: &CachedNode, name: &str, facts: &Facts) -> NodeLifecycle {
    let untaint = format!("kubectl taint node {name} {OUT_OF_SERVICE_TAINT}-");
    let Some(cleanup) = condition(node, CLEANUP_CONDITION) else {
        return NodeLifecycle {
            blocked_by: blocker("no OutOfServiceCleanup condition yet", None),
            next: Some(Next::wait(
                "out-of-service-gc cleans the node once it sees the taint; is it installed?",
            )),
            ..row(name, Program::OutOfServiceGc, State::OutOfService)
        };
    };
    let said = message(cleanup);
    let (state, blocked_by, next) = match gc_reason(cleanup) {
        Some(GcReason::Cleaning) => (
            State::Cleaning,
            blocker(first_line(&said), None),
            Next::wait("pods are force-deleted and volumes detached"),
        ),
        Some(GcReason::Done) if said.ends_with(after_cleanup(false)) => {
            let next = if readiness(node) == Readiness::Ready {
                Next::run("the node is back: remove the taint", untaint)
            } else {
                Next::run(
                    "bring the machine back; once the node is Ready, remove the taint",
                    untaint,
                )
            };
            (State::Cleaned, None, next)
        }
        Some(GcReason::Done) => (
            State::Cleaned,
            None,
            Next::wait("out-of-service-gc removes the taint once the node is Ready again"),
        ),
        Some(GcReason::Refused) => (
            State::OutOfService,
            blocker(
                heartbeat_text(facts).map_or_else(
                    || first_line(&said),
                    |text| text.replace("the fence is held", "the cleanup is refused"),
                ),
                Some(ObjectRef::new("Lease", Some(NODE_LEASE_NAMESPACE), name)),
            ),
            Next::wait(
                "the kubelet still reports: make sure the machine is off; the cleanup starts once \
                 its Lease is silent",
            ),
        ),
        _ => (
            State::OutOfService,
            blocker(first_line(&said), None),
            Next::wait("nothing is forced while the node is Ready"),
        ),
    };
    NodeLifecycle {
        step: cleanup.reason.clone(),
        since: since(cleanup),
        blocked_by,
        next: Some(next),
        ..row(name, Program::OutOfServiceGc, state)
    }
}

fn tc_reason(condition: &NodeCondition) -> Option<TcReason> {
    condition.reason.as_deref().and_then(TcReason::parse)
}

fn deleting(node: &CachedNode, name: &str, facts: &Facts) -> Option<NodeLifecycle> {
    let deleted = node.metadata.deletion_timestamp.as_ref()?.0;
    let held = node
        .metadata
        .finalizers
        .iter()
        .flatten()
        .any(|finalizer| finalizer == FINALIZER);
    if !held {
        return None;
    }
    let Some(terminating) = condition(node, TERMINATING).filter(|c| c.status == "True") else {
        return Some(NodeLifecycle {
            since: Some(deleted),
            blocked_by: blocker("termination-controller has not taken the node up yet", None),
            next: Some(Next::wait(
                "termination-controller's leader takes it up; is it running?",
            )),
            ..row(name, Program::TerminationController, State::Deleting)
        });
    };
    let said = message(terminating);
    let (blocked_by, next) = match tc_reason(terminating) {
        Some(TcReason::AwaitingBudget | TcReason::MaintenanceWindow) => budget_wait(
            &said,
            tc_reason(terminating) == Some(TcReason::MaintenanceWindow),
            facts,
        ),
        Some(TcReason::AwaitingPreDrainHooks) => {
            hook_wait(node, name, Stage::PreDrain, terminating, facts)
        }
        Some(TcReason::AwaitingPreTerminateHooks) => {
            hook_wait(node, name, Stage::PreTerminate, terminating, facts)
        }
        Some(TcReason::Draining) => (
            blocker(first_line(&said), None),
            Next::wait(format!(
                "pods are evicted as their PodDisruptionBudgets allow; `kubectl nodegrace \
                 explain node {name}` names the budget that holds them"
            )),
        ),
        Some(TcReason::BlockedByDoNotEvict) => (
            blocker(first_line(&said), None),
            Next::wait(format!(
                "no eviction starts while a do-not-evict pod runs; `kubectl nodegrace explain \
                 node {name}` names it"
            )),
        ),
        Some(TcReason::AwaitingPodCompletion) => (
            blocker(first_line(&said), None),
            Next::wait("the pods a drain rule waits for finish by themselves"),
        ),
        Some(TcReason::AwaitingVolumeDetachment) => (
            blocker(first_line(&said), None),
            Next::wait("the attach-detach controller detaches them (--volume-detach-timeout)"),
        ),
        Some(TcReason::TerminatingInstance) => (
            blocker(first_line(&said), None),
            Next::wait("the instance provider's answer; an error is retried on a backoff"),
        ),
        _ => (
            blocker(first_line(&said), None),
            Next::wait("termination-controller goes on"),
        ),
    };
    Some(NodeLifecycle {
        step: terminating.reason.clone(),
        since: since(terminating).or(Some(deleted)),
        blocked_by,
        next: Some(next),
        ..row(name, Program::TerminationController, State::Deleting)
    })
}

fn budget_wait(said: &str, window: bool, facts: &Facts) -> (Option<Blocker>, Next) {
    let Some(budget) = waited_budget(said) else {
        return (
            blocker(first_line(said), None),
            Next::wait("its NodeDisruptionBudgets grant it"),
        );
    };
    let object = Some(ObjectRef::new("NodeDisruptionBudget", None, budget));
    if window {
        return (
            blocker(first_line(said), object),
            Next::wait("the budget's next maintenance window"),
        );
    }
    let spec = facts
        .budgets
        .into_iter()
        .flatten()
        .find(|found| found.metadata.name.as_deref() == Some(budget))
        .map(|found| &found.spec);
    let widened = spec
        .filter(|_| !waits_for_a_fix(said))
        .and_then(|spec| widened(spec.min_available.as_ref(), spec.max_unavailable.as_ref()));
    let next = match widened {
        Some(change) => Next::run(
            "wait for the budget's other nodes to finish, or let one more of its nodes go at once",
            guarded_patch("nodedisruptionbudget", budget, None, change),
        ),
        None if waits_for_a_fix(said) => Next::wait(format!(
            "fix the budget: `kubectl describe nodedisruptionbudget {budget}` says what is wrong"
        )),
        None => Next::wait(
            "wait for the budget's other nodes to finish, or widen the budget (spec.maxUnavailable \
             or spec.minAvailable)",
        ),
    };
    (blocker(first_line(said), object), next)
}

fn hook_wait(
    node: &CachedNode,
    name: &str,
    stage: Stage,
    terminating: &NodeCondition,
    facts: &Facts,
) -> (Option<Blocker>, Next) {
    let hooks = hooks::pending(node, stage);
    let Some(first) = hooks.first() else {
        return (
            blocker(first_line(&message(terminating)), None),
            Next::wait("termination-controller goes on once it sees no hook"),
        );
    };
    let key = format!("{}{first}", stage.prefix());
    let waited = since(terminating)
        .map(|at| format!(", since {}", age(facts.now, at)))
        .unwrap_or_default();
    let mut text = format!("{} hook {first}{waited}", stage.label());
    if hooks.len() > 1 {
        let _ = write!(text, " (and {})", hooks[1..].join(", "));
    }
    (
        blocker(text, Some(ObjectRef::new("Node", None, name).key(&key))),
        Next::run(
            "the hook's owner removes the annotation when its work is done; removing it yourself \
             skips the hook (--hook-timeout ends the wait too)",
            format!("kubectl annotate node {name} {key}-"),
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const NOW: &str = "2026-11-30T12:00:00Z";

    fn node(body: &serde_json::Value) -> CachedNode {
        serde_json::from_value(body.clone()).expect("a node")
    }

    fn condition(type_: &str, status: &str, reason: &str, message: &str) -> serde_json::Value {
        json!({"type": type_, "status": status, "reason": reason, "message": message,
               "lastTransitionTime": "2026-11-30T11:48:00Z"})
    }

    fn facts(budgets: Option<&[NodeDisruptionBudget]>) -> Facts<'_> {
        Facts {
            now: NOW.parse().expect("a time"),
            shutdown_leases: None,
            heartbeat: None,
            budgets,
        }
    }

    fn deleting(annotations: &serde_json::Value, reason: &str, message: &str) -> CachedNode {
        node(&json!({
            "metadata": {"name": "n1", "deletionTimestamp": "2026-11-30T11:47:00Z",
                         "finalizers": [FINALIZER], "annotations": annotations},
            "status": {"conditions": [condition(TERMINATING, "True", reason, message)]},
        }))
    }

    #[test]
    fn ages_read_as_kubectl_prints_them() {
        let now: Timestamp = NOW.parse().unwrap();
        let ago = |seconds: i64| age(now, now - jiff::SignedDuration::from_secs(seconds));
        assert_eq!(
            [
                ago(4),
                ago(720),
                ago(3 * 3600 + 300),
                ago(2 * 86_400 + 4 * 3600)
            ],
            ["4s", "12m", "3h5m", "2d4h"]
        );
    }

    #[test]
    fn a_budget_in_counts_is_widened_by_one_and_one_in_percent_only_named() {
        let budget = |spec: serde_json::Value| -> NodeDisruptionBudget {
            serde_json::from_value(json!({"metadata": {"name": "workers"}, "spec": spec})).unwrap()
        };
        let waiting = deleting(
            &json!({}),
            "AwaitingBudget",
            "NodeDisruptionBudget workers: too few of its nodes are available now",
        );
        let counted = [budget(json!({"maxUnavailable": 2}))];
        let rows = diagnose(&waiting, &facts(Some(&counted)), false);
        let next = rows[0].next.clone().unwrap();
        assert_eq!(
            next.command.as_deref(),
            Some(
                r#"kubectl patch nodedisruptionbudget workers --type=json -p '[{"op":"test","path":"/spec/maxUnavailable","value":2},{"op":"replace","path":"/spec/maxUnavailable","value":3}]'"#
            )
        );
        let percent = [budget(json!({"maxUnavailable": "10%"}))];
        let rows = diagnose(&waiting, &facts(Some(&percent)), false);
        assert_eq!(rows[0].next.clone().unwrap().command, None);
        assert_eq!(
            rows[0].blocked_by.clone().unwrap().object,
            Some(ObjectRef::new("NodeDisruptionBudget", None, "workers"))
        );
    }

    #[test]
    fn several_hooks_name_the_first_to_remove_and_the_rest() {
        let hooked = deleting(
            &json!({"pre-drain.nodegrace.io/backup": "x", "pre-drain.nodegrace.io/audit": "y"}),
            "AwaitingPreDrainHooks",
            "Waiting for pre-drain hook(s) audit, backup",
        );
        let row = &diagnose(&hooked, &facts(None), false)[0];
        assert_eq!(
            row.blocked_by.as_ref().unwrap().text,
            "pre-drain hook audit, since 12m (and backup)"
        );
        assert_eq!(
            row.next.as_ref().unwrap().command.as_deref(),
            Some("kubectl annotate node n1 pre-drain.nodegrace.io/audit-")
        );
    }

    #[test]
    fn a_node_in_no_work_shows_only_when_named_and_a_deletion_not_ours_is_none() {
        let plain = node(&json!({"metadata": {"name": "n1"}}));
        assert!(diagnose(&plain, &facts(None), false).is_empty());
        assert_eq!(
            diagnose(&plain, &facts(None), true)[0].state,
            State::Healthy
        );
        let others = node(&json!({"metadata": {"name": "n1",
            "deletionTimestamp": "2026-11-30T11:47:00Z", "finalizers": ["example.com/other"]}}));
        assert!(diagnose(&others, &facts(None), false).is_empty());
    }

    #[test]
    fn a_shutdown_shown_on_a_node_that_is_down_says_the_agent_clears_it_at_boot() {
        let down = node(
            &json!({"metadata": {"name": "n1"}, "status": {"conditions": [
                condition(SHUTDOWN_IN_PROGRESS_CONDITION, "True", "NodeShutdown", "shutting down"),
                condition("Ready", "Unknown", "NodeStatusUnknown", "Kubelet stopped posting node status."),
            ]}}),
        );
        let row = &diagnose(&down, &facts(None), false)[0];
        assert_eq!(row.state, State::ShuttingDown);
        assert!(
            row.next.as_ref().unwrap().text.contains("boots again"),
            "{row:?}"
        );
    }
}
