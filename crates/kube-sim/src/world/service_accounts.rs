//! The service account controller (pkg/controller/serviceaccount): every active namespace has
//! a `default` ServiceAccount.

use serde_json::json;

use crate::store::{Change, Store};

pub fn concerns(change: &Change) -> bool {
    change.collection == "/namespaces" || change.collection == "/serviceaccounts"
}

pub fn reconcile(store: &Store) {
    let namespaces = store.kind("", "namespaces");
    let accounts = store.kind("", "serviceaccounts");
    for namespace in store.all(&namespaces) {
        if namespace["metadata"]["deletionTimestamp"].is_string() {
            continue;
        }
        let name = namespace["metadata"]["name"].as_str().unwrap_or_default();
        if store.get(&accounts, Some(name), "default").is_err() {
            let _ = store.create(
                &accounts,
                Some(name),
                json!({"metadata": {"name": "default"}}),
            );
        }
    }
}
