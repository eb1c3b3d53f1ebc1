//! What an operator reads on the node: the `OutOfServiceCleanup` condition, and the Events.

use nodegrace_core::k8s::conditions::ConditionSpec;

pub const CONDITION: &str = "OutOfServiceCleanup";
/// The reason of the `DisruptionTarget` condition put on a pod before it is force-deleted, in
/// the manner of the pod GC's `DeletionByPodGC`.
pub const DISRUPTION_REASON: &str = "DeletionByOutOfServiceGC";
/// Set by an external fencing agent: the node's machine is powered off for sure.
pub const FENCED_ANNOTATION: &str = "nodegrace.io/fenced";
/// The value `--auto-taint-after` gives the taint, as the KEP's example.
pub const AUTO_TAINT_VALUE: &str = "nodeshutdown";

/// Where a tainted node's cleanup stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Phase {
    /// Tainted, nothing to do yet (the node is Ready) or waiting for leftovers to go.
    Pending(String),
    /// The liveness guard refused.
    Refused(String),
    /// Pods are being force-deleted and volumes detached.
    Cleaning { pods: usize, attachments: usize },
    /// Nothing left on the node; with `auto_untaint`, the taint goes once the node is back.
    Done { auto_untaint: bool },
    /// The taint is gone.
    TaintRemoved,
}

impl Phase {
    pub fn condition(&self) -> ConditionSpec {
        match self {
            Self::Pending(message) => ConditionSpec::new(CONDITION, "False", "Pending", message),
            Self::Refused(message) => ConditionSpec::new(CONDITION, "False", "Refused", message),
            Self::Cleaning { pods, attachments } => ConditionSpec::new(
                CONDITION,
                "True",
                "Cleaning",
                format!(
                    "{pods} {} to force-delete and {attachments} volume {} left",
                    plural(*pods, "pod", "pods"),
                    plural(*attachments, "attachment", "attachments")
                ),
            ),
            Self::Done { auto_untaint } => ConditionSpec::new(
                CONDITION,
                "True",
                "Done",
                format!(
                    "No pod that does not tolerate the out-of-service taint and no volume \
                     attachment is left on this node; {}",
                    after_cleanup(*auto_untaint)
                ),
            ),
            Self::TaintRemoved => ConditionSpec::new(
                CONDITION,
                "False",
                "TaintRemoved",
                "The node has no out-of-service taint",
            ),
        }
    }
}

/// What happens to the taint once the node is clean.
pub fn after_cleanup(auto_untaint: bool) -> &'static str {
    if auto_untaint {
        "the taint is removed once the node is Ready again"
    } else {
        "remove the taint once the node is back"
    }
}

pub fn plural<'a>(count: usize, one: &'a str, many: &'a str) -> &'a str {
    if count == 1 { one } else { many }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_count_what_is_left() {
        let condition = Phase::Cleaning {
            pods: 1,
            attachments: 2,
        }
        .condition();
        assert_eq!(condition.status, "True");
        assert_eq!(
            condition.message,
            "1 pod to force-delete and 2 volume attachments left"
        );
        let done = Phase::Done {
            auto_untaint: false,
        }
        .condition();
        assert_eq!(done.reason, "Done");
        assert!(
            done.message
                .ends_with("remove the taint once the node is back")
        );
        let done = Phase::Done { auto_untaint: true }.condition();
        assert!(
            done.message
                .ends_with("removed once the node is Ready again")
        );
        assert_eq!(Phase::Refused("x".into()).condition().status, "False");
    }
}
