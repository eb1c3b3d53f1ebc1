//! What an operator reads on the node: the `OutOfServiceCleanup` condition, and the Events.

use nodegrace_core::k8s::conditions::ConditionSpec;

use crate::api::CLEANUP_CONDITION;
use crate::conditions::Reason;

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
            Self::Pending(message) => ConditionSpec::new(
                CLEANUP_CONDITION,
                "False",
                Reason::Pending.as_str(),
                message,
            ),
            Self::Refused(message) => ConditionSpec::new(
                CLEANUP_CONDITION,
                "False",
                Reason::Refused.as_str(),
                message,
            ),
            Self::Cleaning { pods, attachments } => ConditionSpec::new(
                CLEANUP_CONDITION,
                "True",
                Reason::Cleaning.as_str(),
                format!(
                    "{pods} {} to force-delete and {attachments} volume {} left",
                    plural(*pods, "pod", "pods"),
                    plural(*attachments, "attachment", "attachments")
                ),
            ),
            Self::Done { auto_untaint } => ConditionSpec::new(
                CLEANUP_CONDITION,
                "True",
                Reason::Done.as_str(),
                format!(
                    "No pod that does not tolerate the out-of-service taint and no volume \
                     attachment is left on this node; {}",
                    after_cleanup(*auto_untaint)
                ),
            ),
            Self::TaintRemoved => ConditionSpec::new(
                CLEANUP_CONDITION,
                "False",
                Reason::TaintRemoved.as_str(),
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
