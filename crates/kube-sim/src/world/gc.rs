//! Garbage collection (pkg/controller/garbagecollector): dependents of a deleted owner are
//! deleted (background propagation); an owner deleted in the foreground (finalizer
//! `foregroundDeletion`) has its dependents deleted first and stays until those that block
//! its deletion (`blockOwnerDeletion: true`) are gone; an owner deleted with the orphan policy
//! (finalizer `orphan`) has its dependents freed of its reference first. A deleting namespace
//! is emptied, then removed.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use serde_json::{Value, json};

use crate::resources::ResourceType;
use crate::store::strategy::has_finalizer;
use crate::store::{
    Change, DeleteOptions, FOREGROUND_FINALIZER, ORPHAN_FINALIZER, Part, Preconditions, Store,
};

pub fn concerns(change: &Change) -> bool {
    change.kind == crate::store::ChangeKind::Deleted
        || change.collection == "/namespaces"
        || awaits_collector(&change.object)
}

/// Deleting, and held by one of the garbage collector's own finalizers.
fn awaits_collector(object: &Value) -> bool {
    object["metadata"]["deletionTimestamp"].is_string()
        && (has_finalizer(object, ORPHAN_FINALIZER) || has_finalizer(object, FOREGROUND_FINALIZER))
}

fn owners(object: &Value) -> Vec<String> {
    object["metadata"]["ownerReferences"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|owner| owner["uid"].as_str().map(str::to_owned))
        .collect()
}

fn uid(object: &Value) -> &str {
    object["metadata"]["uid"].as_str().unwrap_or_default()
}

/// What a dependent's owner reference points at (the collector's `classifyReferences`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Owner {
    /// Exists and is not being deleted in the foreground.
    Solid,
    /// Being deleted in the foreground: waits for its dependents.
    Waiting,
    /// Gone (or never existed).
    Dangling,
}

pub fn reconcile(store: &Store) {
    let kinds = store.registry().all();
    // Runs after every deletion, over the whole store: only objects with owners, or held by the
    // collector's finalizers, are kept, and liveness is checked only for the UIDs they name
    // (most objects — Events, say — own nothing and are named by nothing, and cost one lookup).
    let mut dependents = Vec::new();
    let mut held = Vec::new();
    let mut named: HashSet<String> = HashSet::new();
    for kind in &kinds {
        for object in store
            .list(kind, None, None, 0, &|object| {
                awaits_collector(object)
                    || object["metadata"]["ownerReferences"]
                        .as_array()
                        .is_some_and(|owners| !owners.is_empty())
            })
            .items
        {
            if awaits_collector(&object) {
                held.push((kind, object.clone()));
            }
            let owners = owners(&object);
            if !owners.is_empty() {
                named.extend(owners.iter().cloned());
                dependents.push((kind, object));
            }
        }
    }
    let mut states: HashMap<String, Owner> = HashMap::new();
    if !named.is_empty() {
        for kind in &kinds {
            for owner in store
                .list(kind, None, None, 0, &|object| named.contains(uid(object)))
                .items
            {
                let state = if owner["metadata"]["deletionTimestamp"].is_string()
                    && has_finalizer(&owner, FOREGROUND_FINALIZER)
                {
                    Owner::Waiting
                } else {
                    Owner::Solid
                };
                states.insert(uid(&owner).to_owned(), state);
            }
        }
    }
    for (kind, dependent) in &dependents {
        collect_dependent(store, kind, dependent, &states, &named);
    }
    for (kind, object) in &held {
        release(store, &kinds, kind, object);
    }
    collect_namespaces(store, &kinds);
}

/// The collector's `attemptToDeleteItem` for one dependent.
fn collect_dependent(
    store: &Store,
    kind: &ResourceType,
    dependent: &Value,
    states: &HashMap<String, Owner>,
    named: &HashSet<String>,
) {
    let state = |owner: &String| states.get(owner).copied().unwrap_or(Owner::Dangling);
    let owners = owners(dependent);
    let namespace = dependent["metadata"]["namespace"].as_str();
    let name = dependent["metadata"]["name"].as_str().unwrap_or_default();
    if owners.iter().any(|owner| state(owner) == Owner::Solid) {
        // Kept by a live owner: the references to the others go, so a foreground deletion
        // does not wait for an object it will never delete.
        if owners.iter().all(|owner| state(owner) == Owner::Solid) {
            return;
        }
        let _ = store.update(kind, namespace, name, Part::Main, |current| {
            let mut updated = current.clone();
            // A namesake created since the pass listed is not the object judged.
            if uid(current) != uid(dependent) {
                return Ok(updated);
            }
            if let Some(references) = updated["metadata"]["ownerReferences"].as_array_mut() {
                references.retain(|r| {
                    r["uid"]
                        .as_str()
                        .is_some_and(|owner| states.get(owner) == Some(&Owner::Solid))
                });
            }
            Ok(updated)
        });
        return;
    }
    let waited_for = owners.iter().any(|owner| state(owner) == Owner::Waiting);
    let policy = if waited_for && named.contains(uid(dependent)) {
        // An owner of its own dependents, deleted for an owner that waits: it waits for them too.
        "Foreground"
    } else if has_finalizer(dependent, ORPHAN_FINALIZER) {
        "Orphan"
    } else if has_finalizer(dependent, FOREGROUND_FINALIZER) {
        "Foreground"
    } else {
        "Background"
    };
    // As the collector's deleteObject: only the object judged, never a namesake made since.
    let options = DeleteOptions {
        propagation_policy: Some(policy.to_owned()),
        preconditions: Preconditions {
            uid: Some(uid(dependent).to_owned()),
            resource_version: None,
        },
        ..DeleteOptions::default()
    };
    let _ = store.delete(kind, namespace, name, &options);
}

