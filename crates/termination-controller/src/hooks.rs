//! Hooks: other controllers (storage, backup, a load balancer's) hold a deleting node at a
//! step by an annotation of their own, and let it go by removing it — Cluster API's
//! `pre-drain.delete.hook.machine.cluster.x-k8s.io/<name>` and `pre-terminate…` contract.

use nodegrace_core::k8s::cached_node::CachedNode;

use crate::api::{PRE_DRAIN_HOOK_PREFIX, PRE_TERMINATE_HOOK_PREFIX};
use crate::conditions::Reason;

/// The step a hook holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// After the budgets' grant, before the cordon and the drain.
    PreDrain,
    /// After the drain and the volumes, before the machine is terminated.
    PreTerminate,
}

impl Stage {
    pub fn prefix(self) -> &'static str {
        match self {
            Self::PreDrain => PRE_DRAIN_HOOK_PREFIX,
            Self::PreTerminate => PRE_TERMINATE_HOOK_PREFIX,
        }
    }

    /// The `Terminating` condition's reason while the node waits at this stage.
    pub fn reason(self) -> Reason {
        match self {
            Self::PreDrain => Reason::AwaitingPreDrainHooks,
            Self::PreTerminate => Reason::AwaitingPreTerminateHooks,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Self::PreDrain => "pre-drain",
            Self::PreTerminate => "pre-terminate",
        }
    }
}

/// The names of the hooks holding `node` at `stage`, sorted.
pub fn pending(node: &CachedNode, stage: Stage) -> Vec<String> {
    let mut names: Vec<String> = node
        .metadata
        .annotations
        .iter()
        .flatten()
        .filter_map(|(key, _)| key.strip_prefix(stage.prefix()))
        .filter(|name| !name.is_empty())
        .map(str::to_owned)
        .collect();
    names.sort();
    names
}

/// Whether `key` is a hook annotation of any stage (a change of one wakes the node's task).
pub fn is_hook(key: &str) -> bool {
    key.starts_with(PRE_DRAIN_HOOK_PREFIX) || key.starts_with(PRE_TERMINATE_HOOK_PREFIX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn hooks_are_read_per_stage_by_their_annotation_prefix() {
        let node: CachedNode =
            serde_json::from_value(json!({"metadata": {"name": "n", "annotations": {
                "pre-drain.nodegrace.io/rook": "",
                "pre-drain.nodegrace.io/backup": "until the snapshot is done",
                "pre-terminate.nodegrace.io/lb": "",
                "pre-drain.nodegrace.io/": "a prefix alone names no hook",
                "nodegrace.io/other": "",
                "pre-drain.delete.hook.machine.cluster.x-k8s.io/capi": "",
            }}}))
            .unwrap();
        assert_eq!(pending(&node, Stage::PreDrain), ["backup", "rook"]);
        assert_eq!(pending(&node, Stage::PreTerminate), ["lb"]);
        assert!(is_hook("pre-terminate.nodegrace.io/lb"));
        assert!(!is_hook("nodegrace.io/other"));
    }
}
