//! What the agent tells the cluster about the node: the `GracefulNodeShutdownInProgress`
//! condition (KEP-5683's name; `GracefulShutdown` too, for one release), the
//! taint that keeps new pods away, and Events. Everything goes through core's `Reporter`, so
//! no write ever holds up the pods' termination or the inhibitor's release, and failed writes
//! are retried (a cancelled shutdown's taint removal, the stale markings after a reboot).

use k8s_openapi::api::core::v1::Taint;
use nodegrace_core::k8s::conditions::ConditionSpec;
use nodegrace_core::k8s::events::EventReport;
use nodegrace_core::k8s::nodes::node_reference;
use nodegrace_core::k8s::reporter::{ConditionGuard, Landed, Reporter};
use nodegrace_logind::{KubeletShutdownSign, LogindError, describe_conflict};

use crate::plan::PriorityGroup;
use crate::summary::{GroupEnd, GroupResult, ShutdownSummary};

/// KEP-5683's well-known condition: True while a graceful node shutdown is in progress.
pub use nodegrace_core::k8s::node_shutdown::SHUTDOWN_IN_PROGRESS_CONDITION as CONDITION_TYPE;
/// The name before KEP-5683, still written (with the same status) for dashboards and alerts
/// built on it; dropped in the release after next.
pub const DEPRECATED_CONDITION_TYPE: &str = "GracefulShutdown";
/// KEP-5683's reason for a condition set because a node shutdown was detected.
const KEP_SHUTDOWN_REASON: &str = "NodeShutdown";
/// True while the kubelet's own graceful node shutdown is on as well.
pub const CONFLICT_CONDITION_TYPE: &str = "GracefulShutdownConflict";
pub const TAINT_KEY: &str = "nodegrace.io/shutting-down";
const ACTION: &str = "Shutdown";

#[derive(Debug, Clone)]
pub struct NodeMarks {
    reporter: Reporter,
    node: String,
}

fn shutting_down_taint() -> Taint {
    Taint {
        key: TAINT_KEY.to_owned(),
        effect: "NoSchedule".to_owned(),
        value: None,
        time_added: None,
    }
}

impl NodeMarks {
    pub fn new(reporter: Reporter, node: String) -> Self {
        Self { reporter, node }
    }

    fn condition(&self, status: &str, reason: &str, message: &str, guard: ConditionGuard) {
        let kep_reason = if status == "True" {
            KEP_SHUTDOWN_REASON
        } else {
            reason
        };
        let condition = ConditionSpec::new(CONDITION_TYPE, status, kep_reason, message);
        self.reporter.condition(&self.node, condition, guard);
        let deprecated = ConditionSpec::new(DEPRECATED_CONDITION_TYPE, status, reason, message);
        self.reporter.condition(&self.node, deprecated, guard);
    }

    fn event(&self, warning: bool, reason: &str, note: String) {
        let node = node_reference(&self.node);
        self.reporter.event(if warning {
            EventReport::warning(node, reason, ACTION, note)
        } else {
            EventReport::normal(node, reason, ACTION, note)
        });
    }

    /// Shutdown begins: taint (so nothing new lands here), condition, Event. The returned
    /// value resolves once the taint is written (or given up).
    pub fn shutting_down(&self) -> Landed {
        let landed = self.reporter.taint(&self.node, shutting_down_taint(), true);
        self.condition(
            "True",
            "NodeShuttingDown",
            "The node is shutting down; its pods are being terminated in priority order.",
            ConditionGuard::Always,
        );
        self.event(
            false,
            "NodeShutdown",
            "Node is shutting down; terminating pods by priority".to_owned(),
        );
        landed
    }

    pub fn group_started(&self, group: &PriorityGroup, pods: usize) {
        let note = format!(
            "Terminating {pods} pod(s) of priority group >= {} within {}s",
            group.priority,
            group.period.as_secs()
        );
        self.event(false, "ShutdownGroupStarted", note);
    }

