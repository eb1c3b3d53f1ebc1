//! The pod eviction subresource (policy/v1 Eviction), branch for branch as
//! kubernetes/pkg/registry/core/pod/storage/eviction.go decides it:
//! - pods that already left (terminal, Pending, deleting) go without consulting any budget;
//! - more than one matching budget is a 500, none is a plain delete;
//! - an unready pod may go without spending the budget under `AlwaysAllow`, or under the default
//!   `IfHealthyBudget` while `currentHealthy >= desiredHealthy > 0`;
//! - otherwise the budget is checked and decremented (`checkAndDecrement`) and the pod recorded
//!   in `disruptedPods`, then the pod gets its `DisruptionTarget` condition and is deleted.

use serde_json::{Value, json};

use crate::audit::{Audit, Disruption};
use crate::conditions::{is_ready, set_condition};
use crate::error::ApiError;
use crate::selector::LabelSelector;
use crate::store::timestamps::now_rfc3339;
use crate::store::{DeleteOptions, Part, Store};

/// The message the real API server gives when a budget forbids the eviction.
pub const VIOLATION_MESSAGE: &str =
    "Cannot evict pod as it would violate the pod's disruption budget.";
pub const MULTIPLE_BUDGETS_MESSAGE: &str = "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.";
/// eviction.go's MaxDisruptedPodSize: evictions approved but not yet seen by the controller.
const MAX_DISRUPTED_PODS: usize = 2000;
/// eviction.go's EvictionsRetry has 20 steps.
const CONFLICT_RETRIES: usize = 20;

/// `createTooManyRequestsError`: the budget cannot be judged yet; retry in 10 s.
fn budget_being_processed(budget: &str) -> ApiError {
    ApiError::too_many_requests(
        VIOLATION_MESSAGE,
        &[(
            "DisruptionBudget",
            format!("The disruption budget {budget} is still being processed by the server."),
        )],
        10,
    )
}

/// Evicts `namespace/name` following the Eviction object's delete options (and the request's
/// dry-run). Disruptions of healthy pods are reported to `audit`.
pub fn evict(
    store: &Store,
    audit: &Audit,
    user: &str,
    namespace: &str,
    name: &str,
    eviction: &Value,
    dry_run: bool,
) -> Result<(), ApiError> {
    if eviction["metadata"]["name"].as_str() != Some(name) {
        return Err(ApiError::bad_request(
            "name in URL does not match name in Eviction object",
        ));
    }
    let mut options = DeleteOptions::from_json(&eviction["deleteOptions"])?;
    options.dry_run |= dry_run;
    let client_version = options.preconditions.resource_version.is_some();
    let pods = store.kind("", "pods");
    let mut attempts = 0;
    let pod = loop {
        attempts += 1;
        let pod = store.get(&pods, Some(namespace), name)?;
        if !can_ignore_budget(&pod) {
            break pod;
        }
        let mut delete = options.clone();
        if enforces_version(&pod) && !client_version {
            // Not racing a pod that turns Running (and budgeted) meanwhile.
            delete.preconditions.resource_version = Some(version_of(&pod));
        }
        match delete_with_condition(store, audit, user, &pod, &delete) {
            Err(error) if error.code == 409 && !client_version && attempts < CONFLICT_RETRIES => {}
            outcome => return outcome,
        }
    };

    let budgets = matching_budgets(store, &pod);
    let mut delete = options.clone();
    let (budget_name, spends_nothing) = match budgets.as_slice() {
        [] => (String::new(), false),
        [budget] => {
            let budget_name = text(&budget["metadata"]["name"]).to_owned();
            let spends_nothing = !is_ready(&pod) && unready_may_go(budget);
            if spends_nothing {
                delete.preconditions.resource_version = Some(version_of(&pod));
            } else {
                check_and_decrement(store, namespace, &budget_name, name, options.dry_run)?;
            }
            (budget_name, spends_nothing)
        }
        _ => return Err(ApiError::failure_status(500, MULTIPLE_BUDGETS_MESSAGE)),
    };
    match delete_with_condition(store, audit, user, &pod, &delete) {
        // The unready pod changed (it may be Ready now): the client must ask again.
        Err(error) if error.code == 409 && spends_nothing && !client_version => {
            Err(budget_being_processed(&budget_name))
        }
        outcome => outcome,
    }
}

fn text(value: &Value) -> &str {
    value.as_str().unwrap_or_default()
}

fn version_of(object: &Value) -> String {
    text(&object["metadata"]["resourceVersion"]).to_owned()
}

/// eviction.go's canIgnorePDB: the pod is not running (or already going).
fn can_ignore_budget(pod: &Value) -> bool {
    matches!(
        text(&pod["status"]["phase"]),
        "Succeeded" | "Failed" | "Pending"
    ) || pod["metadata"]["deletionTimestamp"].is_string()
}

/// eviction.go's shouldEnforceResourceVersion: only a pod that could still turn Running.
fn enforces_version(pod: &Value) -> bool {
    !matches!(text(&pod["status"]["phase"]), "Succeeded" | "Failed")
        && !pod["metadata"]["deletionTimestamp"].is_string()
}

