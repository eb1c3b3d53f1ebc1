//! The machine of one Node object: a provider is asked about, or told to terminate, only the
//! machine the very Node a piece of work began on named.

use nodegrace_core::k8s::node_identity::NodeIdentity;
use nodegrace_core::k8s::nodes::NodeFields;

use super::{InstanceError, ProviderId};

/// The machine behind a [`NodeIdentity`].
pub trait NodeMachine {
    /// The machine of this Node, for a call to an instance provider: the providerID seen when
    /// the work began, else the one `fresh` (a read of this very Node) carries — the API server
    /// lets a providerID be set once, never changed. `fresh` being a namesake is an error, not
    /// a machine: a namesake's machine is never this work's to ask about or terminate.
    fn machine(&self, fresh: &impl NodeFields) -> Result<ProviderId, InstanceError>;
}

impl NodeMachine for NodeIdentity {
    fn machine(&self, fresh: &impl NodeFields) -> Result<ProviderId, InstanceError> {
        if !self.is(fresh) {
            return Err(InstanceError::NotThisNode {
                node: self.to_string(),
            });
        }
        match self.provider_id() {
            Some(id) => Ok(ProviderId::new(id.to_owned())
                .read_from(self.name())
                .with_annotations_of(fresh)),
            None => ProviderId::of(fresh),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Node;
    use serde_json::json;

    fn node(name: &str, uid: Option<&str>) -> Node {
        serde_json::from_value(json!({"metadata": {"name": name, "uid": uid}})).unwrap()
    }

    #[test]
    fn the_machine_is_the_one_this_node_named() {
        let mut first = node("n1", Some("a"));
        first.spec = Some(k8s_openapi::api::core::v1::NodeSpec {
            provider_id: Some("sim:///machine-a".into()),
            ..Default::default()
        });
        let identity = NodeIdentity::of(&first).unwrap();
        let machine = identity.machine(&first).unwrap();
        assert_eq!(machine.as_str(), "sim:///machine-a");
        assert_eq!(machine.node(), Some("n1"));

        let mut namesake = first.clone();
        namesake.metadata.uid = Some("b".into());
        namesake.spec.as_mut().unwrap().provider_id = Some("sim:///machine-b".into());
        let refused = identity.machine(&namesake).unwrap_err();
        assert!(refused.to_string().contains("n1 (uid a)"), "{refused}");

        // Registered before its cloud set the id: the fresh read of the same object names it.
        let early = NodeIdentity::of(&node("n1", Some("a"))).unwrap();
        assert_eq!(early.machine(&first).unwrap().as_str(), "sim:///machine-a");
        assert_eq!(
            early, identity,
            "the same Node, whatever was seen of its machine"
        );
    }
}
