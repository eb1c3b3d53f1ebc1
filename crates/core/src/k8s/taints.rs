//! Adding and removing a node taint without losing anyone else's: read, change, and replace
//! with the read `resourceVersion`, retrying when another writer got there first (409).

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Api;
use kube::api::PostParams;

use crate::k8s::nodes::NodeFields;

/// Conflicts are normal on a busy node (the kubelet and controllers write it too); a handful of
/// attempts is plenty, and a bound keeps a pathological fight from spinning forever.
const ATTEMPTS: usize = 8;

/// Adds `taint` (matched by key and effect) unless present. Returns whether the node changed.
pub async fn add_taint(nodes: &Api<Node>, node: &str, taint: &Taint) -> Result<bool, kube::Error> {
    modify_taints(nodes, node, |taints| {
        if taints.iter().any(|t| same_taint(t, taint)) {
            return false;
        }
        let mut added = taint.clone();
        if added.effect == "NoExecute" && added.time_added.is_none() {
            // The taint manager counts tolerationSeconds from here.
            added.time_added = Some(Time(Timestamp::now()));
        }
        taints.push(added);
        true
    })
    .await
}

/// Removes the taint with `taint`'s key and effect if present. Returns whether the node changed.
pub async fn remove_taint(
    nodes: &Api<Node>,
    node: &str,
    taint: &Taint,
) -> Result<bool, kube::Error> {
    modify_taints(nodes, node, |taints| {
        let before = taints.len();
        taints.retain(|t| !same_taint(t, taint));
        taints.len() != before
    })
    .await
}

/// Puts `taint` on `node` (an object about to be written) unless one of its key and effect is
/// there. Returns whether it was added.
pub fn put_taint(node: &mut impl NodeFields, taint: &Taint) -> bool {
    let taints = node.taints_mut();
    if taints.iter().any(|t| same_taint(t, taint)) {
        return false;
    }
    taints.push(taint.clone());
    true
}

/// Whether `node` carries a taint of `taint`'s key and effect.
pub fn has_taint(node: &impl NodeFields, taint: &Taint) -> bool {
    crate::k8s::nodes::taints(node)
        .iter()
        .any(|t| same_taint(t, taint))
}

/// Taints are identified by key and effect, as the API validates them.
fn same_taint(a: &Taint, b: &Taint) -> bool {
    a.key == b.key && a.effect == b.effect
}

async fn modify_taints(
    nodes: &Api<Node>,
    node: &str,
    mut change: impl FnMut(&mut Vec<Taint>) -> bool,
) -> Result<bool, kube::Error> {
    change_taints(nodes, node, |_, taints| change(taints)).await
}

/// Changes a node's taints as `change` decides from the node just read (so a decision that
/// depends on the node's state, like "only while it is NotReady", is made on the very version
/// that gets written). Returns whether the node changed.
pub async fn change_taints(
    nodes: &Api<Node>,
    node: &str,
    mut change: impl FnMut(&Node, &mut Vec<Taint>) -> bool,
) -> Result<bool, kube::Error> {
    change_node(nodes, node, |current| {
        let mut taints = current
            .spec
            .as_ref()
            .and_then(|spec| spec.taints.clone())
            .unwrap_or_default();
        if !change(current, &mut taints) {
            return false;
        }
        let spec = current.spec.get_or_insert_with(Default::default);
        spec.taints = (!taints.is_empty()).then_some(taints);
        true
    })
    .await
}

/// Changes a node as `change` decides on the node just read (its taints together with its
/// annotations, say), and replaces it with the read `resourceVersion`, retrying on conflicts.
/// Returns whether the node changed.
pub async fn change_node(
    nodes: &Api<Node>,
    node: &str,
    mut change: impl FnMut(&mut Node) -> bool,
) -> Result<bool, kube::Error> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        let mut current = nodes.get(node).await?;
        if !change(&mut current) {
            return Ok(false);
        }
        // `current` carries the resourceVersion we read: a concurrent write makes this a 409.
        match nodes.replace(node, &PostParams::default(), &current).await {
            Ok(_) => return Ok(true),
            Err(kube::Error::Api(status)) if status.code == 409 && attempt < ATTEMPTS => {
                tracing::debug!(
                    node,
                    attempt,
                    "node changed underneath; retrying the update"
                );
            }
            Err(error) => return Err(error),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn taints_are_the_same_by_key_and_effect() {
        let taint = |key: &str, value: Option<&str>, effect: &str| Taint {
            key: key.to_owned(),
            value: value.map(str::to_owned),
            effect: effect.to_owned(),
            time_added: None,
        };
        assert!(same_taint(
            &taint("a", Some("1"), "NoSchedule"),
            &taint("a", Some("2"), "NoSchedule")
        ));
        assert!(!same_taint(
            &taint("a", None, "NoSchedule"),
            &taint("a", None, "NoExecute")
        ));
        assert!(!same_taint(
            &taint("a", None, "NoSchedule"),
            &taint("b", None, "NoSchedule")
        ));
    }

    #[test]
    fn a_taint_put_once_is_there_and_not_put_twice() {
        let taint = Taint {
            key: "nodegrace.io/disrupted".to_owned(),
            effect: "NoSchedule".to_owned(),
            ..Taint::default()
        };
        let mut node = Node::default();
        assert!(!has_taint(&node, &taint));
        assert!(put_taint(&mut node, &taint));
        assert!(has_taint(&node, &taint));
        assert!(!put_taint(&mut node, &taint), "put once only");
        let other_effect = Taint {
            effect: "NoExecute".to_owned(),
            ..taint
        };
        assert!(!has_taint(&node, &other_effect));
    }
}
