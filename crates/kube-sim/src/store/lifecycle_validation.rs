//! Validation of the EvictionRequest API (lifecycle.k8s.io/v1alpha1, Kubernetes 1.37 alpha) and
//! of the pods' `spec.evictionResponders` it reads, as pkg/apis/lifecycle/validation and the
//! types' declarative rules have it (kubernetes/kubernetes 202c97a7, the field names of the 1.37
//! types). The state machine of `status.targetResponders` is checked where a misbehaving client
//! could break the controller's bookkeeping; see the README's Differences for what is not.

use serde_json::Value;

use crate::error::{ApiError, Cause};
use crate::resources::ResourceType;

/// The default responder every pod's Eviction gets: it calls `pods/eviction`.
pub const IMPERATIVE_EVICTOR: &str = "imperative-eviction.k8s.io/evictor";
/// Its priority, below every responder a pod names above the reserved range.
pub const IMPERATIVE_EVICTOR_PRIORITY: i64 = 100;
/// `MaxPodEvictionResponders`.
const MAX_POD_RESPONDERS: usize = 10;
const MAX_PRIORITY: i64 = 100_000;
/// Priorities below this are for responders of `*.k8s.io`.
const RESERVED_PRIORITIES: i64 = 1000;

const INTENTS: [&str; 2] = ["Eviction", "Withdrawn"];
const FINAL_STATES: [&str; 3] = ["Interrupted", "Canceled", "Completed"];
const FINAL_CONDITIONS: [&str; 2] = ["TargetEvicted", "Failed"];

pub fn is_eviction_request(kind: &ResourceType) -> bool {
    kind.group == "lifecycle.k8s.io" && kind.plural == "evictionrequests"
}

pub fn is_eviction(kind: &ResourceType) -> bool {
    kind.group == "lifecycle.k8s.io" && kind.plural == "evictions"
}

fn text(value: &Value) -> &str {
    value.as_str().unwrap_or_default()
}

/// `utilvalidation.IsDomainPrefixedKey`: `acme.io/foo`.
fn domain_prefixed_key(field: &str, key: &str, causes: &mut Vec<Cause>) {
    let valid = key.split_once('/').is_some_and(|(domain, name)| {
        super::validation::is_dns_subdomain(domain)
            && !name.is_empty()
            && name.len() <= 63
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
            && name.starts_with(|c: char| c.is_ascii_alphanumeric())
            && name.ends_with(|c: char| c.is_ascii_alphanumeric())
    });
    if !valid {
        causes.push(Cause::invalid(
            field,
            &format!("\"{key}\""),
            "must be a domain-prefixed key (such as \"acme.io/foo\")",
        ));
    }
}

/// Whether `key`'s domain is Kubernetes' own (`*.k8s.io`, `*.kubernetes.io`).
pub fn is_reserved_domain(key: &str) -> bool {
    let domain = key.split_once('/').map_or(key, |(domain, _)| domain);
    ["k8s.io", "kubernetes.io"]
        .iter()
        .any(|reserved| domain == *reserved || domain.ends_with(&format!(".{reserved}")))
}

fn is_uuid(uid: &str) -> bool {
    let groups: Vec<&str> = uid.split('-').collect();
    groups.iter().map(|group| group.len()).eq([8, 4, 4, 4, 12])
        && groups.iter().all(|group| {
            group
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        })
}

/// `.target.pod`: a union with one member, both fields required, the uid a lowercase UUID.
fn pod_reference(target: &Value, field: &str, causes: &mut Vec<Cause>) {
    let pod = &target["pod"];
    if !pod.is_object() {
        causes.push(Cause::required(&format!("{field}.pod"), ""));
        return;
    }
    if text(&pod["name"]).is_empty() {
        causes.push(Cause::required(&format!("{field}.pod.name"), ""));
    } else if !super::validation::is_dns_subdomain(text(&pod["name"])) {
        causes.push(Cause::invalid(
            &format!("{field}.pod.name"),
            &format!("\"{}\"", text(&pod["name"])),
            "must be a lowercase RFC 1123 subdomain",
        ));
    }
    let uid = text(&pod["uid"]);
    if uid.is_empty() {
        causes.push(Cause::required(&format!("{field}.pod.uid"), ""));
    } else if !is_uuid(uid) {
        causes.push(Cause::invalid(
            &format!("{field}.pod.uid"),
            &format!("\"{uid}\""),
            "must be a lowercase UUID in 8-4-4-4-12 format",
        ));
    }
}

fn refuse(kind: &ResourceType, name: &str, causes: &[Cause]) -> Result<(), ApiError> {
    if causes.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid(&kind.group, &kind.kind, name, causes))
    }
}

fn name_of(object: &Value) -> &str {
    text(&object["metadata"]["name"])
}

