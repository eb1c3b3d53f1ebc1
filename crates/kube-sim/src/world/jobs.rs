//! The Job controller (pkg/controller/job/job_controller.go), reduced to non-indexed Jobs: it
//! keeps `parallelism` pods running until `completions` have succeeded, counts failed pods
//! against `backoffLimit` (retrying at once, without the real 10 s doubling back-off), ends a
//! Job past its `activeDeadlineSeconds`, and writes the status and the terminal conditions
//! (`SuccessCriteriaMet` then `Complete`; `FailureTarget` then `Failed`) that `helm` and
//! `kubectl wait --for=condition=complete` read.

use std::sync::Arc;

use serde_json::{Value, json};

use crate::store::timestamps::now_rfc3339;
use crate::store::{Change, DeleteOptions, Part, Store};

pub fn concerns(change: &Change) -> bool {
    matches!(change.collection.as_str(), "/pods" | "batch/jobs")
}

fn text(value: &Value) -> &str {
    value.as_str().unwrap_or_default()
}

fn count(value: &Value, default: i64) -> usize {
    usize::try_from(value.as_i64().unwrap_or(default)).unwrap_or(0)
}

fn owned_by<'a>(pods: &'a [Arc<Value>], uid: &str) -> Vec<&'a Arc<Value>> {
    pods.iter()
        .filter(|pod| {
            pod["metadata"]["ownerReferences"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|owner| owner["controller"] == true && owner["uid"] == uid)
        })
        .collect()
}

fn phase(pod: &Value) -> &str {
    text(&pod["status"]["phase"])
}

fn finished(job: &Value) -> bool {
    job["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| matches!(text(&c["type"]), "Complete" | "Failed") && c["status"] == "True")
}

pub fn reconcile(store: &Store) {
    let pods_kind = store.kind("", "pods");
    let pods = store.all(&pods_kind);
    for job in store.all(&store.kind("batch", "jobs")) {
        if finished(&job)
            || job["spec"]["suspend"] == true
            || job["metadata"]["deletionTimestamp"].is_string()
        {
            continue;
        }
        reconcile_job(store, &job, &owned_by(&pods, text(&job["metadata"]["uid"])));
    }
}

fn reconcile_job(store: &Store, job: &Value, pods: &[&Arc<Value>]) {
    let pods_kind = store.kind("", "pods");
    let namespace = text(&job["metadata"]["namespace"]);
    let succeeded = pods.iter().filter(|p| phase(p) == "Succeeded").count();
    let failed = pods.iter().filter(|p| phase(p) == "Failed").count();
    let active: Vec<&&Arc<Value>> = pods
        .iter()
        .filter(|p| !matches!(phase(p), "Succeeded" | "Failed"))
        .collect();
    let completions = count(&job["spec"]["completions"], 1);
    let parallelism = count(&job["spec"]["parallelism"], 1);
    let backoff_limit = count(&job["spec"]["backoffLimit"], 6);
    let start_time = job["status"]["startTime"]
        .as_str()
        .map_or_else(now_rfc3339, str::to_owned);
    let past_deadline = job["spec"]["activeDeadlineSeconds"]
        .as_i64()
        .zip(start_time.parse::<jiff::Timestamp>().ok())
        .is_some_and(|(seconds, started)| {
            jiff::Timestamp::now().as_second() - started.as_second() >= seconds
        });
    let ended = if succeeded >= completions {
        Some((
            "SuccessCriteriaMet",
            "Complete",
            "CompletionsReached",
            "Reached expected number of succeeded pods",
        ))
    } else if failed > backoff_limit {
        Some((
            "FailureTarget",
            "Failed",
            "BackoffLimitExceeded",
            "Job has reached the specified backoff limit",
        ))
    } else if past_deadline {
        Some((
            "FailureTarget",
            "Failed",
            "DeadlineExceeded",
            "Job was active longer than specified deadline",
        ))
    } else {
        None
    };
    if ended.is_some() {
        for pod in &active {
            let _ = store.delete(
                &pods_kind,
                Some(namespace),
                text(&pod["metadata"]["name"]),
                &DeleteOptions::default(),
            );
        }
    } else {
        let wanted = parallelism.min(completions.saturating_sub(succeeded));
        for _ in active.len()..wanted {
            let _ = store.create(&pods_kind, Some(namespace), job_pod(job));
        }
    }
    let now = now_rfc3339();
    let _ = store.update(
        &store.kind("batch", "jobs"),
        Some(namespace),
        text(&job["metadata"]["name"]),
        Part::Status,
        |current| {
            let mut updated = current.clone();
            let status = &mut updated["status"];
            status["startTime"] = json!(start_time);
            status["active"] = json!(if ended.is_some() { 0 } else { active.len() });
            status["succeeded"] = json!(succeeded);
            status["failed"] = json!(failed);
            status["ready"] = json!(
                active
                    .iter()
                    .filter(|p| crate::conditions::is_ready(p))
                    .count()
            );
            status["terminating"] = json!(0);
            status["uncountedTerminatedPods"] = json!({});
            if let Some((interim, terminal, reason, message)) = ended {
                let condition = |kind: &str| {
                    json!({"type": kind, "status": "True", "reason": reason, "message": message,
                           "lastProbeTime": now, "lastTransitionTime": now})
                };
                status["conditions"] = json!([condition(interim), condition(terminal)]);
                if terminal == "Complete" {
                    status["completionTime"] = json!(now);
                }
            }
            Ok(updated)
        },
    );
}

fn job_pod(job: &Value) -> Value {
    let template = &job["spec"]["template"];
    let name = text(&job["metadata"]["name"]);
    let mut pod = json!({
        "metadata": {
            "generateName": format!("{name}-"),
            "labels": template["metadata"]["labels"].clone(),
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": name,
                "uid": job["metadata"]["uid"], "controller": true, "blockOwnerDeletion": true}],
        },
        "spec": template["spec"].clone(),
    });
    if let Some(annotations) = template["metadata"]["annotations"].as_object() {
        pod["metadata"]["annotations"] = json!(annotations);
    }
    pod
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_is_finished_only_by_a_true_terminal_condition() {
        assert!(!finished(&json!({"status": {}})));
        assert!(!finished(
            &json!({"status": {"conditions": [{"type": "SuccessCriteriaMet", "status": "True"}]}})
        ));
        assert!(finished(
            &json!({"status": {"conditions": [{"type": "Complete", "status": "True"}]}})
        ));
        assert!(finished(
            &json!({"status": {"conditions": [{"type": "Failed", "status": "True"}]}})
        ));
    }
}