    pub fn group_finished(&self, result: &GroupResult) {
        let clean = matches!(
            result.end,
            GroupEnd::Finished {
                still_running: 0,
                ..
            }
        );
        self.event(!clean, "ShutdownGroupFinished", result.note());
    }

    pub fn shutdown_finished(&self, summary: &ShutdownSummary) {
        self.event(
            summary.budget_ran_out(),
            "NodeShutdownCompleted",
            summary.note(),
        );
    }

    /// Restarted while logind was already shutting down: logind grants no new delay lock then,
    /// so the agent finishes the pods' termination without one.
    pub fn resumed_without_inhibitor(&self) {
        self.event(
            true,
            "ShutdownResumedWithoutInhibitor",
            "The agent restarted during a shutdown; it resumes terminating pods, but logind grants \
             no inhibitor while shutting down, so the shutdown may proceed before the pods are done"
                .to_owned(),
        );
    }

    /// logind cancelled the shutdown: undo the markings so the node takes pods again.
    pub fn shutdown_cancelled(&self) {
        self.reporter
            .taint(&self.node, shutting_down_taint(), false);
        self.condition(
            "False",
            "ShutdownCancelled",
            "The shutdown was cancelled.",
            ConditionGuard::Always,
        );
        self.event(
            false,
            "ShutdownCancelled",
            "The node shutdown was cancelled; pods may be scheduled again".to_owned(),
        );
    }

    /// At start-up after a reboot: markings left by the previous boot's shutdown are stale.
    /// The taint goes if present; the condition turns False only where it is True. Both are
    /// retried until the API server answers: one failed read must not leave the taint forever.
    pub fn clear_stale(&self) {
        self.reporter
            .taint(&self.node, shutting_down_taint(), false);
        self.condition(
            "False",
            "NodeStarted",
            "No shutdown in progress; markings of the previous shutdown were cleared.",
            ConditionGuard::OnlyReplacing("True"),
        );
    }

    /// logind is not on the bus (yet): the node is not protected until it is.
    pub fn logind_unavailable(&self, error: &LogindError) {
        self.reporter.event(EventReport::warning(
            node_reference(&self.node),
            "LogindUnavailable",
            "Inhibit",
            format!("Cannot reach logind: {error}"),
        ));
    }

    /// logind grants less delay than the groups need.
    pub fn kubelet_conflict(&self, signs: &[KubeletShutdownSign]) {
        let message = describe_conflict(signs);
        let condition = ConditionSpec::new(
            CONFLICT_CONDITION_TYPE,
            "True",
            "KubeletGracefulShutdown",
            &message,
        );
        self.reporter
            .condition(&self.node, condition, ConditionGuard::Always);
        self.event(true, "KubeletGracefulShutdownConflict", message);
    }

    /// Clears a conflict reported before (never adds the condition to a node that had none).
    pub fn no_kubelet_conflict(&self) {
        let condition = ConditionSpec::new(
            CONFLICT_CONDITION_TYPE,
            "False",
            "NoConflict",
            "The kubelet's graceful node shutdown is off; this agent alone terminates the pods at shutdown.",
        );
        self.reporter
            .condition(&self.node, condition, ConditionGuard::OnlyReplacing("True"));
    }

    pub fn shutdown_writes_too_slow(&self, too_slow: &crate::write_budget::TooSlow) {
        self.reporter.event(EventReport::warning(
            node_reference(&self.node),
            "ShutdownApiLimitTooLow",
            "CheckShutdownBudget",
            too_slow.to_string(),
        ));
    }

    pub fn budget_reduced(&self, wanted_seconds: u64, effective_seconds: u64) {
        self.reporter.event(EventReport::warning(
            node_reference(&self.node),
            "ShutdownBudgetReduced",
            "ConfigureLogind",
            format!(
                "logind allows only {effective_seconds}s of inhibit delay but the priority groups need {wanted_seconds}s; \
                 running with {effective_seconds}s. Raise InhibitDelayMaxSec on the node."
            ),
        ));
    }
}
