//! The disruption controller: each PodDisruptionBudget's status from the pods it selects.

use std::collections::HashSet;

use serde_json::{Value, json};

use crate::conditions::is_ready;
use crate::selector::LabelSelector;
use crate::store::strategy::now_rfc3339;
use crate::store::{Change, Part, Store};

pub fn concerns(change: &Change) -> bool {
    matches!(
        change.collection.as_str(),
        "/pods" | "policy/poddisruptionbudgets" | "apps/replicasets" | "apps/daemonsets"
    )
}

/// An IntOrString against `total`: integers as they are, percentages rounded up.
fn scaled(value: &Value, total: i64) -> Option<i64> {
    match value {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => {
            let percent: i64 = s.strip_suffix('%')?.trim().parse().ok()?;
            Some((percent * total + 99) / 100)
        }
        _ => None,
    }
}

/// The pods' controllers' scale: what the budget protects when it is expressed relatively.
fn expected_from_controllers(store: &Store, pods: &[&Value]) -> i64 {
    let mut seen = HashSet::new();
    let mut expected = 0;
    for pod in pods {
        let Some(owner) = pod["metadata"]["ownerReferences"]
            .as_array()
            .and_then(|o| o.iter().find(|o| o["controller"] == true))
        else {
            expected += 1;
            continue;
        };
        let uid = owner["uid"].as_str().unwrap_or_default();
        if !seen.insert(uid.to_owned()) {
            continue;
        }
        let namespace = pod["metadata"]["namespace"].as_str();
        let name = owner["name"].as_str().unwrap_or_default();
        expected += match owner["kind"].as_str() {
            Some("ReplicaSet") => store
                .get(&store.kind("apps", "replicasets"), namespace, name)
                .ok()
                .and_then(|rs| rs["spec"]["replicas"].as_i64())
                .unwrap_or(1),
            Some("DaemonSet") => store
                .get(&store.kind("apps", "daemonsets"), namespace, name)
                .ok()
                .and_then(|ds| ds["status"]["desiredNumberScheduled"].as_i64())
                .unwrap_or(1),
            _ => 1,
        };
    }
    expected
}

pub fn reconcile(store: &Store) {
    let pods_kind = store.kind("", "pods");
    let kind = store.kind("policy", "poddisruptionbudgets");
    for budget in store.all(&kind) {
        let namespace = budget["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let Ok(selector) = LabelSelector::from_object(&budget["spec"]["selector"]) else {
            continue;
        };
        let selected = store
            .list(&pods_kind, Some(&namespace), None, 0, &|pod| {
                selector.matches(pod)
            })
            .items;
        let live: Vec<&Value> = selected
            .iter()
            .map(|pod| &**pod)
            .filter(|pod| {
                !matches!(
                    pod["status"]["phase"].as_str(),
                    Some("Succeeded" | "Failed")
                )
            })
            .collect();
        // Pods evicted but not yet seen deleting are already spent.
        let disrupted: Vec<String> = budget["status"]["disruptedPods"]
            .as_object()
            .map(|pods| {
                pods.keys()
                    .filter(|name| {
                        live.iter().any(|pod| {
                            pod["metadata"]["name"] == name.as_str()
                                && !pod["metadata"]["deletionTimestamp"].is_string()
                        })
                    })
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        let healthy = i64::try_from(
            live.iter()
                .filter(|pod| is_ready(pod) && !pod["metadata"]["deletionTimestamp"].is_string())
                .filter(|pod| {
                    !disrupted
                        .iter()
                        .any(|name| pod["metadata"]["name"] == name.as_str())
                })
                .count(),
        )
        .unwrap_or(0);
        let spec = &budget["spec"];
        let (expected, desired) = if let Some(min) = spec["minAvailable"].as_i64() {
            (i64::try_from(live.len()).unwrap_or(0), min)
        } else {
            let expected = expected_from_controllers(store, &live);
            let desired = if spec["minAvailable"].is_string() {
                scaled(&spec["minAvailable"], expected).unwrap_or(expected)
            } else if spec["maxUnavailable"].is_null() {
                // Neither given: the API defaults minAvailable to 1.
                1
            } else {
                expected - scaled(&spec["maxUnavailable"], expected).unwrap_or(0)
            };
            (expected, desired.max(0))
        };
        let allowed = (healthy - desired).max(0);
        let name = budget["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let _ = store.update(&kind, Some(&namespace), &name, Part::Status, |current| {
            let mut updated = current.clone();
            let previous_allowed = current["status"]["conditions"][0]["status"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            let now_allowed = if allowed > 0 { "True" } else { "False" };
            let transition = if previous_allowed == now_allowed {
                current["status"]["conditions"][0]["lastTransitionTime"].clone()
            } else {
                json!(now_rfc3339())
            };
            let disrupted_pods: serde_json::Map<String, Value> = disrupted
                .iter()
                .map(|name| {
                    (
                        name.clone(),
                        current["status"]["disruptedPods"][name].clone(),
                    )
                })
                .collect();
            updated["status"] = json!({
                "observedGeneration": current["metadata"]["generation"],
                "currentHealthy": healthy,
                "desiredHealthy": desired,
                "expectedPods": expected,
                "disruptionsAllowed": allowed,
                "disruptedPods": disrupted_pods,
                "conditions": [{
                    "type": "DisruptionAllowed",
                    "status": now_allowed,
                    "reason": if allowed > 0 { "SufficientPods" } else { "InsufficientPods" },
                    "message": "",
                    "observedGeneration": current["metadata"]["generation"],
                    "lastTransitionTime": transition,
                }],
            });
            Ok(updated)
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentages_round_up() {
        assert_eq!(scaled(&json!("50%"), 3), Some(2));
        assert_eq!(scaled(&json!("10%"), 10), Some(1));
        assert_eq!(scaled(&json!(2), 10), Some(2));
        assert_eq!(scaled(&json!("x"), 10), None);
    }
}
