//! The machines behind nodes. A controller that ends a node's life (the termination
//! controller) asks an `InstanceProvider` to terminate the machine named by the Node's
//! `spec.providerID`; each cloud (or the simulator) implements it.

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Node;

/// A node's `spec.providerID`, e.g. `aws:///eu-west-1a/i-0abc` or `sim:///node-1`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ProviderId(String);

impl ProviderId {
    /// The machine of `node`; an error names the missing field, since nothing can be
    /// terminated without it.
    pub fn of(node: &Node) -> Result<Self, InstanceError> {
        node.spec
            .as_ref()
            .and_then(|spec| spec.provider_id.as_deref())
            .filter(|id| !id.trim().is_empty())
            .map(|id| Self(id.to_owned()))
            .ok_or_else(|| InstanceError::NoProviderId {
                node: node.metadata.name.clone().unwrap_or_default(),
            })
    }

    /// The scheme before `://`, which says which provider owns the machine.
    pub fn scheme(&self) -> Option<&str> {
        self.0.split_once("://").map(|(scheme, _)| scheme)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for ProviderId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum InstanceError {
    #[error(
        "node {node:?} has no spec.providerID, so its machine cannot be terminated; \
         set it (the cloud's node controller normally does)"
    )]
    NoProviderId { node: String },
    #[error("no instance provider handles {0} (unknown scheme)")]
    UnknownScheme(ProviderId),
    /// The provider did not answer or refused for now; try again later.
    #[error("instance provider: {0}")]
    Transient(String),
    /// The provider will never do it as asked (e.g. permission denied).
    #[error("instance provider refused: {0}")]
    Refused(String),
}

/// What the controllers need from a cloud. Both calls are idempotent: terminating a machine
/// that is already gone succeeds, so a controller that crashed after the call can repeat it.
pub trait InstanceProvider: Send + Sync + std::fmt::Debug {
    /// Asks for the machine to be terminated; returns once the provider accepted the request.
    fn terminate<'a>(&'a self, id: &'a ProviderId) -> BoxFuture<'a, Result<(), InstanceError>>;

    /// Whether the machine still exists (in any state short of terminated).
    fn exists<'a>(&'a self, id: &'a ProviderId) -> BoxFuture<'a, Result<bool, InstanceError>>;
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
        for spec in [json!({}), json!({"providerID": " "})] {
            let node: Node =
                serde_json::from_value(json!({"metadata": {"name": "n2"}, "spec": spec})).unwrap();
            let error = ProviderId::of(&node).unwrap_err().to_string();
            assert!(error.contains("\"n2\" has no spec.providerID"), "{error}");
        }
    }
}
