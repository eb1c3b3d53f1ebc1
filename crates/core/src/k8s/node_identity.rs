//! One Node object, not its name. A name is reused the moment a node is deleted and a machine
//! registers again under it; work that began on one Node (a drain, a machine's termination, a
//! budget grant, a force cleanup, an out-of-service taint) must never pass to its namesake.
//! Both controllers key their per-node work by [`NodeIdentity`]: every read through it drops a
//! namesake, every write carries the UID and resourceVersion it read, and a machine is asked
//! about or terminated only under the providerID of this very object (nodegrace-controller's
//! `NodeMachine`) — so the wrong act cannot be written.

use std::fmt::Debug;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use kube::{Api, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::k8s::api_errors::status_code;
use crate::k8s::nodes::NodeFields;
use crate::k8s::watched::Watched;

/// A Node as a program reads and writes it: whole (`Node`), or as a cache of thousands keeps
/// it ([`crate::k8s::cached_node::CachedNode`]). Writes are JSON patches of what changed, so
/// a form that lacks fields never drops them.
pub trait NodeObject:
    NodeFields + Clone + DeserializeOwned + Serialize + Debug + Send + Sync + 'static
{
}

impl<K> NodeObject for K where
    K: NodeFields + Clone + DeserializeOwned + Serialize + Debug + Send + Sync + 'static
{
}

/// How many conflicting writes an update absorbs before giving up for now.
const CONFLICT_RETRIES: usize = 5;

/// A Node as it was when work on it began: its name, its UID, and the machine it named.
/// Two identities are the same Node when name and UID agree (a providerID may be set after
/// the start, never changed).
#[derive(Debug, Clone)]
pub struct NodeIdentity {
    name: String,
    uid: String,
    provider_id: Option<String>,
}

impl PartialEq for NodeIdentity {
    fn eq(&self, other: &Self) -> bool {
        (&self.name, &self.uid) == (&other.name, &other.uid)
    }
}

impl Eq for NodeIdentity {}

impl std::hash::Hash for NodeIdentity {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        (&self.name, &self.uid).hash(state);
    }
}

impl PartialOrd for NodeIdentity {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for NodeIdentity {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (&self.name, &self.uid).cmp(&(&other.name, &other.uid))
    }
}

/// What an update through [`NodeIdentity::update`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum Updated<K = Node> {
    /// Written; the node as the API server returned it.
    Written(Box<K>),
    /// Nothing to change; the node as read.
    Unchanged(Box<K>),
    /// No Node with this UID exists any more: it is gone, or a namesake took its name.
    Gone,
}

#[derive(Debug, thiserror::Error)]
pub enum UpdateError {
    #[error(transparent)]
    Api(#[from] kube::Error),
    #[error("node {0} kept changing underneath {CONFLICT_RETRIES} updates in a row; retrying")]
    Contended(String),
}

impl NodeIdentity {
    /// The identity of `node`; `None` for an object without a UID (never stored by an API
    /// server, so nothing to act on).
    pub fn of(node: &impl NodeFields) -> Option<Self> {
        let metadata = node.meta();
        Some(Self {
            name: metadata.name.clone()?,
            uid: metadata.uid.clone().filter(|uid| !uid.is_empty())?,
            provider_id: node
                .provider_id()
                .filter(|id| !id.trim().is_empty())
                .map(str::to_owned),
        })
    }

    /// An identity known by name and UID only (its machine is read from the node when asked).
    pub fn new(name: impl Into<String>, uid: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            uid: uid.into(),
            provider_id: None,
        }
    }

