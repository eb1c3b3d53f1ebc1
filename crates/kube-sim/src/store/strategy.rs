//! Per-kind rules the API server applies on create and update: defaults, validation of what
//! our components depend on, the spec/status split, and generation bumps.

use serde_json::{Value, json};

use super::lifecycle_validation;
use super::names::{generated_suffix, new_uid};
use super::pod_defaults::{
    default_pod, default_tolerations, mount_service_account_token, qos_class,
};
use super::timestamps::now_rfc3339;
use super::validation::{invalid, is_dns_subdomain};
use crate::error::{ApiError, Cause};
use crate::resources::ResourceType;

/// What creating an object may consult beyond the object itself.
pub struct CreateContext<'a> {
    /// The value of a PriorityClass (Priority admission).
    pub priority_of_class: &'a dyn Fn(&str) -> Option<i64>,
    /// The DefaultTolerationSeconds admission's seconds.
    pub default_toleration_seconds: i64,
    /// A ServiceAccount's `automountServiceAccountToken`, if the account exists and sets it.
    pub account_automount: &'a dyn Fn(&str, &str) -> Option<bool>,
}

pub fn prepare_create(
    kind: &ResourceType,
    namespace: &str,
    object: &mut Value,
    context: &CreateContext<'_>,
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
    // An APIService is named `<version>.<group>`: `v1.` for the core group.
    let core_api_service =
        kind.plural == "apiservices" && name.strip_suffix('.').is_some_and(is_dns_subdomain);
    // RBAC objects may be named like `system:discovery`: any path segment (ValidateRBACName).
    let rbac = kind.group == "rbac.authorization.k8s.io"
        && !matches!(name.as_str(), "." | "..")
        && !name.contains(['/', '%']);
    if !is_dns_subdomain(&name) && !core_api_service && !rbac {
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
    ] {
        map.remove(server_owned);
    }
    map.insert("uid".to_owned(), Value::String(new_uid()));
    map.insert("creationTimestamp".to_owned(), Value::String(now_rfc3339()));
    if kind.has_generation {
        map.insert("generation".to_owned(), json!(1));
    }
    if kind.has_status {
        reset_status(kind, object);
    }
    match (kind.group.as_str(), kind.plural.as_str()) {
        ("", "pods") => {
            lifecycle_validation::validate_pod_responders(kind, object)?;
            default_pod(kind, &name, object, context.priority_of_class)?;
            default_tolerations(object, context.default_toleration_seconds);
            mount_service_account_token(object, namespace, context.account_automount);
        }
        ("", "namespaces") => {
            object["spec"] = json!({"finalizers": ["kubernetes"]});
            object["status"] = json!({"phase": "Active"});
            label_namespace(object, &name);
        }
        ("apps" | "batch", _) | ("", "services" | "secrets") => {
            super::workload_defaults::apply(kind, object)?;
        }
        ("lifecycle.k8s.io", "evictionrequests") => {
            lifecycle_validation::validate_eviction_request(kind, object)?;
        }
        ("lifecycle.k8s.io", "evictions") => {
            lifecycle_validation::validate_eviction(kind, object)?;
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
    as_stored(kind, object)
}

/// Every namespace carries its name as a label, so webhook namespaceSelectors can name it
/// (pkg/registry/core/namespace/strategy.go, PrepareForCreate and PrepareForUpdate).
fn label_namespace(namespace: &mut Value, name: &str) {
    if !namespace["metadata"]["labels"].is_object() {
        namespace["metadata"]["labels"] = json!({});
    }
    namespace["metadata"]["labels"]["kubernetes.io/metadata.name"] = json!(name);
}

/// What a created object's status starts as: clients cannot create status for kinds with a
/// status subresource (each kind's PrepareForCreate resets it), except Nodes, whose kubelet
/// registers them with their status.
fn reset_status(kind: &ResourceType, object: &mut Value) {
    let status = match (kind.group.as_str(), kind.plural.as_str()) {
        ("", "nodes") | ("apiextensions.k8s.io", "customresourcedefinitions") => return,
        ("", "pods") => json!({"phase": "Pending", "qosClass": qos_class(&object["spec"])}),
        ("", "persistentvolumes" | "persistentvolumeclaims") => json!({"phase": "Pending"}),
        ("", "namespaces") => json!({"phase": "Active"}),
        ("policy", "poddisruptionbudgets") => {
            json!({"disruptionsAllowed": 0, "currentHealthy": 0, "desiredHealthy": 0, "expectedPods": 0})
        }
        ("apps", "replicasets" | "statefulsets") => json!({"replicas": 0, "availableReplicas": 0}),
        ("", "services") => json!({"loadBalancer": {}}),
        ("apps", "daemonsets") => {
            json!({"currentNumberScheduled": 0, "numberMisscheduled": 0, "desiredNumberScheduled": 0, "numberReady": 0})
        }
        ("storage.k8s.io", "volumeattachments") => json!({"attached": false}),
        _ => {
            if let Some(map) = object.as_object_mut() {
                map.remove("status");
            }
            return;
        }
    };
    object["status"] = status;
}

/// The object as the API server stores it: time fields as the Go types hold them, and empty
/// `omitempty` fields not written.
fn as_stored(kind: &ResourceType, object: &mut Value) -> Result<(), ApiError> {
    super::omit_empty::omit_empty(kind, object);
    super::timestamps::normalize(kind, object)
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
    // ValidateObjectMetaUpdate: a patch that names another object's uid (the kubelet and the
    // pod GC put the uid they mean in their status patches) is refused, not applied.
    if let Some(uid) = updated["metadata"]["uid"]
        .as_str()
        .filter(|uid| !uid.is_empty())
        && current["metadata"]["uid"].as_str() != Some(uid)
    {
        return Err(invalid(
            kind,
            name,
            "metadata.uid",
            "FieldValueInvalid",
            format!("Invalid value: \"{uid}\": field is immutable"),
        ));
    }
    if kind.group.is_empty() && kind.plural == "secrets" {
        super::workload_defaults::merge_string_data(updated);
    }
    if part == super::Part::Status {
        let status = updated["status"].take();
        let managed = updated["metadata"]["managedFields"].take();
        *updated = current.clone();
        updated["status"] = status;
        if lifecycle_validation::is_eviction(kind) {
            lifecycle_validation::validate_eviction_status(kind, current, updated)?;
        }
        if managed.is_null() {
            if let Some(metadata) = updated["metadata"].as_object_mut() {
                metadata.remove("managedFields");
            }
        } else {
            updated["metadata"]["managedFields"] = managed;
        }
        return as_stored(kind, updated);
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
    if kind.group.is_empty() && kind.plural == "namespaces" {
        label_namespace(updated, name);
    }
    check_immutable(kind, current, updated)?;
    // The desired state: a webhook configuration's is its webhooks (its strategy bumps the
    // generation when they change).
    let desired = if crate::webhook_configuration::is_webhook_configuration(kind) {
        "webhooks"
    } else {
        "spec"
    };
    if kind.has_generation && updated.get(desired) != current.get(desired) {
        let generation = current["metadata"]["generation"].as_i64().unwrap_or(0);
        updated["metadata"]["generation"] = json!(generation + 1);
    }
    as_stored(kind, updated)
}

/// Whether a PUT without `metadata.resourceVersion` may update: each kind's strategy
/// `AllowUnconditionalUpdate` (pkg/registry/*/strategy.go; custom resources never).
pub fn allows_unconditional_update(kind: &ResourceType) -> bool {
    !kind.custom
        && !matches!(
            (kind.group.as_str(), kind.plural.as_str()),
            ("coordination.k8s.io", "leases")
                | ("policy", "poddisruptionbudgets")
                | ("storage.k8s.io", "volumeattachments")
                | ("apiextensions.k8s.io", "customresourcedefinitions")
                | ("admissionregistration.k8s.io", _)
        )
}

/// Whether a PUT of a missing object creates it: each kind's strategy `AllowCreateOnUpdate`.
pub fn allows_create_on_update(kind: &ResourceType) -> bool {
    matches!(
        (kind.group.as_str(), kind.plural.as_str()),
        ("coordination.k8s.io", "leases") | ("", "events")
    )
}

/// store.go's answer to an update without a resourceVersion where the strategy needs one.
pub fn version_required(kind: &ResourceType, name: &str) -> ApiError {
    ApiError::invalid(
        &kind.group,
        &kind.plural,
        name,
        &[Cause {
            reason: "FieldValueInvalid",
            field: "metadata.resourceVersion".to_owned(),
            message: "Invalid value: 0x0: must be specified for an update".to_owned(),
        }],
    )
}

/// Spec changes a kind's ValidateUpdate refuses.
fn check_immutable(kind: &ResourceType, current: &Value, updated: &Value) -> Result<(), ApiError> {
    if kind.is_core_pods() {
        lifecycle_validation::validate_pod_update(kind, current, updated)?;
    }
    if lifecycle_validation::is_eviction_request(kind) || lifecycle_validation::is_eviction(kind) {
        lifecycle_validation::validate_update(kind, current, updated)?;
    }
    // pkg/apis/storage/validation: ValidateVolumeAttachmentUpdate.
    if kind.group == "storage.k8s.io"
        && kind.plural == "volumeattachments"
        && updated.get("spec") != current.get("spec")
    {
        let name = current["metadata"]["name"].as_str().unwrap_or_default();
        return Err(invalid(
            kind,
            name,
            "spec",
            "FieldValueInvalid",
            format!(
                "Invalid value: {}: field is immutable",
                updated.get("spec").unwrap_or(&Value::Null)
            ),
        ));
    }
    Ok(())
}

pub fn finalizers(object: &Value) -> Vec<String> {
    crate::json::owned_strings(&object["metadata"]["finalizers"])
}

/// Whether `object` carries the finalizer `name`.
pub fn has_finalizer(object: &Value, name: &str) -> bool {
    object["metadata"]["finalizers"]
        .as_array()
        .is_some_and(|list| list.iter().any(|f| f == name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::Registry;

    const NO_CLASSES: CreateContext<'static> = CreateContext {
        priority_of_class: &|_| None,
        account_automount: &|_, _| None,
        default_toleration_seconds: 300,
    };

    fn kind(plural: &str) -> std::sync::Arc<ResourceType> {
        Registry::default().find_any_version("", plural).unwrap()
    }

    #[test]
    fn pods_get_the_api_servers_defaults() {
        let mut pod = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "i"}], "priorityClassName": "system-node-critical"}});
        let context = CreateContext {
            priority_of_class: &|_| Some(2_000_001_000),
            account_automount: &|_, _| None,
            default_toleration_seconds: 300,
        };
        prepare_create(&kind("pods"), "default", &mut pod, &context).unwrap();
        assert_eq!(
            pod["spec"]["tolerations"][1]["key"],
            "node.kubernetes.io/unreachable"
        );
        assert_eq!(pod["spec"]["tolerations"][1]["tolerationSeconds"], 300);
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
        let error = prepare_create(&kind("nodes"), "", &mut bad, &NO_CLASSES).unwrap_err();
        assert_eq!(error.code, 422);
        assert_eq!(
            error.to_status()["details"]["causes"][0]["field"],
            "metadata.name"
        );
        let mut no_containers = json!({"metadata": {"name": "p"}, "spec": {}});
        let error =
            prepare_create(&kind("pods"), "default", &mut no_containers, &NO_CLASSES).unwrap_err();
        assert!(error.message.contains("spec.containers"));
        let mut unknown_class = json!({"metadata": {"name": "p"}, "spec": {"containers": [{}], "priorityClassName": "nope"}});
        assert_eq!(
            prepare_create(&kind("pods"), "default", &mut unknown_class, &NO_CLASSES)
                .unwrap_err()
                .code,
            403
        );
    }

    #[test]
    fn generate_name_gets_a_suffix() {
        let mut node = json!({"metadata": {"generateName": "node-"}});
        prepare_create(&kind("nodes"), "", &mut node, &NO_CLASSES).unwrap();
        let name = node["metadata"]["name"].as_str().unwrap();
        assert!(name.starts_with("node-") && name.len() == 10, "{name}");
    }

    #[test]
    fn main_updates_keep_status_and_bump_generation_on_spec_change() {
        let current = json!({"metadata": {"name": "n", "uid": "u", "generation": 1}, "spec": {"unschedulable": false}, "status": {"phase": "Running"}});
        let mut forged = json!({"metadata": {"name": "n", "uid": "forged"}, "spec": {}});
        let error = prepare_update(
            &kind("pods"),
            &current,
            &mut forged,
            super::super::Part::Status,
        )
        .unwrap_err();
        assert_eq!(error.code, 422, "another object's uid: {error:?}");
        let mut updated = json!({"metadata": {"name": "n"}, "spec": {"unschedulable": true}, "status": {"phase": "Gone"}});
        prepare_update(
            &kind("pods"),
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
            &kind("pods"),
            &current,
            &mut status,
            super::super::Part::Status,
        )
        .unwrap();
        assert_eq!(status["status"]["phase"], "Gone");
        assert_eq!(status["spec"]["unschedulable"], false);
    }
}
