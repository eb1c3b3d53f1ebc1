//! Which Leases block the shutdown. A Lease counts when it is named after this node, lives
//! outside kube-node-lease, has a holder and an acquireTime. renewTime and
//! leaseDurationSeconds are ignored on purpose (see the KEP): a holder that stops renewing
//! must still block, since it may be in the middle of an uninterruptible task.

use std::collections::{BTreeMap, BTreeSet};

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
pub use nodegrace_core::k8s::node_shutdown::{Activity, activity};
use nodegrace_core::k8s::selectors::selector_matches;

/// The namespace the kubelets' heartbeat Leases live in; never an inhibitor.
pub const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";

/// The field selector that makes the API server send this agent its own Leases only.
pub fn field_selector(node: &str) -> String {
    format!("metadata.name={node},metadata.namespace!={NODE_LEASE_NAMESPACE}")
}

/// Whose Leases may block the node: the security boundary, since anyone who can create a
/// Lease there can hold the node's shutdown. Empty namespaces: every one but kube-node-lease.
#[derive(Debug, Clone, Default)]
pub struct Scope {
    pub namespaces: BTreeSet<String>,
    pub selector: LabelSelector,
    /// The selector as given (kubectl's -l syntax), for the watch.
    pub selector_text: String,
}

impl Scope {
    pub fn admits(&self, lease: &Lease) -> bool {
        let namespace = lease.metadata.namespace.as_deref().unwrap_or_default();
        let labels = lease.metadata.labels.clone().unwrap_or_default();
        namespace != NODE_LEASE_NAMESPACE
            && (self.namespaces.is_empty() || self.namespaces.contains(namespace))
            && selector_matches(&self.selector, &labels).unwrap_or(false)
    }
}

/// An active Lease, by namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub namespace: String,
    pub holder: String,
    pub acquired: Timestamp,
}

/// The active Leases among `leases` that concern `node` and are in `scope` (the watch
/// filters by name and labels; the namespaces are filtered here).
pub fn active_holders<'a>(
    node: &str,
    scope: &Scope,
    leases: impl IntoIterator<Item = &'a Lease>,
) -> Vec<Holder> {
    let mut holders: BTreeMap<String, Holder> = BTreeMap::new();
    for lease in leases {
        let namespace = lease.metadata.namespace.clone().unwrap_or_default();
        if lease.metadata.name.as_deref() != Some(node) || !scope.admits(lease) {
            continue;
        }
        if let Activity::Active { holder, acquired } = activity(lease) {
            holders.insert(
                namespace.clone(),
                Holder {
                    namespace,
                    holder,
                    acquired,
                },
            );
        }
    }
    holders.into_values().collect()
}

/// `ns-a/holder-1, ns-b/holder-2`, sorted: the condition message and the inhibitor's why.
pub fn describe(holders: &[Holder]) -> String {
    let mut names: Vec<String> = holders
        .iter()
        .map(|h| format!("{}/{}", h.namespace, h.holder))
        .collect();
    names.sort();
    names.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn lease(namespace: &str, name: &str, holder: Option<&str>, acquired: Option<&str>) -> Lease {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"holderIdentity": holder, "acquireTime": acquired, "renewTime": "2020-01-01T00:00:00.000000Z", "leaseDurationSeconds": 1},
        }))
        .unwrap()
    }

    #[test]
    fn activity_rules() {
        assert_eq!(activity(&lease("a", "n1", None, None)), Activity::Free);
        assert_eq!(
            activity(&lease("a", "n1", Some(""), Some("2026-01-01T00:00:00Z"))),
            Activity::Free
        );
        assert_eq!(
            activity(&lease("a", "n1", Some("job"), None)),
            Activity::Incomplete {
                holder: "job".into()
            }
        );
        // An expired renewTime does not matter: the holder may be mid-task.
        assert!(matches!(
            activity(&lease("a", "n1", Some("job"), Some("2026-01-01T00:00:00Z"))),
            Activity::Active { .. }
        ));
    }

    #[test]
    fn only_this_nodes_leases_outside_kube_node_lease_count_and_they_stack() {
        let t = Some("2026-01-01T00:00:00Z");
        let leases = [
            lease("b", "n1", Some("backup"), t),
            lease("a", "n1", Some("upgrade"), t),
            lease("kube-node-lease", "n1", Some("n1"), t),
            lease("a", "n2", Some("other-node"), t),
            lease("c", "n1", Some("half"), None),
        ];
        let holders = active_holders("n1", &Scope::default(), &leases);
        assert_eq!(describe(&holders), "a/upgrade, b/backup");
        assert!(active_holders("n3", &Scope::default(), &leases).is_empty());
    }

    #[test]
    fn the_selector_excludes_node_heartbeats() {
        assert_eq!(
            field_selector("n1"),
            "metadata.name=n1,metadata.namespace!=kube-node-lease"
        );
    }
}
