//! Per-kind rules the API server applies on create and update: defaults, validation of what
//! our components depend on, the spec/status split, and generation bumps.

use serde_json::{Value, json};

use crate::error::{ApiError, Cause};
use crate::resources::ResourceType;

/// The RFC 3339 timestamp at whole seconds, as `metav1.Time` serialises.
pub fn now_rfc3339() -> String {
    jiff::Timestamp::now()
        .round(jiff::Unit::Second)
        .unwrap_or_else(|_| jiff::Timestamp::now())
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// A random UID in the usual 8-4-4-4-12 form.
pub fn new_uid() -> String {
    let bytes: [u8; 16] = rand::random();
    let hex: String = bytes.iter().fold(String::with_capacity(32), |mut hex, b| {
        use std::fmt::Write;
        let _ = write!(hex, "{b:02x}");
        hex
    });
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

fn generated_suffix() -> String {
    // The API server appends five characters from a consonant-and-digit alphabet.
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    (0..5)
        .map(|_| ALPHABET[rand::random_range(0..ALPHABET.len())] as char)
        .collect()
}

fn invalid(
    kind: &ResourceType,
    name: &str,
    field: &str,
    reason: &'static str,
    message: String,
) -> ApiError {
    ApiError::invalid(
        &kind.group,
        &kind.kind,
        name,
        &[Cause {
            reason,
            field: field.to_owned(),
            message,
        }],
    )
}

/// An RFC 1123 subdomain: what most object names must be.
pub fn is_dns_subdomain(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
}

pub fn prepare_create(
    kind: &ResourceType,
    namespace: &str,
    object: &mut Value,
    priority_of_class: &dyn Fn(&str) -> Option<i64>,
) -> Result<(), ApiError> {
    if !object.is_object() {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object",
        ));
    }
    if !object["metadata"].is_object() {
        object["metadata"] = json!({});
    }
    object["apiVersion"] = Value::String(kind.api_version());
    object["kind"] = Value::String(kind.kind.clone());
    let metadata = &mut object["metadata"];
    let mut name = metadata["name"].as_str().unwrap_or_default().to_owned();
    if name.is_empty() {
        let prefix = metadata["generateName"].as_str().unwrap_or_default();
        if prefix.is_empty() {
            return Err(invalid(
                kind,
                "",
                "metadata.name",
                "FieldValueRequired",
                "Required value: name or generateName is required".to_owned(),
            ));
        }
        name = format!("{prefix}{}", generated_suffix());
        metadata["name"] = Value::String(name.clone());
    }
    if !is_dns_subdomain(&name) {
        return Err(invalid(
            kind,
            &name,
            "metadata.name",
            "FieldValueInvalid",
            format!(
                "Invalid value: \"{name}\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"
            ),
        ));
    }
    if kind.namespaced {
        let given = metadata["namespace"].as_str().unwrap_or_default();
        if !given.is_empty() && given != namespace {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
        metadata["namespace"] = Value::String(namespace.to_owned());
    } else if let Some(map) = metadata.as_object_mut() {
        map.remove("namespace");
    }
    let map = metadata.as_object_mut().expect("made an object above");
    for server_owned in [
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "resourceVersion",
        "managedFields",
    ] {
        map.remove(server_owned);
    }
    map.insert("uid".to_owned(), Value::String(new_uid()));
    map.insert("creationTimestamp".to_owned(), Value::String(now_rfc3339()));
    if kind.has_spec {
        map.insert("generation".to_owned(), json!(1));
    }
    match (kind.group.as_str(), kind.plural.as_str()) {
        ("", "pods") => default_pod(kind, &name, object, priority_of_class)?,
        ("", "namespaces") => {
            object["spec"] = json!({"finalizers": ["kubernetes"]});
            object["status"] = json!({"phase": "Active"});
        }
        ("apiextensions.k8s.io", "customresourcedefinitions") => {
            object["status"] = json!({
                "acceptedNames": object["spec"]["names"].clone(),
                "storedVersions": object["spec"]["versions"].as_array().map(|versions| versions.iter().filter(|v| v["storage"].as_bool() == Some(true)).map(|v| v["name"].clone()).collect::<Vec<_>>()).unwrap_or_default(),
                "conditions": [
                    {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found", "lastTransitionTime": now_rfc3339()},
                    {"type": "Established", "status": "True", "reason": "InitialNamesAccepted", "message": "the initial names have been accepted", "lastTransitionTime": now_rfc3339()},
                ],
            });
        }
        _ => {}
    }
    Ok(())
}

fn default_pod(
    kind: &ResourceType,
    name: &str,
    pod: &mut Value,
    priority_of_class: &dyn Fn(&str) -> Option<i64>,
) -> Result<(), ApiError> {
    let containers = pod["spec"]["containers"].as_array().map_or(0, Vec::len);
    if containers == 0 {
        return Err(invalid(
            kind,
            name,
            "spec.containers",
            "FieldValueRequired",
            "Required value".to_owned(),
        ));
    }
    let spec = &mut pod["spec"];
    for (field, default) in [
        ("terminationGracePeriodSeconds", json!(30)),
        ("restartPolicy", json!("Always")),
        ("dnsPolicy", json!("ClusterFirst")),
        ("schedulerName", json!("default-scheduler")),
    ] {
        if spec[field].is_null() {
            spec[field] = default;
        }
    }
    if let Some(class) = spec["priorityClassName"].as_str().filter(|c| !c.is_empty()) {
        let priority = priority_of_class(class).ok_or_else(|| {
            ApiError::forbidden(format!(
                "pods \"{name}\" is forbidden: no PriorityClass with name {class} was found"
            ))
        })?;
        spec["priority"] = json!(priority);
    } else if spec["priority"].is_null() {
        spec["priority"] = json!(0);
    }
    if pod["status"]["phase"].is_null() {
        pod["status"] = json!({"phase": "Pending"});
    }
    Ok(())
}

pub fn prepare_update(
    kind: &ResourceType,
    current: &Value,
    updated: &mut Value,
    part: super::Part,
) -> Result<(), ApiError> {
    if !updated.is_object() {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object",
        ));
    }
    let name = current["metadata"]["name"].as_str().unwrap_or_default();
    if part == super::Part::Status {
        let status = updated["status"].take();
        *updated = current.clone();
        updated["status"] = status;
        return Ok(());
    }
    if !updated["metadata"].is_object() {
        updated["metadata"] = json!({});
    }
    updated["apiVersion"] = Value::String(kind.api_version());
    updated["kind"] = Value::String(kind.kind.clone());
    let given_name = updated["metadata"]["name"].as_str().unwrap_or_default();
    if !given_name.is_empty() && given_name != name {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({given_name}) does not match the name on the URL ({name})"
        )));
    }
    // Identity and deletion state belong to the server.
    for field in [
        "name",
        "namespace",
        "uid",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "generation",
    ] {
        match current["metadata"].get(field) {
            Some(value) => updated["metadata"][field] = value.clone(),
            None => {
                if let Some(map) = updated["metadata"].as_object_mut() {
                    map.remove(field);
                }
            }
        }
    }
    if kind.has_status {
        match current.get("status") {
            Some(status) => updated["status"] = status.clone(),
            None => {
                if let Some(map) = updated.as_object_mut() {
                    map.remove("status");
                }
            }
        }
    }
    if current["metadata"]["deletionTimestamp"].is_string() {
        let before = finalizers(current);
        if finalizers(updated).iter().any(|f| !before.contains(f)) {
            return Err(invalid(
                kind,
                name,
                "metadata.finalizers",
                "FieldValueForbidden",
                "Forbidden: no new finalizers can be added if the object is being deleted"
                    .to_owned(),
            ));
        }
    }
    if kind.has_spec && updated.get("spec") != current.get("spec") {
        let generation = current["metadata"]["generation"].as_i64().unwrap_or(0);
        updated["metadata"]["generation"] = json!(generation + 1);
    }
    Ok(())
}

