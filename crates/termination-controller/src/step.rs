//! How a step of a node's termination ends short of done. Every step returns [`Step`], so `?`
//! carries a stop, a node gone or a failure up to the task's loop, which retries failures only
//! (Karpenter's finalize tells "still going" from an error by type the same way).

use nodegrace_core::k8s::node_identity::UpdateError;
use nodegrace_core::k8s::watched::WatchEnded;

/// A step's result: `Ok` goes on to the next step.
pub type Step<T = ()> = Result<T, Halt>;

/// Why a node's termination does not go on past this step.
#[derive(Debug, thiserror::Error)]
pub enum Halt {
    /// Leadership lost or the program stopping: a leader picks the node up where it was.
    #[error("stopped")]
    Stopped,
    /// The Node (by UID) is gone, or a namesake has its name: someone else let it go, and
    /// nothing more is sent for it (pods watched by name may be the namesake's now).
    #[error("the node is gone")]
    NodeGone,
    /// Not ours to do: not deleting, or without our finalizer.
    #[error("not ours")]
    NotOurs,
    /// Not granted by every budget covering it (any more): back to the waiting room.
    #[error("waiting for its budgets")]
    Ungranted,
    /// A request or a watch failed: the task tries again after a backoff.
    #[error(transparent)]
    Failed(#[from] StepError),
}

impl From<kube::Error> for Halt {
    fn from(error: kube::Error) -> Self {
        Self::Failed(error.into())
    }
}

impl From<UpdateError> for Halt {
    fn from(error: UpdateError) -> Self {
        Self::Failed(error.into())
    }
}

impl From<WatchEnded> for Halt {
    fn from(ended: WatchEnded) -> Self {
        Self::Failed(ended.into())
    }
}

/// How a node's termination task ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finished {
    /// Our finalizer is removed, or the Node (by UID) is gone: someone else let it go, and a
    /// namesake that may have taken its name is none of this task's business.
    Released,
    /// Not ours to do (not deleting, or no finalizer of ours).
    NotOurs,
    /// Not granted (any more): the node waits in the leader's waiting room.
    Ungranted,
    /// Leadership lost or the program stopping.
    Stopped,
}

impl Halt {
    /// How the task ends on this halt; a failure is retried instead.
    pub fn finished(self) -> Result<Finished, StepError> {
        match self {
            Self::Stopped => Ok(Finished::Stopped),
            Self::NodeGone => Ok(Finished::Released),
            Self::NotOurs => Ok(Finished::NotOurs),
            Self::Ungranted => Ok(Finished::Ungranted),
            Self::Failed(error) => Err(error),
        }
    }
}

/// A failed request or watch.
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    #[error(transparent)]
    Api(#[from] kube::Error),
    #[error(transparent)]
    Update(#[from] UpdateError),
    #[error("a watch ended")]
    WatchEnded,
}

impl From<WatchEnded> for StepError {
    fn from(_: WatchEnded) -> Self {
        Self::WatchEnded
    }
}

impl StepError {
    /// The `kind` label of the errors metric.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Api(_) | Self::Update(UpdateError::Api(_)) => "api",
            Self::Update(UpdateError::Contended(_)) => "conflict",
            Self::WatchEnded => "watch",
        }
    }
}
