//! The machines behind nodes. A controller asks an `InstanceProvider` about the machine named
//! by a Node's `spec.providerID`: whether it is powered off (the out-of-service GC taints a
//! node only then), and to terminate it (the termination controller). Providers here: AWS EC2
//! (`aws`), Cluster API Machines (`cluster-api`), bare metal through Redfish BMCs (`redfish`),
//! kube-sim's cloud (`sim`), and any cloud through a command of the operator's (`exec`). The
//! contract is written down in docs/core.md.

pub mod aws;
mod batch;
pub mod cluster_api;
mod exec;
mod http;
mod metered;
mod node_machine;
pub mod redfish;
mod sim;

pub use aws::AwsInstances;
pub use cluster_api::ClusterApiInstances;
pub use exec::ExecInstances;
pub use metered::{Metered, ProviderMetrics};
pub use node_machine::NodeMachine;
pub use redfish::RedfishInstances;
pub use sim::SimInstances;

use std::collections::BTreeMap;

use futures::future::BoxFuture;
use nodegrace_core::k8s::nodes::NodeFields;

/// A node's `spec.providerID`, e.g. `aws:///eu-west-1a/i-0abc` or `sim:///node-1`, with the
/// name of the node it was read from (an `exec` provider's command gets both).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ProviderId {
    id: String,
    node: Option<String>,
    /// The node's annotations a provider finds its machine by (Cluster API's
    /// `cluster.x-k8s.io/…`), as read with the id.
    node_annotations: BTreeMap<String, String>,
}

/// The annotation prefix of the node annotations kept with a providerID.
const KEPT_ANNOTATIONS: &str = "cluster.x-k8s.io/";

impl ProviderId {
    /// The machine of `node`; an error names the missing field, since nothing can be
    /// terminated without it.
    pub fn of(node: &impl NodeFields) -> Result<Self, InstanceError> {
        node.provider_id()
            .filter(|id| !id.trim().is_empty())
            .map(|id| Self {
                id: id.to_owned(),
                node: node.meta().name.clone(),
                node_annotations: BTreeMap::new(),
            })
            .map(|id| id.with_annotations_of(node))
            .ok_or_else(|| InstanceError::NoProviderId {
                node: node.meta().name.clone().unwrap_or_default(),
            })
    }

    /// The id with the annotations of `node` a provider finds machines by.
    #[must_use]
    pub fn with_annotations_of(self, node: &impl NodeFields) -> Self {
        let node_annotations = node
            .meta()
            .annotations
            .iter()
            .flatten()
            .filter(|(key, _)| key.starts_with(KEPT_ANNOTATIONS))
            .map(|(key, value)| (key.clone(), value.clone()))
            .collect();
        Self {
            node_annotations,
            ..self
        }
    }

    /// A node annotation read with the id (only `cluster.x-k8s.io/…` ones are kept).
    pub fn node_annotation(&self, key: &str) -> Option<&str> {
        self.node_annotations.get(key).map(String::as_str)
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
            node_annotations: BTreeMap::new(),
        }
    }
}

impl std::fmt::Display for ProviderId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.id)
    }
}

/// Clone: a batched call answers every caller waiting on the same machine with its error.
#[derive(Debug, Clone, thiserror::Error)]
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
    /// The providerID cannot name a machine of this provider (a malformed id, no region).
    #[error("node {node}: {reason}")]
    BadProviderId { node: String, reason: String },
    /// This provider has no such call (power control on a provider without power states).
    #[error("instance provider {provider} cannot {call}: {reason}")]
    Unsupported {
        provider: &'static str,
        call: &'static str,
        reason: &'static str,
    },
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
            Self::BadProviderId { .. } => "bad-provider-id",
            Self::Unsupported { .. } => "unsupported",
        }
    }
}

