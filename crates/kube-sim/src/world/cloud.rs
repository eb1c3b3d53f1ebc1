//! The cloud: one instance per node `providerID`, listable and terminable over
//! `/sim/v1/instances`, counting terminate calls so tests can assert "terminated exactly once,
//! none leaked". Terminating an instance stops its node's kubelet, as a powered-off machine
//! would.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{delete, get};
use axum::{Json, Router};
use serde::Serialize;
use serde_json::json;

use crate::store::{Change, Part, Store};

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Instance {
    /// The node name part of `sim:///<id>`.
    pub id: String,
    pub provider_id: String,
    pub node: String,
    pub state: String,
    pub terminate_calls: u32,
}

#[derive(Debug, Clone)]
pub struct Cloud {
    store: Store,
    instances: Arc<Mutex<BTreeMap<String, Instance>>>,
}

pub fn concerns(change: &Change) -> bool {
    change.collection == "/nodes"
}

impl Cloud {
    pub fn new(store: Store) -> Self {
        Self {
            store,
            instances: Arc::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Instance>> {
        self.instances
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers an instance for every node with a `sim://` providerID. Instances outlive their
    /// Node objects: a machine exists until it is terminated.
    pub fn reconcile(&self) {
        let nodes = self.store.all(&self.store.kind("", "nodes"));
        let mut instances = self.lock();
        for node in nodes {
            let Some(provider_id) = node["spec"]["providerID"].as_str() else {
                continue;
            };
            let Some(id) = provider_id.strip_prefix("sim:///") else {
                continue;
            };
            instances.entry(id.to_owned()).or_insert_with(|| Instance {
                id: id.to_owned(),
                provider_id: provider_id.to_owned(),
                node: node["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                state: "running".to_owned(),
                terminate_calls: 0,
            });
        }
    }

    pub fn instances(&self) -> Vec<Instance> {
        self.lock().values().cloned().collect()
    }

    /// Terminates an instance; idempotent, but every call is counted.
    pub fn terminate(&self, id: &str) -> Option<Instance> {
        let instance = {
            let mut instances = self.lock();
            let instance = instances.get_mut(id)?;
            instance.terminate_calls += 1;
            "terminated".clone_into(&mut instance.state);
            instance.clone()
        };
        let nodes = self.store.kind("", "nodes");
        let _ = self
            .store
            .update(&nodes, None, &instance.node, Part::Main, |current| {
                let mut updated = current.clone();
                updated["metadata"]["annotations"][super::KUBELET_ANNOTATION] = json!("stopped");
                Ok(updated)
            });
        Some(instance)
    }

    pub fn router<S>(&self) -> Router<S> {
        Router::new()
            .route("/sim/v1/instances", get(list))
            .route("/sim/v1/instances/{id}", delete(terminate))
            .with_state(self.clone())
    }
}

async fn list(State(cloud): State<Cloud>) -> Json<Vec<Instance>> {
    cloud.reconcile();
    Json(cloud.instances())
}

async fn terminate(
    State(cloud): State<Cloud>,
    Path(id): Path<String>,
) -> Result<Json<Instance>, StatusCode> {
    cloud.reconcile();
    cloud.terminate(&id).map(Json).ok_or(StatusCode::NOT_FOUND)
}
