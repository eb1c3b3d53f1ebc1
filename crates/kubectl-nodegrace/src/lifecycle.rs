//! What the plugin answers, as `-o json|yaml` prints it: a stable schema (docs/kubectl-nodegrace.md
//! documents every field). New fields may come; none changes meaning or goes within
//! `nodegrace.io/v1alpha1`.

use jiff::Timestamp;
use serde::Serialize;

pub const API_VERSION: &str = "nodegrace.io/v1alpha1";

/// The program whose work a row describes, by its Helm chart's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Program {
    GracefulShutdownAgent,
    ShutdownInhibitorAgent,
    OutOfServiceGc,
    TerminationController,
}

impl Program {
    pub const ALL: [Self; 4] = [
        Self::GracefulShutdownAgent,
        Self::ShutdownInhibitorAgent,
        Self::OutOfServiceGc,
        Self::TerminationController,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Self::GracefulShutdownAgent => "graceful-shutdown-agent",
            Self::ShutdownInhibitorAgent => "shutdown-inhibitor-agent",
            Self::OutOfServiceGc => "out-of-service-gc",
            Self::TerminationController => "termination-controller",
        }
    }

    /// The program whose Events carry `reporting_controller` (`nodegrace-<program>`).
    pub fn of_reporter(reporting_controller: &str) -> Option<Self> {
        let name = reporting_controller.strip_prefix("nodegrace-")?;
        Self::ALL.into_iter().find(|program| program.name() == name)
    }
}

/// Where a node stands in one program's work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum State {
    /// graceful-shutdown-agent terminates its pods for a shutdown.
    ShuttingDown,
    /// shutdown-inhibitor-agent holds a block lock: Leases hold the shutdown.
    ShutdownBlocked,
    /// Tainted out of service; nothing is forced yet (the node is Ready, or a guard refused).
    OutOfService,
    /// out-of-service-gc force-deletes its pods and detaches its volumes.
    Cleaning,
    /// Nothing is left to clean; the taint stays until the node is back.
    Cleaned,
    /// NotReady and due to be fenced, or a guard holds the fence.
    FenceWaiting,
    /// The machine's power-off is asked for, not yet confirmed.
    Fencing,
    /// The machine is off and the node tainted.
    Fenced,
    /// The machine is powered on again after the cleanup.
    Recovering,
    /// Not back after the power-on: off again until an operator looks.
    RecoveryFailed,
    /// Deleted, held by termination-controller's finalizer through its steps.
    Deleting,
    /// Named, and in no program's work; in a watch, a node whose work is over.
    Healthy,
    /// In a watch: the Node object is gone.
    Gone,
}

impl State {
    pub fn word(self) -> &'static str {
        match self {
            Self::ShuttingDown => "shutting down",
            Self::ShutdownBlocked => "shutdown blocked",
            Self::OutOfService => "out of service",
            Self::Cleaning => "cleaning",
            Self::Cleaned => "cleaned",
            Self::FenceWaiting => "fence waiting",
            Self::Fencing => "fencing",
            Self::Fenced => "fenced",
            Self::Recovering => "recovering",
            Self::RecoveryFailed => "recovery failed",
            Self::Deleting => "deleting",
            Self::Healthy => "healthy",
            Self::Gone => "gone",
        }
    }
}

/// An object, and the field of it that holds the node when that is what to change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectRef {
    pub kind: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub name: String,
    /// An annotation or label key of the object, when the hold is that one key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

impl ObjectRef {
    pub fn new(kind: &str, namespace: Option<&str>, name: &str) -> Self {
        Self {
            kind: kind.to_owned(),
            namespace: namespace.map(ToOwned::to_owned),
            name: name.to_owned(),
            key: None,
        }
    }

    #[must_use]
    pub fn key(mut self, key: &str) -> Self {
        self.key = Some(key.to_owned());
        self
    }
}

impl std::fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.namespace {
            Some(namespace) => write!(f, "{} {namespace}/{}", self.kind, self.name),
            None => write!(f, "{} {}", self.kind, self.name),
        }
    }
}

/// What holds the node now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Blocker {
    pub text: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub object: Option<ObjectRef>,
}

/// What would move the node on: always a sentence, and a command to copy when one would.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Next {
    pub text: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
}

impl Next {
    pub fn wait(text: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            command: None,
        }
    }

    pub fn run(text: impl Into<String>, command: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            command: Some(command.into()),
        }
    }
}

/// One node in one program's work.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeLifecycle {
    pub node: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub program: Option<Program>,
    pub state: State,
    /// The program's own word for its step: the reason of the condition it writes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub since: Option<Timestamp>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub blocked_by: Option<Blocker>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next: Option<Next>,
}

/// Whether a program is installed, as far as its workload tells.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Presence {
    pub program: Program,
    /// `None` when its workload could not be read.
    pub installed: Option<bool>,
    /// Where it was found: `Deployment ns/name`, `DaemonSet ns/name`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub found: Vec<String>,
}

/// `kubectl nodegrace status`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    pub api_version: &'static str,
    pub kind: &'static str,
    pub observed_at: Timestamp,
    pub nodes: Vec<NodeLifecycle>,
    pub programs: Vec<Presence>,
    /// What could not be read, one line each; the rest stands without it.
    pub unread: Vec<String>,
}
