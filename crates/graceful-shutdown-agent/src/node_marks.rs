//! What the agent tells the cluster about the node: the `GracefulShutdown` condition, the
//! taint that keeps new pods away, and Events. Failures are logged and never stop the shutdown:
//! the pods' termination matters more than the markings.

use k8s_openapi::api::core::v1::{Node, ObjectReference, Taint};
use kube::Api;
use nodegrace_core::error_chain::Chain;
use nodegrace_core::k8s::conditions::{ConditionSpec, upsert_node_condition};
use nodegrace_core::k8s::events::{EventPublisher, EventType};
use nodegrace_core::k8s::taints::{add_taint, remove_taint};

use crate::plan::PriorityGroup;
use crate::summary::{GroupEnd, GroupResult, ShutdownSummary};

pub const CONDITION_TYPE: &str = "GracefulShutdown";
pub const TAINT_KEY: &str = "nodegrace.io/shutting-down";

#[derive(Debug, Clone)]
pub struct NodeMarks {
    nodes: Api<Node>,
    node: String,
    events: EventPublisher,
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
    pub fn new(nodes: Api<Node>, node: String, events: EventPublisher) -> Self {
        Self {
            nodes,
            node,
            events,
        }
    }

    fn node_ref(&self) -> ObjectReference {
        ObjectReference {
            api_version: Some("v1".to_owned()),
            kind: Some("Node".to_owned()),
            name: Some(self.node.clone()),
            // Node events are looked up by uid = name, as the kubelet records them.
            uid: Some(self.node.clone()),
            ..ObjectReference::default()
        }
    }

    async fn condition(&self, status: &str, reason: &str, message: &str) {
        let condition = ConditionSpec {
            type_: CONDITION_TYPE,
            status,
            reason,
            message,
        };
        if let Err(error) = upsert_node_condition(&self.nodes, &self.node, &condition).await {
            tracing::warn!(error = %Chain(&error), condition = CONDITION_TYPE, status, "cannot set the node condition");
        }
    }

    async fn event(&self, type_: EventType, reason: &str, action: &str, note: String) {
        self.events
            .publish(&self.node_ref(), type_, reason, action, Some(note))
            .await;
    }

    /// Shutdown begins: condition, taint (so nothing new lands here), Event.
    pub async fn shutting_down(&self) {
        let taint = async {
            if let Err(error) = add_taint(&self.nodes, &self.node, &shutting_down_taint()).await {
                tracing::warn!(error = %Chain(&error), taint = TAINT_KEY, "cannot taint the node");
            }
        };
        tokio::join!(
            self.condition(
                "True",
                "NodeShuttingDown",
                "The node is shutting down; its pods are being terminated in priority order."
            ),
            taint,
            self.event(
                EventType::Normal,
                "NodeShutdown",
                "Shutdown",
                "Node is shutting down; terminating pods by priority".to_owned()
            ),
        );
    }

    /// One Event per group start and end: each keeps its own note (folded into one series,
    /// only the first group's would be seen).
    pub async fn group_started(&self, group: &PriorityGroup, pods: usize) {
        let note = format!(
            "Terminating {pods} pod(s) of priority group >= {} within {}s",
            group.priority,
            group.period.as_secs()
        );
        self.events
            .publish_distinct(
                &self.node_ref(),
                EventType::Normal,
                "ShutdownGroupStarted",
                "Shutdown",
                note,
            )
            .await;
    }

    pub async fn group_finished(&self, result: &GroupResult) {
        let type_ = match result.end {
            GroupEnd::Finished {
                still_running: 0, ..
            } => EventType::Normal,
            _ => EventType::Warning,
        };
        self.events
            .publish_distinct(
                &self.node_ref(),
                type_,
                "ShutdownGroupFinished",
                "Shutdown",
                result.note(),
            )
            .await;
    }

    pub async fn shutdown_finished(&self, summary: &ShutdownSummary) {
        let type_ = if summary.budget_ran_out() {
            EventType::Warning
        } else {
            EventType::Normal
        };
        self.events
            .publish_distinct(
                &self.node_ref(),
                type_,
                "NodeShutdownCompleted",
                "Shutdown",
                summary.note(),
            )
            .await;
    }

    /// Restarted while logind was already shutting down: logind grants no new delay lock then,
    /// so the agent finishes the pods' termination without one.
    pub async fn resumed_without_inhibitor(&self) {
        self.event(
            EventType::Warning,
            "ShutdownResumedWithoutInhibitor",
            "Shutdown",
            "The agent restarted during a shutdown; it resumes terminating pods, but logind grants \
             no inhibitor while shutting down, so the shutdown may proceed before the pods are done"
                .to_owned(),
        )
        .await;
    }

    /// logind cancelled the shutdown: undo the markings so the node takes pods again.
    pub async fn shutdown_cancelled(&self) {
        let untaint = async {
            if let Err(error) = remove_taint(&self.nodes, &self.node, &shutting_down_taint()).await
            {
                tracing::warn!(error = %Chain(&error), taint = TAINT_KEY, "cannot remove the node taint");
            }
        };
        tokio::join!(
            self.condition("False", "ShutdownCancelled", "The shutdown was cancelled."),
            untaint,
            self.event(
                EventType::Normal,
                "ShutdownCancelled",
                "Shutdown",
                "The node shutdown was cancelled; pods may be scheduled again".to_owned()
            ),
        );
    }

    /// At start-up after a reboot: markings left by the previous boot's shutdown are stale.
    pub async fn clear_stale(&self) {
        let marked = self
            .nodes
            .get_opt(&self.node)
            .await
            .ok()
            .flatten()
            .is_some_and(|node| {
                let tainted = node
                    .spec
                    .as_ref()
                    .and_then(|spec| spec.taints.as_ref())
                    .is_some_and(|taints| taints.iter().any(|taint| taint.key == TAINT_KEY));
                let condition_true = node
                    .status
                    .as_ref()
                    .and_then(|status| status.conditions.as_ref())
                    .is_some_and(|conditions| {
                        conditions
                            .iter()
                            .any(|c| c.type_ == CONDITION_TYPE && c.status == "True")
                    });
                tainted || condition_true
            });
        if !marked {
            return;
        }
        let untaint = async {
            if let Err(error) = remove_taint(&self.nodes, &self.node, &shutting_down_taint()).await
            {
                tracing::warn!(error = %Chain(&error), taint = TAINT_KEY, "cannot remove a stale node taint");
            }
        };
        tokio::join!(
            self.condition(
                "False",
                "NodeStarted",
                "No shutdown in progress; markings of the previous shutdown were cleared."
            ),
            untaint,
        );
    }

    /// logind grants less delay than the groups need.
    pub async fn budget_reduced(&self, wanted_seconds: u64, effective_seconds: u64) {
        self.event(
            EventType::Warning,
            "ShutdownBudgetReduced",
            "ConfigureLogind",
            format!(
                "logind allows only {effective_seconds}s of inhibit delay but the priority groups need {wanted_seconds}s; \
                 running with {effective_seconds}s. Raise InhibitDelayMaxSec on the node."
            ),
        )
        .await;
    }
}