    /// Every identity with `name`, as a range of the order (name, then UID): a map keyed by
    /// identity finds a name's Node objects — the one now and any namesake before it — without
    /// a second index by name.
    pub fn all_named(name: &str) -> std::ops::Range<Self> {
        // No name holds a NUL, so `name\0` sorts after every identity of `name` and before
        // every longer name that starts with it.
        Self::new(name, "")..Self::new(format!("{name}\0"), "")
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn uid(&self) -> &str {
        &self.uid
    }

    /// The providerID seen when the work began, if the Node had one then.
    pub fn provider_id(&self) -> Option<&str> {
        self.provider_id.as_deref()
    }

    /// Whether `node` is this very object (not a namesake).
    pub fn is(&self, node: &impl Resource) -> bool {
        let metadata = node.meta();
        metadata.uid.as_deref() == Some(self.uid.as_str())
            && metadata.name.as_deref() == Some(self.name.as_str())
    }

    /// The node as `cache` holds it, if it is still this Node object. A cache drops or
    /// replaces an object only after the API server did, so `None` is final.
    pub fn cached<K: NodeObject>(&self, cache: &Watched<K>) -> Option<Arc<K>> {
        cache
            .get(None, &self.name)
            .filter(|node| self.is(node.as_ref()))
    }

    /// A fresh read (a quorum read, never a cache): the node, or `None` when it is gone or a
    /// namesake has taken its name.
    pub async fn read<K: NodeObject>(
        &self,
        client: &kube::Client,
    ) -> Result<Option<K>, kube::Error> {
        let api: Api<K> = Api::all(client.clone());
        Ok(api.get_opt(&self.name).await?.filter(|node| self.is(node)))
    }

    /// Reads the node fresh, lets `change` edit it (returning whether it changed anything) and
    /// writes just the difference as a JSON patch whose first operations test the UID and
    /// resourceVersion read: a namesake is never written, a concurrent writer costs a re-read
    /// (never its change), and fields this program's API types do not know are left as they
    /// are (a whole-object update would drop them).
    pub async fn update<K: NodeObject>(
        &self,
        client: &kube::Client,
        mut change: impl FnMut(&mut K) -> bool,
    ) -> Result<Updated<K>, UpdateError> {
        for _ in 0..CONFLICT_RETRIES {
            let Some(node) = self.read::<K>(client).await? else {
                return Ok(Updated::Gone);
            };
            let Some(operations) = self.operations(&node, &mut change)? else {
                return Ok(Updated::Unchanged(Box::new(node)));
            };
            // Hundreds of nodes may wait their turn for a request at once: each holds its few
            // operations while it waits, not the whole Node it read.
            drop(node);
            match self.patch(client, &operations).await {
                Ok(written) => return Ok(Updated::Written(Box::new(written))),
                // Deleted between the read and the write (the last finalizer went).
                Err(error) if status_code(&error) == Some(404) => return Ok(Updated::Gone),
                // A failed test (the node changed, or is a namesake): read again.
                Err(error) if matches!(status_code(&error), Some(409 | 422)) => {}
                Err(error) => return Err(error.into()),
            }
        }
        Err(UpdateError::Contended(self.name.clone()))
    }

    /// The JSON patch that makes `node` what `change` makes of it, its first operations
    /// testing the UID and the resourceVersion read; `None` when `change` changes nothing.
    fn operations<K: NodeObject>(
        &self,
        node: &K,
        change: &mut impl FnMut(&mut K) -> bool,
    ) -> Result<Option<Vec<serde_json::Value>>, kube::Error> {
        let mut changed = node.clone();
        if !change(&mut changed) {
            return Ok(None);
        }
        let before = serde_json::to_value(node).map_err(kube::Error::SerdeError)?;
        let after = serde_json::to_value(&changed).map_err(kube::Error::SerdeError)?;
        let mut operations = vec![
            serde_json::json!({"op": "test", "path": "/metadata/uid", "value": self.uid}),
            serde_json::json!({"op": "test", "path": "/metadata/resourceVersion",
                "value": node.meta().resource_version}),
        ];
        let difference = serde_json::to_value(json_patch::diff(&before, &after))
            .map_err(kube::Error::SerdeError)?;
        if let serde_json::Value::Array(difference) = difference {
            operations.extend(difference);
        }
        Ok(Some(operations))
    }

    /// Adds (`present`) or removes `finalizer` on this Node object without reading it: a
    /// strategic merge patch, which merges the finalizer list on the server (other
    /// finalizers, and a concurrent change of them, are kept), naming this object's UID (a
    /// namesake refuses it). `None` when the node is gone or a namesake holds its name.
    pub async fn patch_finalizer<K: NodeObject>(
        &self,
        client: &kube::Client,
        finalizer: &str,
        present: bool,
    ) -> Result<Option<K>, kube::Error> {
        let list = if present {
            "finalizers"
        } else {
            "$deleteFromPrimitiveList/finalizers"
        };
        let patch = serde_json::json!({"metadata": {"uid": self.uid, list: [finalizer]}});
        self.patch_by_uid(client, &kube::api::Patch::Strategic(patch))
            .await
    }

    /// Sets annotation `key` to `value` on this Node object without reading it (a merge patch
    /// naming its UID). `None` when the node is gone or a namesake holds its name.
    pub async fn annotate<K: NodeObject>(
        &self,
        client: &kube::Client,
        key: &str,
        value: &str,
    ) -> Result<Option<K>, kube::Error> {
        let patch = serde_json::json!({"metadata": {"uid": self.uid, "annotations": {key: value}}});
        self.patch_by_uid(client, &kube::api::Patch::Merge(patch))
            .await
    }

    async fn patch_by_uid<K: NodeObject>(
        &self,
        client: &kube::Client,
        patch: &kube::api::Patch<serde_json::Value>,
    ) -> Result<Option<K>, kube::Error> {
        let api: Api<K> = Api::all(client.clone());
        let mut tries = 0;
        loop {
            tries += 1;
            match api
                .patch(&self.name, &kube::api::PatchParams::default(), patch)
                .await
            {
                Ok(node) => return Ok(Some(node)),
                Err(error) if status_code(&error) == Some(404) => return Ok(None),
                // A namesake refuses the UID (422, or 409 as a failed precondition); so does
                // nothing else, but a conflict can be the server's own: only a read tells
                // which, and this Node still there is tried again.
                Err(error) if matches!(status_code(&error), Some(409 | 422)) => {
                    if self.read::<K>(client).await?.is_none() {
                        return Ok(None);
                    }
                    if tries >= CONFLICT_RETRIES {
                        return Err(error);
                    }
                }
                Err(error) => return Err(error),
            }
        }
    }

    async fn patch<K: NodeObject>(
        &self,
        client: &kube::Client,
        operations: &[serde_json::Value],
    ) -> Result<K, kube::Error> {
        let body = serde_json::to_vec(operations).map_err(kube::Error::SerdeError)?;
        let request = http::Request::patch(format!("/api/v1/nodes/{}", self.name))
            .header(http::header::CONTENT_TYPE, "application/json-patch+json")
            .body(body)
            .map_err(kube::Error::HttpError)?;
        client.request(request).await
    }
}

impl std::fmt::Display for NodeIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (uid {})", self.name, self.uid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_range_of_a_name_holds_its_identities_only() {
        let identities: std::collections::BTreeSet<NodeIdentity> = [
            ("node-1", "b"),
            ("node-1", "a"),
            ("node-1-x", "c"),
            ("node-", "d"),
            ("node-10", "e"),
        ]
        .into_iter()
        .map(|(name, uid)| NodeIdentity::new(name, uid))
        .collect();
        let named: Vec<String> = identities
            .range(NodeIdentity::all_named("node-1"))
            .map(ToString::to_string)
            .collect();
        assert_eq!(named, ["node-1 (uid a)", "node-1 (uid b)"]);
    }
    use serde_json::json;

    fn node(name: &str, uid: Option<&str>) -> Node {
        serde_json::from_value(json!({"metadata": {"name": name, "uid": uid}})).unwrap()
    }

    #[test]
    fn a_namesake_is_not_the_same_node() {
        let first = NodeIdentity::of(&node("n1", Some("a"))).unwrap();
        assert!(first.is(&node("n1", Some("a"))));
        assert!(!first.is(&node("n1", Some("b"))), "a namesake");
        assert!(!first.is(&node("n2", Some("a"))));
        assert_eq!(NodeIdentity::of(&node("n1", None)), None);
        assert_eq!(NodeIdentity::of(&node("n1", Some(""))), None);
    }
}
