//! The invariant log: every pod disruption that a PodDisruptionBudget did not allow. Eviction
//! cannot cause one; a plain DELETE can, and drain tests assert there were none.

use std::sync::{Arc, Mutex, PoisonError};

use serde::Serialize;
use serde_json::Value;

use crate::conditions::is_ready;
use crate::selector::LabelSelector;
use crate::store::Store;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Violation {
    pub namespace: String,
    pub pod: String,
    pub budget: String,
    pub at: String,
}

#[derive(Debug, Clone, Default)]
pub struct Audit {
    violations: Arc<Mutex<Vec<Violation>>>,
}

impl Audit {
    pub fn violations(&self) -> Vec<Violation> {
        self.violations
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Called before a plain (non-eviction) deletion of a pod: a healthy, running pod whose
    /// budget allows no disruption is a violation.
    pub fn check_pod_deletion(&self, store: &Store, pod: &Value) {
        let meta = &pod["metadata"];
        if meta["deletionTimestamp"].is_string() || !is_ready(pod) {
            return;
        }
        let namespace = meta["namespace"].as_str().unwrap_or_default();
        let budgets = store.kind("policy", "poddisruptionbudgets");
        let blocking = store.list(&budgets, Some(namespace), None, 0, &|budget| {
            LabelSelector::from_object(&budget["spec"]["selector"])
                .is_ok_and(|s| !s.is_everything() && s.matches(pod))
                && budget["status"]["disruptionsAllowed"].as_i64().unwrap_or(0) <= 0
        });
        let mut violations = self
            .violations
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for budget in blocking.items {
            violations.push(Violation {
                namespace: namespace.to_owned(),
                pod: meta["name"].as_str().unwrap_or_default().to_owned(),
                budget: budget["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                at: crate::store::strategy::now_rfc3339(),
            });
        }
    }
}
