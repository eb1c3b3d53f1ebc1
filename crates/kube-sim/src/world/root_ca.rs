//! The root CA publisher (pkg/controller/certificates/rootcacertpublisher): every active
//! namespace has the ConfigMap `kube-root-ca.crt` holding the CA clients verify the API server
//! with, which every pod's projected API credentials include. Served over plain HTTP, the
//! simulator has no CA: `ca.crt` is then empty.

use serde_json::json;

use crate::store::{Change, Part, Store};

pub const CONFIG_MAP: &str = "kube-root-ca.crt";

pub fn concerns(change: &Change) -> bool {
    change.collection == "/namespaces" || change.collection == "/configmaps"
}

pub fn reconcile(store: &Store, ca_pem: &str) {
    let namespaces = store.kind("", "namespaces");
    let config_maps = store.kind("", "configmaps");
    for namespace in store.all(&namespaces) {
        if namespace["metadata"]["deletionTimestamp"].is_string() {
            continue;
        }
        let name = namespace["metadata"]["name"].as_str().unwrap_or_default();
        match store.get(&config_maps, Some(name), CONFIG_MAP) {
            Ok(current) if current["data"]["ca.crt"] == ca_pem => {}
            Ok(_) => {
                let _ = store.update(
                    &config_maps,
                    Some(name),
                    CONFIG_MAP,
                    Part::Main,
                    |current| {
                        let mut updated = current.clone();
                        updated["data"] = json!({"ca.crt": ca_pem});
                        Ok(updated)
                    },
                );
            }
            Err(_) => {
                let _ = store.create(
                    &config_maps,
                    Some(name),
                    json!({
                        "metadata": {"name": CONFIG_MAP, "annotations": {"kubernetes.io/description": "Contains a CA bundle that can be used to verify the kube-apiserver when using internal endpoints such as the internal service IP or kubernetes.default.svc. No other usage is guaranteed across distributions of Kubernetes clusters."}},
                        "data": {"ca.crt": ca_pem},
                    }),
                );
            }
        }
    }
}
