//! Every reason this controller gives, in the node conditions `OutOfServiceCleanup` and
//! `OutOfServiceFence`, in its Events and in a force-deleted pod's `DisruptionTarget`: a reason
//! seen in `kubectl describe` leads here, to one definition; the map at the top of the crate
//! says which function gives it and what it waits on.

nodegrace_core::reasons! {
    // `OutOfServiceCleanup`, and its Events.
    /// Tainted, nothing to force yet: the node is Ready, or leftovers from before must go.
    Pending,
    /// The liveness guard refused: the kubelet still reports.
    Refused,
    /// Pods are being force-deleted and volumes detached.
    Cleaning,
    /// Nothing left that must go; with `--auto-untaint` the taint goes once the node is back.
    Done,
    /// The taint is gone.
    TaintRemoved,
    /// Event: the cleanup of a node began.
    OutOfServiceCleanupStarted,
    /// Event: the cleanup found nothing more to do.
    OutOfServiceCleanupDone,
    /// Event: the liveness guard refused the cleanup.
    OutOfServiceCleanupRefused,
    /// Event (Warning): the taint's effect is not `NoExecute`.
    OutOfServiceTaintEffect,
    /// Event on a pod: force-deleted.
    ForceDeleted,
    /// Event on a pod: force-deleted, but another controller's finalizer keeps it.
    ForceDeletedHeldByFinalizers,
    /// Event: a VolumeAttachment of the node was deleted.
    VolumeForceDetached,
    /// Event: `--auto-taint-after` or a fence added the taint.
    OutOfServiceTaintAdded,
    /// Event: `--auto-untaint` removed the taint.
    OutOfServiceTaintRemoved,
    /// Event (Warning): `--auto-taint-after` found a node not confirmed powered off.
    OutOfServiceNotConfirmed,
    /// A force-deleted pod's `DisruptionTarget`, as the pod GC's `DeletionByPodGC`.
    DeletionByOutOfServiceGC,

    // `OutOfServiceFence`, and the Events of the same names.
    /// NotReady: fenced at the time the message says unless it comes back.
    NotReadySeen,
    /// Held: `nodegrace.io/do-not-fence`.
    FenceHeldDoNotFence,
    /// Held: the kubelet's Lease was renewed within the guard's window.
    FenceHeldHeartbeat,
    /// Held: so many nodes NotReady at once is taken for a partition.
    FenceHeldPartition,
    /// Held: `--max-fenced` machines are fenced already.
    FenceHeldMaxFenced,
    /// Held: the provider does not know the machine.
    FenceHeldMachineNotFound,
    /// Held: the provider could not answer for the machine.
    FenceHeldProvider,
    /// The power-off is asked for.
    Fencing,
    /// The provider reports the machine off; the node is tainted.
    Fenced,
    /// The power-off failed or was not confirmed in time; tried again on the backoff.
    FenceFailed,
    /// The node turned Ready before the machine was reported off.
    FenceCancelled,
    /// The machine went off after the node had turned Ready again: powered on again.
    FencedAfterBack,
    /// The clean machine is powered on.
    PoweringOn,
    /// Powering the clean machine on failed; tried again on the backoff.
    PowerOnFailed,
    /// The node is being deleted: its machine stays off and goes with it.
    LeftOffForDeletion,
    /// The node is back Ready after the power-on.
    Recovered,
    /// Not Ready within `--recover-timeout`: powered off again and left off.
    RecoveryFailed,
}

#[cfg(test)]
mod tests {
    use super::*;
    use nodegrace_core::reasons::unnamed_in;

    /// Every reason is in the crate's map and in the operator's page, so one seen on a node
    /// leads to the function that gave it from the docs as from the code.
    #[test]
    fn every_reason_is_in_the_map_and_the_docs() {
        let code_map = include_str!("lib.rs");
        let docs = include_str!("../../../docs/out-of-service-gc.md");
        let reasons = || Reason::ALL.iter().map(|reason| reason.as_str());
        assert_eq!(unnamed_in(reasons(), code_map), [""; 0], "lib.rs's map");
        assert_eq!(
            unnamed_in(reasons(), docs),
            [""; 0],
            "docs/out-of-service-gc.md"
        );
    }
}
