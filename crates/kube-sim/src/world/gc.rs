//! Garbage collection: dependents of a deleted owner are deleted (background propagation) or
//! freed of the owner reference (orphan), and a deleting namespace is emptied, then removed.

use std::collections::HashSet;
use std::sync::Arc;

use serde_json::{Value, json};

use crate::resources::ResourceType;
use crate::store::{Change, DeleteOptions, Part, Store};

pub fn concerns(change: &Change) -> bool {
    change.kind == crate::store::ChangeKind::Deleted || change.collection == "/namespaces"
}

fn owners(object: &Value) -> Vec<String> {
    object["metadata"]["ownerReferences"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|owner| owner["uid"].as_str().map(str::to_owned))
        .collect()
}

pub fn reconcile(store: &Store) {
    let kinds = store.registry().all();
    // Runs after every deletion, over the whole store: only objects with owners are kept, and
    // liveness is checked only for the UIDs they name (most objects — Events, say — own nothing
    // and are named by nothing, and cost one lookup).
    let mut dependents = Vec::new();
    let mut named: HashSet<String> = HashSet::new();
    for kind in &kinds {
        for object in store
            .list(kind, None, None, 0, &|object| {
                object["metadata"]["ownerReferences"]
                    .as_array()
                    .is_some_and(|owners| !owners.is_empty())
            })
            .items
        {
            let owners = owners(&object);
            named.extend(owners.iter().cloned());
            dependents.push((kind, object, owners));
        }
    }
    if dependents.is_empty() {
        return collect_namespaces(store, &kinds);
    }
    let mut live: HashSet<String> = HashSet::new();
    for kind in &kinds {
        let owners = store.list(kind, None, None, 0, &|object| {
            object["metadata"]["uid"]
                .as_str()
                .is_some_and(|uid| named.contains(uid))
        });
        live.extend(
            owners
                .items
                .iter()
                .filter_map(|owner| owner["metadata"]["uid"].as_str().map(str::to_owned)),
        );
    }
    for (kind, object, owners) in &dependents {
        if owners.iter().any(|uid| live.contains(uid)) {
            continue;
        }
        let namespace = object["metadata"]["namespace"].as_str();
        let name = object["metadata"]["name"].as_str().unwrap_or_default();
        let _ = store.delete(kind, namespace, name, &DeleteOptions::default());
    }
    collect_namespaces(store, &kinds);
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
pub fn orphan_dependents(store: &Store, owner_uid: &str) {
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