fn intent(spec: &Value, field: &str, causes: &mut Vec<Cause>) {
    match spec["intent"].as_str() {
        None | Some("") => causes.push(Cause::required(field, "")),
        Some(intent) if !INTENTS.contains(&intent) => {
            causes.push(Cause::not_supported(field, intent, &INTENTS));
        }
        Some(_) => {}
    }
}

/// ValidateEvictionRequest, plus the declarative rules (required fields, the intent enum, the
/// reserved domains).
pub fn validate_eviction_request(kind: &ResourceType, request: &Value) -> Result<(), ApiError> {
    let spec = &request["spec"];
    let mut causes = Vec::new();
    pod_reference(&spec["target"], "spec.target", &mut causes);
    match spec["requester"].as_str() {
        None | Some("") => causes.push(Cause::required("spec.requester", "")),
        Some(requester) => {
            domain_prefixed_key("spec.requester", requester, &mut causes);
            if is_reserved_domain(requester) {
                causes.push(Cause::forbidden(
                    "spec.requester",
                    "domain names *.k8s.io and *.kubernetes.io are reserved",
                ));
            }
        }
    }
    intent(spec, "spec.intent", &mut causes);
    refuse(kind, name_of(request), &causes)
}

/// ValidateEviction: the target as for a request.
pub fn validate_eviction(kind: &ResourceType, eviction: &Value) -> Result<(), ApiError> {
    let mut causes = Vec::new();
    pod_reference(&eviction["spec"]["target"], "spec.target", &mut causes);
    refuse(kind, name_of(eviction), &causes)
}

/// ValidateEvictionRequestUpdate / ValidateEvictionUpdate: the target and the requester are
/// immutable; the intent may move between its two values.
pub fn validate_update(
    kind: &ResourceType,
    current: &Value,
    updated: &Value,
) -> Result<(), ApiError> {
    let mut causes = Vec::new();
    let immutable: &[&str] = if is_eviction_request(kind) {
        &["target", "requester"]
    } else {
        &["target"]
    };
    for field in immutable {
        if current["spec"][field] != updated["spec"][field] {
            causes.push(Cause::invalid(
                &format!("spec.{field}"),
                &updated["spec"][field].to_string(),
                "field is immutable",
            ));
        }
    }
    if is_eviction_request(kind) {
        intent(&updated["spec"], "spec.intent", &mut causes);
    }
    refuse(kind, name_of(current), &causes)
}

fn names(list: &Value) -> Vec<&str> {
    list.as_array()
        .into_iter()
        .flatten()
        .map(|item| text(&item["name"]))
        .collect()
}

fn condition_true<'a>(status: &'a Value, kind: &str) -> Option<&'a Value> {
    status["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|condition| condition["type"] == kind && condition["status"] == "True")
}

/// ValidateEvictionStatus, where a responder or a requester writing status could corrupt what
/// the evictionrequest-controller keeps: the responder lists keep their names and order, a
/// responder's entry changes only while it is Active, set times stay set, a final state or
/// condition is never undone, and requesters are never dropped.
pub fn validate_eviction_status(
    kind: &ResourceType,
    current: &Value,
    updated: &Value,
) -> Result<(), ApiError> {
    let (old, new) = (&current["status"], &updated["status"]);
    let mut causes = Vec::new();
    let old_targets = names(&old["targetResponders"]);
    let new_targets = names(&new["targetResponders"]);
    if !old_targets.is_empty() && old_targets != new_targets {
        causes.push(Cause::invalid(
            "status.targetResponders",
            &new["targetResponders"].to_string(),
            "must preserve the same length and the same keys in the same order",
        ));
    }
    let responders = names(&new["responders"]);
    if responders != new_targets {
        causes.push(Cause::invalid(
            "status.responders",
            &new["responders"].to_string(),
            "must be the same length as status.targetResponders and contain the same keys in the same order",
        ));
    }
    if causes.is_empty() {
        responder_changes(old, new, &mut causes);
    }
    for condition in FINAL_CONDITIONS {
        if let Some(was) = condition_true(old, condition)
            && condition_true(new, condition) != Some(was)
        {
            causes.push(Cause::invalid(
                "status.conditions",
                &new["conditions"].to_string(),
                &format!("{condition} condition status cannot be reverted"),
            ));
        }
    }
    let kept = names(&new["requesters"]);
    if names(&old["requesters"])
        .iter()
        .any(|name| !kept.contains(name))
    {
        causes.push(Cause::forbidden(
            "status.requesters",
            "requesters cannot be removed",
        ));
    }
    refuse(kind, name_of(current), &causes)
}

