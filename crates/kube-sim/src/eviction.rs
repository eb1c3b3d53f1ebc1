//! The pod eviction subresource (policy/v1 Eviction), with the real API server's rules for
//! PodDisruptionBudgets.

use jiff::Timestamp;
use serde_json::{Value, json};

use crate::conditions::is_ready;
use crate::error::ApiError;
use crate::selector::LabelSelector;
use crate::store::{DeleteOptions, Part, Store};

/// The message the real API server gives when a budget forbids the eviction.
pub const VIOLATION_MESSAGE: &str =
    "Cannot evict pod as it would violate the pod's disruption budget.";
pub const MULTIPLE_BUDGETS_MESSAGE: &str = "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.";

fn too_many_requests(cause: &str) -> ApiError {
    ApiError::too_many_requests(
        VIOLATION_MESSAGE,
        Some(json!({"causes": [{"reason": "DisruptionBudget", "message": cause}]})),
    )
}

/// Evicts `namespace/name`: checks its budget, records the disruption, marks the pod with a
/// DisruptionTarget condition and deletes it with the eviction's DeleteOptions.
pub fn evict(store: &Store, namespace: &str, name: &str, eviction: &Value) -> Result<(), ApiError> {
    let pods = store.kind("", "pods");
    let options = DeleteOptions::from_json(&eviction["deleteOptions"])?;
    let pod = store.get(&pods, Some(namespace), name)?;
    options.preconditions.check(&pods, name, &pod)?;
    let phase = pod["status"]["phase"].as_str().unwrap_or_default();
    let ignores_budget = matches!(phase, "Succeeded" | "Failed" | "Pending")
        || pod["metadata"]["deletionTimestamp"].is_string();
    if !ignores_budget {
        charge_budget(store, namespace, name, &pod)?;
    }
    mark_disruption_target(store, namespace, name);
    store.delete(&pods, Some(namespace), name, &options)?;
    Ok(())
}

fn charge_budget(store: &Store, namespace: &str, name: &str, pod: &Value) -> Result<(), ApiError> {
    let budgets_kind = store.kind("policy", "poddisruptionbudgets");
    let budgets: Vec<_> = store
        .list(&budgets_kind, Some(namespace), None, 0, &|budget| {
            // In eviction a nil or empty selector matches nothing, unlike in the disruption
            // controller.
            LabelSelector::from_object(&budget["spec"]["selector"])
                .is_ok_and(|selector| !selector.is_everything() && selector.matches(pod))
        })
        .items;
    let budget = match budgets.as_slice() {
        [] => return Ok(()),
        [budget] => budget,
        _ => return Err(ApiError::internal(MULTIPLE_BUDGETS_MESSAGE)),
    };
    let budget_name = budget["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let generation = budget["metadata"]["generation"].as_i64().unwrap_or(0);
    if budget["status"]["observedGeneration"].as_i64().unwrap_or(0) < generation {
        return Err(too_many_requests(&format!(
            "The disruption budget {budget_name} is still being processed by the server."
        )));
    }
    let status = &budget["status"];
    let healthy = status["currentHealthy"].as_i64().unwrap_or(0);
    let desired = status["desiredHealthy"].as_i64().unwrap_or(0);
    if !is_ready(pod) {
        // An unhealthy pod may go without using the budget: always under AlwaysAllow, and under
        // the default IfHealthyBudget while the application has its healthy pods.
        let policy = budget["spec"]["unhealthyPodEvictionPolicy"]
            .as_str()
            .unwrap_or("IfHealthyBudget");
        if policy == "AlwaysAllow" || healthy >= desired {
            return Ok(());
        }
    }
    if status["disruptionsAllowed"].as_i64().unwrap_or(0) <= 0 {
        return Err(too_many_requests(&format!(
            "The disruption budget {budget_name} needs {desired} healthy pods and has {healthy} currently"
        )));
    }
    store.update(
        &budgets_kind,
        Some(namespace),
        &budget_name,
        Part::Status,
        |current| {
            if current["metadata"]["resourceVersion"] != budget["metadata"]["resourceVersion"] {
                // The budget moved underneath us; the client retries, as with the real server.
                return Err(too_many_requests(&format!(
                    "The disruption budget {budget_name} changed; retry"
                )));
            }
            let mut updated = current.clone();
            let allowed = current["status"]["disruptionsAllowed"]
                .as_i64()
                .unwrap_or(0);
            updated["status"]["disruptionsAllowed"] = json!(allowed - 1);
            if !updated["status"]["disruptedPods"].is_object() {
                updated["status"]["disruptedPods"] = json!({});
            }
            updated["status"]["disruptedPods"][name] =
                json!(Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string());
            Ok(updated)
        },
    )?;
    Ok(())
}

fn mark_disruption_target(store: &Store, namespace: &str, name: &str) {
    let pods = store.kind("", "pods");
    let condition = json!({
        "type": "DisruptionTarget",
        "status": "True",
        "reason": "EvictionByEvictionAPI",
        "message": "Eviction API: evicting",
        "lastTransitionTime": Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
    });
    // Best effort, as in the real server: the deletion is what matters.
    let _ = store.update(&pods, Some(namespace), name, Part::Status, |current| {
        let patch = json!({"status": {"conditions": [condition]}});
        crate::patch::apply(
            current,
            crate::patch::PatchType::StrategicMerge,
            &patch,
            false,
        )
    });
}
