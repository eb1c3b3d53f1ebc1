//! The availability audit: every moment an API eviction or delete took a healthy pod away while
//! its PodDisruptionBudget's healthy pods fell below `desiredHealthy`. Drain tests assert there
//! were none; a correct eviction cannot cause one unless the budget's status was stale.

use std::sync::{Arc, Mutex, PoisonError};

use serde::Serialize;
use serde_json::Value;

use crate::conditions::is_ready;
use crate::selector::LabelSelector;
use crate::store::Store;

/// What took the pod away.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Disruption {
    /// `POST …/pods/{name}/eviction`.
    Eviction,
    /// A plain `DELETE` of the pod (or a deletecollection that included it).
    Delete,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Violation {
    pub namespace: String,
    pub pod: String,
    pub budget: String,
    /// RFC 3339, whole seconds.
    pub at: String,
    pub by: Disruption,
    /// The budget's healthy pods once this one was gone.
    pub healthy: i64,
    /// The budget's `status.desiredHealthy` at that moment.
    pub desired_healthy: i64,
}

#[derive(Debug, Clone, Default)]
pub struct Audit {
    violations: Arc<Mutex<Vec<Violation>>>,
}

/// Counted toward a budget: Ready, not terminating, not finished.
fn healthy(pod: &Value) -> bool {
    is_ready(pod)
        && !pod["metadata"]["deletionTimestamp"].is_string()
        && !matches!(
            pod["status"]["phase"].as_str(),
            Some("Succeeded" | "Failed")
        )
}

impl Audit {
    pub fn violations(&self) -> Vec<Violation> {
        self.violations
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Called just before `pod` is deleted through the API: records each budget of the pod whose
    /// healthy pods, without this one, are fewer than it desires.
    pub fn pod_leaving(&self, store: &Store, pod: &Value, by: Disruption) {
        if !healthy(pod) {
            return;
        }
        let meta = &pod["metadata"];
        let namespace = meta["namespace"].as_str().unwrap_or_default();
        let budgets = store.kind("policy", "poddisruptionbudgets");
        let pods = store.kind("", "pods");
        for budget in store
            .list(&budgets, Some(namespace), None, 0, &|_| true)
            .items
        {
            // As the disruption controller counts: a nil selector selects nothing, `{}` all.
            if budget["spec"]["selector"].is_null() {
                continue;
            }
            let Ok(selector) = LabelSelector::from_object(&budget["spec"]["selector"]) else {
                continue;
            };
            let Some(desired) = budget["status"]["desiredHealthy"].as_i64() else {
                continue;
            };
            if !selector.matches(pod) {
                continue;
            }
            let others = store
                .list(&pods, Some(namespace), None, 0, &|other| {
                    other["metadata"]["uid"] != meta["uid"]
                        && selector.matches(other)
                        && healthy(other)
                })
                .items
                .len();
            let remaining = i64::try_from(others).unwrap_or(i64::MAX);
            if remaining < desired {
                self.violations
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(Violation {
                        namespace: namespace.to_owned(),
                        pod: meta["name"].as_str().unwrap_or_default().to_owned(),
                        budget: budget["metadata"]["name"]
                            .as_str()
                            .unwrap_or_default()
                            .to_owned(),
                        at: crate::store::strategy::now_rfc3339(),
                        by,
                        healthy: remaining,
                        desired_healthy: desired,
                    });
            }
        }
    }
}