pub fn finalizers(object: &Value) -> Vec<String> {
    object["metadata"]["finalizers"]
        .as_array()
        .map(|list| {
            list.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::Registry;

    fn kind(plural: &str) -> std::sync::Arc<ResourceType> {
        Registry::default().find_any_version("", plural).unwrap()
    }

    #[test]
    fn pods_get_the_api_servers_defaults() {
        let mut pod = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "i"}], "priorityClassName": "system-node-critical"}});
        prepare_create(&kind("pods"), "default", &mut pod, &|_| Some(2_000_001_000)).unwrap();
        assert_eq!(pod["spec"]["terminationGracePeriodSeconds"], 30);
        assert_eq!(pod["spec"]["priority"], 2_000_001_000);
        assert_eq!(pod["status"]["phase"], "Pending");
        assert_eq!(pod["metadata"]["namespace"], "default");
        assert_eq!(pod["apiVersion"], "v1");
        assert_eq!(pod["metadata"]["uid"].as_str().unwrap().len(), 36);
    }

    #[test]
    fn invalid_names_and_missing_fields_are_422_with_the_field() {
        let mut bad = json!({"metadata": {"name": "Bad_Name"}});
        let error = prepare_create(&kind("nodes"), "", &mut bad, &|_| None).unwrap_err();
        assert_eq!(error.code, 422);
        assert_eq!(
            error.to_status()["details"]["causes"][0]["field"],
            "metadata.name"
        );
        let mut no_containers = json!({"metadata": {"name": "p"}, "spec": {}});
        let error =
            prepare_create(&kind("pods"), "default", &mut no_containers, &|_| None).unwrap_err();
        assert!(error.message.contains("spec.containers"));
        let mut unknown_class = json!({"metadata": {"name": "p"}, "spec": {"containers": [{}], "priorityClassName": "nope"}});
        assert_eq!(
            prepare_create(&kind("pods"), "default", &mut unknown_class, &|_| None)
                .unwrap_err()
                .code,
            403
        );
    }

    #[test]
    fn generate_name_gets_a_suffix() {
        let mut node = json!({"metadata": {"generateName": "node-"}});
        prepare_create(&kind("nodes"), "", &mut node, &|_| None).unwrap();
        let name = node["metadata"]["name"].as_str().unwrap();
        assert!(name.starts_with("node-") && name.len() == 10, "{name}");
    }

    #[test]
    fn main_updates_keep_status_and_bump_generation_on_spec_change() {
        let current = json!({"metadata": {"name": "n", "uid": "u", "generation": 1}, "spec": {"unschedulable": false}, "status": {"phase": "Running"}});
        let mut updated = json!({"metadata": {"name": "n", "uid": "forged"}, "spec": {"unschedulable": true}, "status": {"phase": "Gone"}});
        prepare_update(
            &kind("nodes"),
            &current,
            &mut updated,
            super::super::Part::Main,
        )
        .unwrap();
        assert_eq!(updated["status"]["phase"], "Running");
        assert_eq!(updated["metadata"]["uid"], "u");
        assert_eq!(updated["metadata"]["generation"], 2);
        let mut status =
            json!({"metadata": {}, "spec": {"unschedulable": false}, "status": {"phase": "Gone"}});
        prepare_update(
            &kind("nodes"),
            &current,
            &mut status,
            super::super::Part::Status,
        )
        .unwrap();
        assert_eq!(status["status"]["phase"], "Gone");
        assert_eq!(status["spec"]["unschedulable"], false);
    }
}