/// Lets an owner held by the collector's finalizer go: once its dependents are orphaned
/// (`orphan`), or once no dependent blocking its deletion is left (`foregroundDeletion`).
/// Dependents are read afresh: this pass may have removed some, or dropped their reference.
fn release(store: &Store, kinds: &[Arc<ResourceType>], kind: &ResourceType, owner: &Value) {
    let owner_uid = uid(owner);
    if has_finalizer(owner, ORPHAN_FINALIZER) {
        orphan_dependents(store, owner_uid);
    }
    let blocks = |dependent: &Value| {
        dependent["metadata"]["ownerReferences"]
            .as_array()
            .is_some_and(|references| {
                references
                    .iter()
                    .any(|r| r["uid"] == owner_uid && r["blockOwnerDeletion"] == true)
            })
    };
    let blocked = has_finalizer(owner, FOREGROUND_FINALIZER)
        && kinds
            .iter()
            .any(|kind| !store.list(kind, None, None, 1, &blocks).items.is_empty());
    let namespace = owner["metadata"]["namespace"].as_str();
    let name = owner["metadata"]["name"].as_str().unwrap_or_default();
    let _ = store.update(kind, namespace, name, Part::Main, |current| {
        let mut updated = current.clone();
        if uid(current) != owner_uid {
            return Ok(updated);
        }
        if let Some(list) = updated["metadata"]["finalizers"].as_array_mut() {
            list.retain(|f| f != ORPHAN_FINALIZER && (blocked || f != FOREGROUND_FINALIZER));
        }
        Ok(updated)
    });
}

/// A deleting namespace is emptied, then removed.
fn collect_namespaces(store: &Store, kinds: &[Arc<ResourceType>]) {
    let namespaces = store.kind("", "namespaces");
    for namespace in store.all(&namespaces) {
        if !namespace["metadata"]["deletionTimestamp"].is_string() {
            continue;
        }
        let name = namespace["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let mut remaining = 0;
        for kind in kinds.iter().filter(|k| k.namespaced) {
            for object in store.list(kind, Some(&name), None, 0, &|_| true).items {
                remaining += 1;
                let object_name = object["metadata"]["name"].as_str().unwrap_or_default();
                let _ = store.delete(kind, Some(&name), object_name, &DeleteOptions::default());
            }
        }
        if remaining == 0 {
            let finalized = store.update(&namespaces, None, &name, Part::Main, |current| {
                let mut updated = current.clone();
                updated["spec"]["finalizers"] = json!([]);
                Ok(updated)
            });
            if finalized.is_ok() {
                let _ = store.delete(&namespaces, None, &name, &DeleteOptions::default());
            }
        }
    }
}

/// Orphan propagation: the dependents keep running without the owner reference.
fn orphan_dependents(store: &Store, owner_uid: &str) {
    for kind in store.registry().all() {
        for object in store.all(&kind) {
            if !owners(&object).iter().any(|uid| uid == owner_uid) {
                continue;
            }
            let namespace = object["metadata"]["namespace"].as_str();
            let name = object["metadata"]["name"].as_str().unwrap_or_default();
            let _ = store.update(&kind, namespace, name, Part::Main, |current| {
                let mut updated = current.clone();
                if let Some(references) = updated["metadata"]["ownerReferences"].as_array_mut() {
                    references.retain(|r| r["uid"] != owner_uid);
                }
                Ok(updated)
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{HashMap, HashSet};

    use serde_json::json;

    use super::{Owner, collect_dependent};
    use crate::resources::Registry;
    use crate::store::Store;

    /// A pass judges the dependent it listed; a namesake created since, owned by a live owner,
    /// is neither deleted nor stripped of its references.
    #[test]
    fn a_namesake_of_a_judged_dependent_is_left_alone() {
        let store = Store::new(Registry::default(), 100);
        let maps = store.kind("", "configmaps");
        let reference =
            |uid: &str| json!({"apiVersion": "v1", "kind": "ConfigMap", "name": uid, "uid": uid});
        let namesake = store
            .create(
                &maps,
                Some("default"),
                json!({"metadata": {"name": "dependent", "ownerReferences": [reference("other-owner")]}}),
            )
            .unwrap();
        let judged = |references: Vec<serde_json::Value>| {
            let mut judged = (*namesake).clone();
            judged["metadata"]["uid"] = json!("gone-dependent");
            judged["metadata"]["ownerReferences"] = json!(references);
            judged
        };
        // Its only owner gone: the pass would delete it.
        collect_dependent(
            &store,
            &maps,
            &judged(vec![reference("gone-owner")]),
            &HashMap::new(),
            &HashSet::new(),
        );
        // Kept by a live owner: the pass would drop its other references.
        collect_dependent(
            &store,
            &maps,
            &judged(vec![reference("live-owner"), reference("gone-owner")]),
            &HashMap::from([("live-owner".to_owned(), Owner::Solid)]),
            &HashSet::new(),
        );
        let kept = store.get(&maps, Some("default"), "dependent").unwrap();
        assert_eq!(kept, namesake);
    }
}
