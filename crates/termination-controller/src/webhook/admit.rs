//! What the webhook says about a Node CREATE or DELETE.
//!
//! A DELETE of a managed node takes the node's NodeDisruptionBudget grants through the same
//! status record the controller uses (an update carrying the resourceVersion), so two
//! DELETEs admitted at once never both take the last unit. `deny` refuses a DELETE the budgets
//! do not allow; `queue` admits it with a warning and the controller holds the node until
//! they do. A dry run takes nothing.

use nodegrace_core::k8s::cached_node::CachedNode;
use serde_json::json;

use crate::api::FINALIZER;
use crate::grants::Budgets;
use crate::member::Member;
use crate::metrics::Metrics;
use crate::shared::Settings;
use crate::waits::Verdict;
use crate::webhook::review::{Answer, NodeOperation, NodeReview};

/// What happens to a DELETE the budgets do not allow now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// Admit it; the node waits, held by the finalizer, until the budgets grant it.
    Queue,
    /// Refuse it, naming the budget and its numbers.
    Deny,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queue => "queue",
            Self::Deny => "deny",
        }
    }
}

#[derive(Debug, Clone)]
pub struct Admission {
    pub mode: Mode,
    pub settings: Settings,
    pub budgets: Budgets,
    pub metrics: Metrics,
}

impl Admission {
    pub async fn review(&self, review: &NodeReview) -> Answer {
        let (operation, answer) = match review.operation {
            NodeOperation::Create => ("CREATE", self.create(&review.node)),
            NodeOperation::Delete => ("DELETE", self.delete(review).await),
        };
        let verdict = match (&answer.denial, answer.warnings.is_empty()) {
            (Some(_), _) => "denied",
            (None, false) => "queued",
            (None, true) => "allowed",
        };
        self.metrics.webhook_review(operation, verdict);
        answer
    }

    /// A managed node is born with the finalizer, so it is held from its first moment.
    fn create(&self, node: &CachedNode) -> Answer {
        if !self.settings.manages(node) {
            return Answer::allow();
        }
        let patch = match &node.metadata.finalizers {
            Some(finalizers) if finalizers.iter().any(|f| f == FINALIZER) => {
                return Answer::allow();
            }
            Some(_) => json!({"op": "add", "path": "/metadata/finalizers/-", "value": FINALIZER}),
            None => json!({"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER]}),
        };
        Answer {
            patch: vec![patch],
            ..Answer::allow()
        }
    }

    async fn delete(&self, review: &NodeReview) -> Answer {
        let node = &review.node;
        let name = node.metadata.name.as_deref().unwrap_or_default();
        // A node already being deleted was counted when its first DELETE was admitted.
        if !self.settings.manages(node) || node.metadata.deletion_timestamp.is_some() {
            return Answer::allow();
        }
        let verdict = if review.dry_run {
            Ok(self.budgets.verdict(node))
        } else {
            self.budgets.acquire(node).await
        };
        match verdict {
            Ok(Verdict::Granted { .. }) => Answer::allow(),
            Ok(Verdict::Waiting { budget, refusal }) => {
                let why = format!("NodeDisruptionBudget {budget}: {refusal}");
                match self.mode {
                    Mode::Deny => {
                        if !review.dry_run {
                            self.give_back(node, &budget).await;
                        }
                        Answer::deny(
                            403,
                            "Forbidden",
                            format!(
                                "deleting node {name} now would exceed {why}; retry once a \
                                 node of the budget is back"
                            ),
                        )
                    }
                    Mode::Queue => Answer {
                        warnings: vec![format!(
                            "node {name} waits for {why}; termination-controller drains it once \
                             the budget allows"
                        )],
                        ..Answer::allow()
                    },
                }
            }
            Err(error) => {
                tracing::warn!(node = name, %error, "cannot take the NodeDisruptionBudget grants");
                self.metrics.error("webhook-grant");
                match self.mode {
                    Mode::Deny => Answer::deny(
                        500,
                        "InternalError",
                        format!(
                            "cannot take the NodeDisruptionBudget grants for node {name}: {error}; \
                             retry"
                        ),
                    ),
                    Mode::Queue => Answer {
                        warnings: vec![format!(
                            "node {name}: the budgets could not be checked now ({error}); \
                             termination-controller waits for their grant before draining"
                        )],
                        ..Answer::allow()
                    },
                }
            }
        }
    }

    /// A refused DELETE keeps none of the grants it took from the budgets before `refusing`.
    async fn give_back(&self, node: &CachedNode, refusing: &str) {
        let name = node.metadata.name.as_deref().unwrap_or_default();
        let taken: Vec<String> = self
            .budgets
            .covering(&node.facts())
            .into_iter()
            .map(|budget| budget.name().to_owned())
            .take_while(|budget| budget != refusing)
            .collect();
        if let Err(error) = self.budgets.release(node, &taken).await {
            tracing::warn!(node = name, %error, "cannot give back grants; they expire unused");
        }
    }
}
