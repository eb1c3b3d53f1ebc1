//! The machines behind nodes. A controller asks an `InstanceProvider` about the machine named
//! by a Node's `spec.providerID`: whether it is powered off (the out-of-service GC taints a
//! node only then), and to terminate it (the termination controller). Providers here: kube-sim's
//! cloud (`sim`), and any cloud through a command of the operator's (`exec`).

mod exec;
mod sim;

pub use exec::ExecInstances;
pub use sim::SimInstances;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Node;

/// A node's `spec.providerID`, e.g. `aws:///eu-west-1a/i-0abc` or `sim:///node-1`, with the
/// name of the node it was read from (an `exec` provider's command gets both).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ProviderId {
    id: String,
    node: Option<String>,
}

impl ProviderId {
    /// The machine of `node`; an error names the missing field, since nothing can be
    /// terminated without it.
    pub fn of(node: &Node) -> Result<Self, InstanceError> {
        node.spec
            .as_ref()
            .and_then(|spec| spec.provider_id.as_deref())
            .filter(|id| !id.trim().is_empty())
            .map(|id| Self {
                id: id.to_owned(),
                node: node.metadata.name.clone(),
            })
            .ok_or_else(|| InstanceError::NoProviderId {
                node: node.metadata.name.clone().unwrap_or_default(),
            })
    }

    /// The scheme before `://`, which says which provider owns the machine.
    pub fn scheme(&self) -> Option<&str> {
        self.id.split_once("://").map(|(scheme, _)| scheme)
    }

    pub fn as_str(&self) -> &str {
        &self.id
    }

    /// The node the id was read from, when it was read from one.
    pub fn node(&self) -> Option<&str> {
        self.node.as_deref()
    }

    /// The part after `<scheme>://` with leading slashes trimmed (`sim:///n1` → `n1`), when the
    /// id has that scheme.
    pub fn machine(&self, scheme: &str) -> Option<&str> {
        self.id
            .strip_prefix(scheme)?
            .strip_prefix("://")
            .map(|rest| rest.trim_start_matches('/'))
            .filter(|rest| !rest.is_empty())
    }

    /// The id as read from the node named `node`.
    #[must_use]
    pub fn read_from(self, node: &str) -> Self {
        Self {
            node: Some(node.to_owned()),
            ..self
        }
    }

    /// An id as a provider answers it (tests, and providers' own lookups).
    pub fn new(id: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            node: None,
        }
    }
}

impl std::fmt::Display for ProviderId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.id)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum InstanceError {
    #[error(
        "node {node:?} has no spec.providerID, so its machine cannot be terminated; \
         set it (the cloud's node controller normally does)"
    )]
    NoProviderId { node: String },
    /// The node read is not the Node object the work began on (deleted, a namesake now).
    #[error("node {node} is gone or was replaced by a namesake; its machine is not asked about")]
    NotThisNode { node: String },
    #[error("no instance provider handles {0} (unknown scheme)")]
    UnknownScheme(ProviderId),
    /// The provider did not answer or refused for now; try again later.
    #[error("instance provider: {0}")]
    Transient(String),
    /// The provider will never do it as asked (e.g. permission denied).
    #[error("instance provider refused: {0}")]
    Refused(String),
}

impl InstanceError {
    /// The kind of failure, for keys and labels that must not grow with the message text.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::NoProviderId { .. } => "no-provider-id",
            Self::NotThisNode { .. } => "not-this-node",
            Self::UnknownScheme(_) => "unknown-scheme",
            Self::Transient(_) => "transient",
            Self::Refused(_) => "refused",
        }
    }
}

/// What a provider knows of a machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InstanceState {
    Running,
    /// Powered off, but still there.
    Stopped,
    /// Gone (a machine the provider no longer knows counts as terminated).
    Terminated,
}

impl InstanceState {
    /// Whether nothing can run on the machine: the confirmation the KEP asks an operator for
    /// before the out-of-service taint.
    pub fn powered_off(self) -> bool {
        matches!(self, Self::Stopped | Self::Terminated)
    }

    /// The words the providers use: `running`, `stopped`, `terminated`.
    pub fn parse(word: &str) -> Option<Self> {
        match word {
            "running" => Some(Self::Running),
            "stopped" => Some(Self::Stopped),
            "terminated" => Some(Self::Terminated),
            _ => None,
        }
    }
}

/// What the controllers need from a cloud. Both calls are idempotent: terminating a machine
/// that is already gone succeeds, so a controller that crashed after the call can repeat it.
pub trait InstanceProvider: Send + Sync + std::fmt::Debug {
    /// The machine's state now.
    fn state<'a>(
        &'a self,
        id: &'a ProviderId,
    ) -> BoxFuture<'a, Result<InstanceState, InstanceError>>;

    /// Asks for the machine to be terminated; returns once the provider accepted the request.
    fn terminate<'a>(&'a self, id: &'a ProviderId) -> BoxFuture<'a, Result<(), InstanceError>>;
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_provider_id_comes_from_the_spec_or_the_error_names_the_field() {
        let node: Node = serde_json::from_value(
            json!({"metadata": {"name": "n1"}, "spec": {"providerID": "sim:///n1"}}),
        )
        .unwrap();
        let id = ProviderId::of(&node).unwrap();
        assert_eq!(id.scheme(), Some("sim"));
        assert_eq!(id.as_str(), "sim:///n1");
        assert_eq!(id.machine("sim"), Some("n1"));
        assert_eq!(id.machine("aws"), None);
        assert_eq!(id.node(), Some("n1"));
        for spec in [json!({}), json!({"providerID": " "})] {
            let node: Node =
                serde_json::from_value(json!({"metadata": {"name": "n2"}, "spec": spec})).unwrap();
            let error = ProviderId::of(&node).unwrap_err().to_string();
            assert!(error.contains("\"n2\" has no spec.providerID"), "{error}");
        }
    }

    #[test]
    fn a_failure_kind_does_not_carry_its_text() {
        // Warnings are keyed by kind: a request ID in the text must not make a new one.
        let first = InstanceError::Transient("timeout, request id 1".to_owned());
        let second = InstanceError::Transient("timeout, request id 2".to_owned());
        assert_eq!(first.kind(), second.kind());
        assert_ne!(
            first.kind(),
            InstanceError::Refused("denied".to_owned()).kind()
        );
    }

    #[test]
    fn only_stopped_or_terminated_machines_are_powered_off() {
        assert!(!InstanceState::Running.powered_off());
        assert!(InstanceState::Stopped.powered_off());
        assert!(InstanceState::Terminated.powered_off());
        assert_eq!(
            InstanceState::parse("stopped"),
            Some(InstanceState::Stopped)
        );
        assert_eq!(InstanceState::parse("Stopped"), None);
    }
}