fn responder_changes(old: &Value, new: &Value, causes: &mut Vec<Cause>) {
    let empty = Vec::new();
    let old_states = old["targetResponders"].as_array().unwrap_or(&empty);
    let new_states = new["targetResponders"].as_array().unwrap_or(&empty);
    for (index, state) in new_states.iter().enumerate() {
        let was = old_states.get(index).map(|old| text(&old["state"]));
        if let Some(was) = was
            && FINAL_STATES.contains(&was)
            && text(&state["state"]) != was
        {
            causes.push(Cause::invalid(
                &format!("status.targetResponders[{index}].state"),
                &format!("\"{}\"", text(&state["state"])),
                "final state is immutable",
            ));
        }
    }
    let old_statuses = old["responders"].as_array().unwrap_or(&empty);
    let new_statuses = new["responders"].as_array().unwrap_or(&empty);
    for (index, status) in new_statuses.iter().enumerate() {
        let Some(before) = old_statuses.get(index) else {
            continue;
        };
        let field = format!("status.responders[{index}]");
        let active = text(&new_states[index]["state"]) == "Active";
        if status != before && !active {
            causes.push(Cause::invalid(
                &field,
                &status.to_string(),
                "field is immutable",
            ));
            continue;
        }
        for set_once in ["startTime", "completionTime"] {
            if before[set_once].is_string() && status[set_once] != before[set_once] {
                causes.push(Cause::invalid(
                    &format!("{field}.{set_once}"),
                    &status[set_once].to_string(),
                    "field is immutable once set",
                ));
            }
        }
        // RFC 3339 at one precision orders as text.
        if let Some(beat) = before["heartbeatTime"].as_str() {
            match status["heartbeatTime"].as_str() {
                None => causes.push(Cause::required(
                    &format!("{field}.heartbeatTime"),
                    "is required once set",
                )),
                Some(now) if now < beat => causes.push(Cause::invalid(
                    &format!("{field}.heartbeatTime"),
                    &format!("\"{now}\""),
                    "cannot be decreased",
                )),
                Some(_) => {}
            }
        }
        for needs_start in ["heartbeatTime", "expectedCompletionTime", "completionTime"] {
            if status[needs_start].is_string() && !status["startTime"].is_string() {
                causes.push(Cause::invalid(
                    &format!("{field}.{needs_start}"),
                    &status[needs_start].to_string(),
                    &format!("cannot be set before {field}.startTime is set"),
                ));
            }
        }
    }
}

/// A pod's `spec.evictionResponders` on create: at most 10, each a unique domain-prefixed name
/// with a priority in 0..=100000, the priorities below 1000 kept for `*.k8s.io`.
pub fn validate_pod_responders(kind: &ResourceType, pod: &Value) -> Result<(), ApiError> {
    let Some(responders) = pod["spec"]["evictionResponders"].as_array() else {
        return Ok(());
    };
    let mut causes = Vec::new();
    if responders.len() > MAX_POD_RESPONDERS {
        causes.push(Cause::invalid(
            "spec.evictionResponders",
            &responders.len().to_string(),
            &format!("must have at most {MAX_POD_RESPONDERS} items"),
        ));
    }
    let mut seen = Vec::new();
    for (index, responder) in responders.iter().enumerate() {
        let field = format!("spec.evictionResponders[{index}]");
        let name = text(&responder["name"]);
        if name.is_empty() {
            causes.push(Cause::required(&format!("{field}.name"), ""));
        } else {
            domain_prefixed_key(&format!("{field}.name"), name, &mut causes);
            if seen.contains(&name) || name == IMPERATIVE_EVICTOR {
                causes.push(Cause::duplicate(
                    &format!("{field}.name"),
                    &format!("\"{name}\""),
                ));
            }
            seen.push(name);
        }
        match responder["priority"].as_i64() {
            None => causes.push(Cause::required(&format!("{field}.priority"), "")),
            Some(priority) if !(0..=MAX_PRIORITY).contains(&priority) => {
                causes.push(Cause::invalid(
                    &format!("{field}.priority"),
                    &priority.to_string(),
                    &format!("must be between 0 and {MAX_PRIORITY}, inclusive"),
                ));
            }
            Some(priority) if priority < RESERVED_PRIORITIES && !is_reserved_domain(name) => {
                causes.push(Cause::invalid(
                    &format!("{field}.priority"),
                    &priority.to_string(),
                    "the interval 0-999 is reserved for responders with the *.k8s.io suffix",
                ));
            }
            Some(_) => {}
        }
    }
    refuse(kind, name_of(pod), &causes)
}