/// An unready pod leaves without spending the budget: always under `AlwaysAllow`; under the
/// default `IfHealthyBudget` only while the application has its healthy pods and needs some.
fn unready_may_go(budget: &Value) -> bool {
    if budget["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow" {
        return true;
    }
    let status = &budget["status"];
    let healthy = status["currentHealthy"].as_i64().unwrap_or(0);
    let desired = status["desiredHealthy"].as_i64().unwrap_or(0);
    healthy >= desired && desired > 0
}

/// The budgets in the pod's namespace whose selector matches it. A pod without labels has none,
/// and a nil or empty selector matches nothing (unlike in the disruption controller).
pub fn matching_budgets(store: &Store, pod: &Value) -> Vec<std::sync::Arc<Value>> {
    if pod["metadata"]["labels"]
        .as_object()
        .is_none_or(serde_json::Map::is_empty)
    {
        return Vec::new();
    }
    let budgets = store.kind("policy", "poddisruptionbudgets");
    store
        .list(
            &budgets,
            pod["metadata"]["namespace"].as_str(),
            None,
            0,
            &|budget| {
                LabelSelector::from_object(&budget["spec"]["selector"])
                    .is_ok_and(|selector| !selector.is_everything() && selector.matches(pod))
            },
        )
        .items
}

/// eviction.go's checkAndDecrement, done atomically on the stored budget (the real server's
/// retry-on-conflict loop converges to the same thing).
fn check_and_decrement(
    store: &Store,
    namespace: &str,
    budget: &str,
    pod: &str,
    dry_run: bool,
) -> Result<(), ApiError> {
    let kind = store.kind("policy", "poddisruptionbudgets");
    store.update(&kind, Some(namespace), budget, Part::Status, |current| {
        let status = &current["status"];
        let generation = current["metadata"]["generation"].as_i64().unwrap_or(0);
        if status["observedGeneration"].as_i64().unwrap_or(0) < generation {
            return Err(budget_being_processed(budget));
        }
        let allowed = status["disruptionsAllowed"].as_i64().unwrap_or(0);
        if allowed < 0 {
            return Err(ApiError::forbidden_object(
                "policy",
                "poddisruptionbudget",
                budget,
                "pdb disruptions allowed is negative",
            ));
        }
        if status["disruptedPods"]
            .as_object()
            .is_some_and(|pods| pods.len() > MAX_DISRUPTED_PODS)
        {
            return Err(ApiError::forbidden_object(
                "policy",
                "poddisruptionbudget",
                budget,
                "DisruptedPods map too big - too many evictions not confirmed by PDB controller",
            ));
        }
        if allowed == 0 {
            return Err(ApiError::too_many_requests(
                VIOLATION_MESSAGE,
                &[(
                    "DisruptionBudget",
                    format!(
                        "The disruption budget {budget} needs {} healthy pods and has {} currently",
                        status["desiredHealthy"].as_i64().unwrap_or(0),
                        status["currentHealthy"].as_i64().unwrap_or(0)
                    ),
                )],
                0,
            ));
        }
        if dry_run {
            return Ok(current.clone());
        }
        let mut updated = current.clone();
        updated["status"]["disruptionsAllowed"] = json!(allowed - 1);
        if allowed == 1 {
            mark_insufficient(&mut updated["status"]);
        }
        if !updated["status"]["disruptedPods"].is_object() {
            updated["status"]["disruptedPods"] = json!({});
        }
        updated["status"]["disruptedPods"][pod] = json!(now_rfc3339());
        Ok(updated)
    })?;
    Ok(())
}

/// pdbhelper.UpdateDisruptionAllowedCondition once no disruption is left.
fn mark_insufficient(status: &mut Value) {
    let condition = json!({
        "type": "DisruptionAllowed",
        "status": "False",
        "reason": "InsufficientPods",
        "message": "",
        "lastTransitionTime": now_rfc3339(),
    });
    let Some(conditions) = status["conditions"].as_array_mut() else {
        status["conditions"] = json!([condition]);
        return;
    };
    match conditions
        .iter_mut()
        .find(|c| c["type"] == "DisruptionAllowed")
    {
        Some(existing) if existing["status"] == "False" => {
            existing["reason"] = condition["reason"].clone();
        }
        Some(existing) => *existing = condition,
        None => conditions.push(condition),
    }
}

/// eviction.go's addConditionAndDeletePod: the preconditions are checked against the latest
/// pod, the `DisruptionTarget` condition is written (bumping a version precondition to the
/// version that write made), then the pod is deleted.
fn delete_with_condition(
    store: &Store,
    audit: &Audit,
    user: &str,
    pod: &Value,
    options: &DeleteOptions,
) -> Result<(), ApiError> {
    let pods = store.kind("", "pods");
    let namespace = pod["metadata"]["namespace"].as_str();
    let name = text(&pod["metadata"]["name"]);
    if options.dry_run {
        let latest = store.get(&pods, namespace, name)?;
        return options.preconditions.check(&pods, name, &latest);
    }
    let marked = store.update(&pods, namespace, name, Part::Status, |latest| {
        options.preconditions.check(&pods, name, latest)?;
        let mut updated = latest.clone();
        let condition = json!({
            "type": "DisruptionTarget",
            "status": "True",
            "reason": "EvictionByEvictionAPI",
            "message": "Eviction API: evicting",
        });
        set_condition(&mut updated, condition, &now_rfc3339());
        Ok(updated)
    })?;
    let mut options = options.clone();
    if options.preconditions.resource_version.is_some() {
        options.preconditions.resource_version = Some(version_of(&marked));
    }
    audit.pod_leaving(store, &marked, Disruption::Eviction, user);
    store.delete(&pods, namespace, name, &options)?;
    audit.evicted(store, &marked, user);
    Ok(())
}