/// What a provider knows of a machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InstanceState {
    /// Running, or on its way there (EC2 `pending`).
    Running,
    /// On its way to stopped or terminated (EC2 `stopping`, `shutting-down`; Redfish
    /// `PoweringOff`).
    Stopping,
    /// Powered off, but still there.
    Stopped,
    /// Terminated: the provider still lists it, as ended.
    Terminated,
    /// The provider does not know the machine. Not the same as terminated: a cloud that is
    /// eventually consistent answers so for a machine just launched, so a controller counts it
    /// as gone only once it has persisted (`--instance-not-found-confirm`).
    NotFound,
}

impl InstanceState {
    /// Whether nothing can run on the machine: the confirmation the KEP asks an operator for
    /// before the out-of-service taint. A machine the provider cannot find is not confirmed off.
    pub fn powered_off(self) -> bool {
        matches!(self, Self::Stopped | Self::Terminated)
    }

    /// The words the providers use: `running`, `stopping`, `stopped`, `terminated`, `not-found`.
    pub fn parse(word: &str) -> Option<Self> {
        match word {
            "running" => Some(Self::Running),
            "stopping" => Some(Self::Stopping),
            "stopped" => Some(Self::Stopped),
            "terminated" => Some(Self::Terminated),
            "not-found" => Some(Self::NotFound),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Stopping => "stopping",
            Self::Stopped => "stopped",
            Self::Terminated => "terminated",
            Self::NotFound => "not-found",
        }
    }
}

impl std::fmt::Display for InstanceState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The power changes a fencing agent asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Power {
    /// Off at once, without the OS's shutdown (EC2 `StopInstances` with `Force`, Redfish
    /// `ForceOff`): the machine is presumed hung.
    Off,
    On,
}

impl Power {
    /// The change's name in metrics and in kube-sim's cloud (`power-off`, `power-on`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Off => "power-off",
            Self::On => "power-on",
        }
    }
}

/// What the controllers need from a cloud. `terminate` and `power` are idempotent: a machine
/// already gone counts as terminated, so a controller that crashed after the call can repeat it.
/// A wrong region, an endpoint out of reach or rejected credentials are errors, never
/// [`InstanceState::NotFound`].
pub trait InstanceProvider: Send + Sync + std::fmt::Debug {
    /// The provider's name as the flag spells it (`aws`, `sim`, `exec`), for messages and metrics.
    fn name(&self) -> &'static str;

    /// The machine's state now.
    fn state<'a>(
        &'a self,
        id: &'a ProviderId,
    ) -> BoxFuture<'a, Result<InstanceState, InstanceError>>;

    /// Asks for the machine to be terminated; returns once the provider accepted the request,
    /// or answered that it does not know the machine.
    fn terminate<'a>(&'a self, id: &'a ProviderId) -> BoxFuture<'a, Result<(), InstanceError>>;

    /// The state a terminated machine of this provider reads as: `Terminated` for clouds,
    /// `Stopped` for bare metal, which a termination powers off and leaves off.
    fn terminated_as(&self) -> InstanceState {
        InstanceState::Terminated
    }

    /// Why this provider cannot change a machine's power, if it cannot; asked at start by a
    /// program that would fence.
    fn power_unsupported(&self) -> Option<&'static str> {
        Some("it has no power control")
    }

    /// Asks for a power change; returns once the provider accepted it (poll [`Self::state`]
    /// for the outcome).
    fn power<'a>(
        &'a self,
        id: &'a ProviderId,
        power: Power,
    ) -> BoxFuture<'a, Result<(), InstanceError>> {
        let _ = (id, power);
        let reason = self
            .power_unsupported()
            .unwrap_or("it has no power control");
        Box::pin(std::future::ready(Err(InstanceError::Unsupported {
            provider: self.name(),
            call: "change power",
            reason,
        })))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Node;
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
        assert!(!InstanceState::NotFound.powered_off());
        assert!(!InstanceState::Stopping.powered_off());
        for state in [
            InstanceState::Running,
            InstanceState::Stopping,
            InstanceState::Stopped,
            InstanceState::Terminated,
            InstanceState::NotFound,
        ] {
            assert_eq!(InstanceState::parse(state.as_str()), Some(state));
        }
        assert_eq!(InstanceState::parse("Stopped"), None);
    }
}