/// The responders can only be set on creation.
pub fn validate_pod_update(
    kind: &ResourceType,
    current: &Value,
    updated: &Value,
) -> Result<(), ApiError> {
    let (before, after) = (
        &current["spec"]["evictionResponders"],
        &updated["spec"]["evictionResponders"],
    );
    if before == after {
        return Ok(());
    }
    refuse(
        kind,
        name_of(current),
        &[Cause::invalid(
            "spec.evictionResponders",
            &after.to_string(),
            "field is immutable",
        )],
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn kind(plural: &str) -> ResourceType {
        crate::resources::eviction_request_api()
            .into_iter()
            .find(|kind| kind.plural == plural)
            .unwrap()
    }

    fn request(requester: &str, uid: &str, intent: &str) -> Value {
        json!({"metadata": {"name": "r"}, "spec": {"requester": requester, "intent": intent, "target": {"pod": {"name": "db-0", "uid": uid}}}})
    }

    const UID: &str = "55fcee67-c0cb-409d-b610-c16d9d765b7b";

    #[test]
    fn a_request_names_a_domain_requester_a_pod_by_uid_and_an_intent() {
        let requests = kind("evictionrequests");
        validate_eviction_request(
            &requests,
            &request("nodegrace.io/termination-controller", UID, "Eviction"),
        )
        .unwrap();
        for (bad, field) in [
            (
                request("termination-controller", UID, "Eviction"),
                "spec.requester",
            ),
            (request("drain.k8s.io/x", UID, "Eviction"), "spec.requester"),
            (
                request("a.io/x", "not-a-uid", "Eviction"),
                "spec.target.pod.uid",
            ),
            (request("a.io/x", UID, "Evict"), "spec.intent"),
        ] {
            let error = validate_eviction_request(&requests, &bad).unwrap_err();
            assert_eq!(error.code, 422);
            assert!(error.message.contains(field), "{field}: {}", error.message);
        }
    }

    #[test]
    fn the_target_and_requester_are_immutable_the_intent_is_not() {
        let requests = kind("evictionrequests");
        let current = request("a.io/x", UID, "Eviction");
        validate_update(&requests, &current, &request("a.io/x", UID, "Withdrawn")).unwrap();
        let moved = request("a.io/x", "11111111-2222-3333-4444-555555555555", "Eviction");
        assert!(
            validate_update(&requests, &current, &moved)
                .unwrap_err()
                .message
                .contains("spec.target")
        );
        assert!(validate_update(&requests, &current, &request("b.io/x", UID, "Eviction")).is_err());
    }

    #[test]
    fn only_the_active_responder_writes_its_entry_and_final_states_stay() {
        let evictions = kind("evictions");
        let current = json!({"metadata": {"name": "e"}, "status": {
            "targetResponders": [{"name": "a.io/x", "priority": 1000, "state": "Active"}, {"name": IMPERATIVE_EVICTOR, "priority": 100, "state": "Inactive"}],
            "responders": [{"name": "a.io/x", "startTime": "2026-11-30T10:00:00Z"}, {"name": IMPERATIVE_EVICTOR}],
            "requesters": [{"name": "r.io/x", "intent": "Eviction"}],
        }});
        let mut heartbeat = current.clone();
        heartbeat["status"]["responders"][0]["heartbeatTime"] = json!("2026-11-30T10:00:20Z");
        validate_eviction_status(&evictions, &current, &heartbeat).unwrap();
        let mut meddling = current.clone();
        meddling["status"]["responders"][1]["message"] = json!("mine now");
        assert!(validate_eviction_status(&evictions, &current, &meddling).is_err());
        let mut reordered = current.clone();
        reordered["status"]["targetResponders"]
            .as_array_mut()
            .unwrap()
            .reverse();
        assert!(validate_eviction_status(&evictions, &current, &reordered).is_err());
        let mut dropped = current.clone();
        dropped["status"]["requesters"] = json!([]);
        assert!(validate_eviction_status(&evictions, &current, &dropped).is_err());
        let mut done = current.clone();
        done["status"]["targetResponders"][0]["state"] = json!("Completed");
        let mut undone = done.clone();
        undone["status"]["targetResponders"][0]["state"] = json!("Active");
        assert!(validate_eviction_status(&evictions, &done, &undone).is_err());
    }

    #[test]
    fn pod_responders_are_few_unique_and_keep_out_of_the_reserved_priorities() {
        let pods = crate::resources::Registry::default()
            .find("", "v1", "pods")
            .unwrap();
        let pod = |responders: Value| json!({"metadata": {"name": "p"}, "spec": {"evictionResponders": responders}});
        validate_pod_responders(
            &pods,
            &pod(json!([{"name": "db.example.com/failover", "priority": 10000}])),
        )
        .unwrap();
        for bad in [
            json!([{"name": "failover", "priority": 10000}]),
            json!([{"name": "a.io/x", "priority": 500}]),
            json!([{"name": "a.io/x", "priority": 1000}, {"name": "a.io/x", "priority": 2000}]),
            json!([{"name": IMPERATIVE_EVICTOR, "priority": 100}]),
            json!([{"name": "a.io/x", "priority": 100_001}]),
        ] {
            assert!(
                validate_pod_responders(&pods, &pod(bad.clone())).is_err(),
                "{bad}"
            );
        }
    }
}
