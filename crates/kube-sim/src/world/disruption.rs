//! The disruption controller: each PodDisruptionBudget's status from the pods it selects.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use serde_json::{Value, json};

use super::events::{self, Source};
use crate::conditions::{is_finished, is_ready};
use crate::error::ApiError;
use crate::selector::LabelSelector;
use crate::store::timestamps::now_rfc3339;
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

/// kube-controller-manager's `DeletionTimeout`: an evicted pod still not deleting by then is
/// counted again (and a `NotDeleted` Warning says so), for an eviction whose delete failed.
pub const DELETION_TIMEOUT: Duration = Duration::from_secs(2 * 60);

pub fn reconcile(store: &Store, deletion_timeout: Duration) {
    let kind = store.kind("policy", "poddisruptionbudgets");
    for budget in store.all(&kind) {
        if let Some(judgement) = judge(store, &budget, deletion_timeout) {
            // A conflict is an eviction that came first; its change brings the next pass.
            let _ = judgement.write(store);
        }
    }
}

/// A budget's status as one reading of it and its pods gives it, and the pods whose eviction
/// went unfinished too long.
struct Judgement {
    budget: Value,
    expired: Vec<Arc<Value>>,
}

impl Judgement {
    /// Writes the status only over the budget as it was read, carrying its resourceVersion as
    /// the real controller's UpdateStatus does: an eviction that spent the budget meanwhile
    /// makes this a conflict instead of being undone.
    fn write(self, store: &Store) -> Result<(), ApiError> {
        let kind = store.kind("policy", "poddisruptionbudgets");
        let meta = &self.budget["metadata"];
        let namespace = meta["namespace"].as_str().unwrap_or_default();
        let name = meta["name"].as_str().unwrap_or_default();
        store.update(&kind, Some(namespace), name, Part::Status, |_| {
            Ok(self.budget.clone())
        })?;
        for pod in &self.expired {
            events::warn(
                store,
                SOURCE,
                pod,
                "NotDeleted",
                &format!("Pod was expected by PDB {namespace}/{name} to be deleted but it wasn't"),
            );
        }
        Ok(())
    }
}

const SOURCE: Source<'static> = Source {
    component: "controllermanager",
    host: None,
};

