//! The node conditions this controller writes, and every reason it gives in them: a reason
//! seen in `kubectl describe node` leads here, to one definition saying what the node waits
//! on. Which step writes it is in the map at the top of the crate.

/// True from the deletion until the release; its reason says which step holds the node.
pub const TERMINATING: &str = "Terminating";
/// KEP-5683's: True while the node waits for its NodeDisruptionBudgets or their windows.
pub const MAINTENANCE_PLANNED: &str = "MaintenancePlanned";
/// KEP-5683's: True while the drain runs, False once it completed.
pub const DRAIN_IN_PROGRESS: &str = "DrainInProgress";
/// KEP-5683's: True once every pod that had to go is gone.
pub const DRAINED: &str = "Drained";

// The reasons of [`TERMINATING`] and of KEP-5683's conditions, in the order of the steps.
nodegrace_core::reasons! {
    /// `Terminating` and `MaintenancePlanned`: a budget covering the node has no unit to give.
    AwaitingBudget,
    /// `MaintenancePlanned`: a budget covering the node is outside its maintenance windows.
    MaintenanceWindow,
    /// `MaintenancePlanned=False`: the wait is over.
    DisruptionGranted,
    /// `Terminating`: pre-drain hook annotations hold the node before its cordon.
    AwaitingPreDrainHooks,
    /// `DrainInProgress=True`: the drain runs.
    NodeDeleted,
    /// `Terminating`: evictions of the current tier are under way.
    Draining,
    /// `Terminating`: a do-not-evict pod is on the node, so no eviction starts.
    BlockedByDoNotEvict,
    /// `Terminating`: pods a drain rule says to wait for are still running.
    AwaitingPodCompletion,
    /// `DrainInProgress=False` and `Drained=True`: the drain met its criteria.
    DrainCompleted,
    /// `Terminating`: VolumeAttachments of the node are still there.
    AwaitingVolumeDetachment,
    /// `Terminating`: pre-terminate hook annotations hold the machine's termination.
    AwaitingPreTerminateHooks,
    /// `Terminating`: the machine is being terminated (or cannot be: the message says why).
    TerminatingInstance,
}

impl Reason {
    /// The message of a reason that always says the same; the others' messages name what
    /// blocks (the budget, the hooks, the pods, the VolumeAttachments, the machine).
    pub const fn message(self) -> Option<&'static str> {
        match self {
            Self::DisruptionGranted => Some(
                "Its NodeDisruptionBudgets granted the disruption; the node is being terminated",
            ),
            Self::NodeDeleted => Some("The node is deleted; its pods are evicted tier by tier"),
            Self::DrainCompleted => Some("Every pod that had to go is gone"),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nodegrace_core::reasons::unnamed_in;

    /// The map an operator reads first: every reason is in it, so one seen on a node leads to
    /// its step from the docs as from the code.
    #[test]
    fn every_reason_is_in_the_maps_of_the_steps() {
        let docs = include_str!("../../../docs/termination-controller.md");
        let docs_map = docs
            .split("## What happens to a node")
            .nth(1)
            .and_then(|rest| rest.split("\n1. ").next())
            .expect("docs/termination-controller.md has its map under \"What happens to a node\"");
        let code_map = include_str!("lib.rs");
        let reasons = || Reason::ALL.iter().map(|reason| reason.as_str());
        assert_eq!(unnamed_in(reasons(), docs_map), [""; 0], "the docs' map");
        assert_eq!(unnamed_in(reasons(), code_map), [""; 0], "lib.rs's map");
    }
}