fn judge(store: &Store, budget: &Value, deletion_timeout: Duration) -> Option<Judgement> {
    let namespace = budget["metadata"]["namespace"].as_str().unwrap_or_default();
    let selector = LabelSelector::from_object(&budget["spec"]["selector"]).ok()?;
    let live: Vec<Arc<Value>> = store
        .list(&store.kind("", "pods"), Some(namespace), None, 0, &|pod| {
            selector.matches(pod) && !is_finished(pod)
        })
        .items;
    let Spent { disrupted, expired } = spent(budget, &live, deletion_timeout);
    let healthy = i64::try_from(
        live.iter()
            .filter(|pod| is_ready(pod) && !pod["metadata"]["deletionTimestamp"].is_string())
            .filter(|pod| {
                !pod["metadata"]["name"]
                    .as_str()
                    .is_some_and(|name| disrupted.contains_key(name))
            })
            .count(),
    )
    .unwrap_or(0);
    let spec = &budget["spec"];
    let (expected, desired) = if let Some(min) = spec["minAvailable"].as_i64() {
        (i64::try_from(live.len()).unwrap_or(0), min)
    } else {
        let live: Vec<&Value> = live.iter().map(|pod| &**pod).collect();
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
    let previous_allowed = budget["status"]["conditions"][0]["status"]
        .as_str()
        .unwrap_or_default();
    let now_allowed = if allowed > 0 { "True" } else { "False" };
    let transition = if previous_allowed == now_allowed {
        budget["status"]["conditions"][0]["lastTransitionTime"].clone()
    } else {
        json!(now_rfc3339())
    };
    let mut judged = budget.clone();
    judged["status"] = json!({
        "observedGeneration": budget["metadata"]["generation"],
        "currentHealthy": healthy,
        "desiredHealthy": desired,
        "expectedPods": expected,
        "disruptionsAllowed": allowed,
        "disruptedPods": disrupted,
        "conditions": [{
            "type": "DisruptionAllowed",
            "status": now_allowed,
            "reason": if allowed > 0 { "SufficientPods" } else { "InsufficientPods" },
            "message": "",
            "observedGeneration": budget["metadata"]["generation"],
            "lastTransitionTime": transition,
        }],
    });
    Some(Judgement {
        budget: judged,
        expired,
    })
}

/// The budget's `disruptedPods` sorted as the disruption controller's buildDisruptedPodMap does.
struct Spent {
    /// Evicted, still there and not yet deleting: not counted healthy.
    disrupted: serde_json::Map<String, Value>,
    /// Evicted longer than the deletion timeout ago and still not deleting.
    expired: Vec<Arc<Value>>,
}

fn spent(budget: &Value, live: &[Arc<Value>], deletion_timeout: Duration) -> Spent {
    let mut disrupted = serde_json::Map::new();
    let mut expired = Vec::new();
    let Some(recorded) = budget["status"]["disruptedPods"].as_object() else {
        return Spent { disrupted, expired };
    };
    let now = Timestamp::now();
    for pod in live {
        if pod["metadata"]["deletionTimestamp"].is_string() {
            continue;
        }
        let Some((name, since)) = pod["metadata"]["name"]
            .as_str()
            .and_then(|name| recorded.get_key_value(name))
        else {
            continue;
        };
        let deadline = since
            .as_str()
            .and_then(|since| since.parse::<Timestamp>().ok())
            .and_then(|since| since.checked_add(deletion_timeout).ok());
        if deadline.is_some_and(|deadline| deadline < now) {
            expired.push(Arc::clone(pod));
        } else {
            disrupted.insert(name.clone(), since.clone());
        }
    }
    Spent { disrupted, expired }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::Audit;
    use crate::eviction::evict;
    use crate::resources::Registry;
    use crate::store::timestamps::format_time;

    /// Three Ready pods of `app: web` under a budget of maxUnavailable 1, judged once.
    fn three_web_pods_under_a_budget() -> Result<Store, ApiError> {
        let store = Store::new(Registry::default(), 1000);
        let pods = store.kind("", "pods");
        for name in ["web-0", "web-1", "web-2"] {
            store.create(
                &pods,
                Some("default"),
                json!({
                    "metadata": {"name": name, "labels": {"app": "web"}},
                    "spec": {"nodeName": "node-1", "containers": [{"name": "c", "image": "i"}]},
                }),
            )?;
            store.update(&pods, Some("default"), name, Part::Status, |pod| {
                let mut pod = pod.clone();
                pod["status"] = json!({"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]});
                Ok(pod)
            })?;
        }
        store.create(
            &budgets(&store),
            Some("default"),
            json!({
                "metadata": {"name": "web"},
                "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "web"}}},
            }),
        )?;
        reconcile(&store, DELETION_TIMEOUT);
        Ok(store)
    }

    fn budgets(store: &Store) -> std::sync::Arc<crate::resources::ResourceType> {
        store.kind("policy", "poddisruptionbudgets")
    }

    fn status(store: &Store) -> Result<Value, ApiError> {
        Ok(store.get(&budgets(store), Some("default"), "web")?["status"].clone())
    }

    fn eviction_of(store: &Store, pod: &str) -> Result<(), ApiError> {
        let eviction = json!({"metadata": {"name": pod}});
        evict(
            store,
            &Audit::default(),
            "test",
            "default",
            pod,
            &eviction,
            false,
        )
    }

    /// What an eviction leaves in the budget when its delete never happens.
    fn evicted_unfinished(store: &Store, pod: &str, ago: Duration) -> Result<(), ApiError> {
        let at = Timestamp::now().checked_sub(ago).expect("a recent time");
        store.update(
            &budgets(store),
            Some("default"),
            "web",
            Part::Status,
            |budget| {
                let mut budget = budget.clone();
                budget["status"]["disruptedPods"] = json!({pod: format_time(at)});
                Ok(budget)
            },
        )?;
        Ok(())
    }

    #[test]
    fn a_status_judged_before_an_eviction_does_not_undo_it() -> Result<(), ApiError> {
        let store = three_web_pods_under_a_budget()?;
        assert_eq!(status(&store)?["disruptionsAllowed"], 1);
        let before = store.get(&budgets(&store), Some("default"), "web")?;
        let stale = judge(&store, &before, DELETION_TIMEOUT).expect("the budget has a selector");

        eviction_of(&store, "web-0")?;
        let conflict = stale
            .write(&store)
            .expect_err("the budget changed after it was judged");
        assert_eq!(conflict.code, 409);

        let spent = status(&store)?;
        assert_eq!(spent["disruptionsAllowed"], 0);
        assert!(spent["disruptedPods"]["web-0"].is_string());
        let refused = eviction_of(&store, "web-1").expect_err("the budget is spent");
        assert_eq!(refused.code, 429);
        // A fresh reading agrees: web-0 is deleting, two healthy pods are what it needs.
        reconcile(&store, DELETION_TIMEOUT);
        let judged = status(&store)?;
        assert_eq!(
            (&judged["currentHealthy"], &judged["disruptionsAllowed"]),
            (&json!(2), &json!(0))
        );
        Ok(())
    }

    #[test]
    fn a_pod_whose_eviction_never_deleted_it_counts_again_after_the_timeout() -> Result<(), ApiError>
    {
        let store = three_web_pods_under_a_budget()?;
        evicted_unfinished(&store, "web-0", Duration::from_secs(115))?;
        reconcile(&store, DELETION_TIMEOUT);
        let within = status(&store)?;
        assert_eq!(within["currentHealthy"], 2);
        assert!(within["disruptedPods"]["web-0"].is_string());

        evicted_unfinished(&store, "web-0", Duration::from_secs(125))?;
        reconcile(&store, DELETION_TIMEOUT);
        let expired = status(&store)?;
        assert_eq!(expired["currentHealthy"], 3);
        assert!(
            expired["disruptedPods"].is_null(),
            "an empty map is omitted"
        );
        assert_eq!(expired["disruptionsAllowed"], 1);

        let events = store.list(
            &store.kind("", "events"),
            Some("default"),
            None,
            0,
            &|event| event["reason"] == "NotDeleted",
        );
        let [event] = events.items.as_slice() else {
            panic!("one NotDeleted event, not {:?}", events.items);
        };
        assert_eq!(event["type"], "Warning");
        assert_eq!(event["involvedObject"]["name"], "web-0");
        assert_eq!(event["source"]["component"], "controllermanager");
        assert_eq!(
            event["message"],
            "Pod was expected by PDB default/web to be deleted but it wasn't"
        );
        Ok(())
    }

    #[test]
    fn percentages_round_up() {
        assert_eq!(scaled(&json!("50%"), 3), Some(2));
        assert_eq!(scaled(&json!("10%"), 10), Some(1));
        assert_eq!(scaled(&json!(2), 10), Some(2));
        assert_eq!(scaled(&json!("x"), 10), None);
    }
}
