//! Decoding as the API server decodes a built-in kind's body: into its Go type. A value of the
//! wrong JSON type (a string where an `int32` belongs) fails the request with 400 "… cannot be
//! handled as a …"; a field the type does not have is unknown — refused under
//! `fieldValidation=Strict` (kubectl's default), dropped otherwise. The Go types' shapes come
//! from k8s-openapi's structs of the same release, whose decoders skip unknown fields through
//! `IgnoredAny`, which `serde_ignored` reports.

use std::fmt::Write;

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::error::ApiError;
use crate::resources::ResourceType;

/// One step of a path into a JSON value.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Step {
    Field(String),
    Index(usize),
}

fn steps(path: &serde_ignored::Path<'_>) -> Vec<Step> {
    use serde_ignored::Path;
    match path {
        Path::Root => Vec::new(),
        Path::Seq { parent, index } => {
            let mut steps = steps(parent);
            steps.push(Step::Index(*index));
            steps
        }
        Path::Map { parent, key } => {
            let mut steps = steps(parent);
            steps.push(Step::Field(key.clone()));
            steps
        }
        Path::Some { parent }
        | Path::NewtypeStruct { parent }
        | Path::NewtypeVariant { parent } => steps(parent),
    }
}

/// As the Go decoder names a field: `spec.containers[0].name`.
fn dotted(steps: &[Step]) -> String {
    let mut text = String::new();
    for step in steps {
        match step {
            Step::Field(field) => {
                if !text.is_empty() {
                    text.push('.');
                }
                text.push_str(field);
            }
            Step::Index(index) => {
                let _ = write!(text, "[{index}]");
            }
        }
    }
    text
}

fn remove(object: &mut Value, steps: &[Step]) {
    let Some((last, parents)) = steps.split_last() else {
        return;
    };
    let mut value = object;
    for step in parents {
        value = match step {
            Step::Field(field) => match value.get_mut(field) {
                Some(child) => child,
                None => return,
            },
            Step::Index(index) => match value.get_mut(index) {
                Some(child) => child,
                None => return,
            },
        };
    }
    if let (Step::Field(field), Some(map)) = (last, value.as_object_mut()) {
        map.remove(field);
    }
}

/// Maps of resource quantities, and the quantity fields: Go's `resource.Quantity` takes a JSON
/// number as well as a string (`cpu: 1`), where k8s-openapi's `Quantity` takes only strings.
const QUANTITY_MAPS: &[&str] = &[
    "requests",
    "limits",
    "capacity",
    "allocatable",
    "hard",
    "used",
    "overhead",
    "allocatedResources",
];

fn quantities_as_strings(value: &mut Value) {
    match value {
        Value::Object(map) => {
            for (key, child) in map.iter_mut() {
                let quantities = QUANTITY_MAPS.contains(&key.as_str());
                match child {
                    Value::Number(number) if key == "sizeLimit" => {
                        *child = Value::String(number.to_string());
                    }
                    Value::Object(entries) if quantities => {
                        for entry in entries.values_mut() {
                            if let Value::Number(number) = entry {
                                *entry = Value::String(number.to_string());
                            }
                        }
                    }
                    _ => quantities_as_strings(child),
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(quantities_as_strings),
        _ => {}
    }
}

/// Go's name for what serde expected (`i32` → `int32`).
fn go_type(expected: &str) -> &str {
    match expected {
        "i32" => "int32",
        "i64" => "int64",
        "u32" => "uint32",
        "u64" => "uint64",
        "f64" => "float64",
        "a boolean" => "bool",
        "a string" => "string",
        "a sequence" => "array",
        other => other,
    }
}

/// The Go decoder's wording of a type mismatch, when serde's message is one:
/// `invalid type: string "15", expected i32` at `spec.leaseDurationSeconds` becomes
/// `json: cannot unmarshal string into Go struct field .spec.leaseDurationSeconds of type int32`.
fn mismatch(path: &str, serde_message: &str) -> String {
    let described = serde_message
        .strip_prefix("invalid type: ")
        .and_then(|rest| rest.split_once(", expected "));
    let Some((found, expected)) = described else {
        return format!("json: {path}: {serde_message}");
    };
    let found = match found.split_whitespace().next().unwrap_or(found) {
        "integer" | "floating" => "number",
        "boolean" => "bool",
        "sequence" => "array",
        "map" => "object",
        other => other,
    };
    format!(
        "json: cannot unmarshal {found} into Go struct field .{path} of type {}",
        go_type(expected)
    )
}

/// The paths of the unknown fields a decoding met, or why it failed.
type Decoded = Result<Vec<Vec<Step>>, String>;
type Decoder = fn(&Value) -> Decoded;

fn decode<T: DeserializeOwned>(object: &Value) -> Decoded {
    let mut unknown = Vec::new();
    let mut note = |path: serde_ignored::Path<'_>| unknown.push(steps(&path));
    let ignored = serde_ignored::Deserializer::new(object, &mut note);
    let decoded: Result<T, _> = serde_path_to_error::deserialize(ignored);
    match decoded {
        Ok(_) => Ok(unknown),
        Err(error) => Err(mismatch(
            &error.path().to_string(),
            &error.inner().to_string(),
        )),
    }
}

/// The decoder of a built-in kind's Go type; None for kinds without one here.
fn decoder(kind: &ResourceType) -> Option<Decoder> {
    use k8s_openapi::api;
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1 as apiextensions;
    use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1 as apiregistration;
    let decoder: Decoder = match (kind.group.as_str(), kind.kind.as_str()) {
        ("", "Pod") => decode::<api::core::v1::Pod>,
        ("", "Node") => decode::<api::core::v1::Node>,
        ("", "Namespace") => decode::<api::core::v1::Namespace>,
        ("", "Event") => decode::<api::core::v1::Event>,
        ("", "PersistentVolumeClaim") => decode::<api::core::v1::PersistentVolumeClaim>,
        ("", "PersistentVolume") => decode::<api::core::v1::PersistentVolume>,
        ("", "ConfigMap") => decode::<api::core::v1::ConfigMap>,
        ("", "Secret") => decode::<api::core::v1::Secret>,
        ("", "Service") => decode::<api::core::v1::Service>,
        ("", "Endpoints") => decode::<api::core::v1::Endpoints>,
        ("", "ServiceAccount") => decode::<api::core::v1::ServiceAccount>,
        ("coordination.k8s.io", "Lease") => decode::<api::coordination::v1::Lease>,
        ("policy", "PodDisruptionBudget") => decode::<api::policy::v1::PodDisruptionBudget>,
        ("storage.k8s.io", "VolumeAttachment") => decode::<api::storage::v1::VolumeAttachment>,
        ("events.k8s.io", "Event") => decode::<api::events::v1::Event>,
        ("apps", "ReplicaSet") => decode::<api::apps::v1::ReplicaSet>,
        ("apps", "DaemonSet") => decode::<api::apps::v1::DaemonSet>,
        ("apps", "Deployment") => decode::<api::apps::v1::Deployment>,
        ("apps", "StatefulSet") => decode::<api::apps::v1::StatefulSet>,
        ("apps", "ControllerRevision") => decode::<api::apps::v1::ControllerRevision>,
        ("batch", "Job") => decode::<api::batch::v1::Job>,
        ("batch", "CronJob") => decode::<api::batch::v1::CronJob>,
        ("rbac.authorization.k8s.io", "Role") => decode::<api::rbac::v1::Role>,
        ("rbac.authorization.k8s.io", "ClusterRole") => decode::<api::rbac::v1::ClusterRole>,
        ("rbac.authorization.k8s.io", "RoleBinding") => decode::<api::rbac::v1::RoleBinding>,
        ("rbac.authorization.k8s.io", "ClusterRoleBinding") => {
            decode::<api::rbac::v1::ClusterRoleBinding>
        }
        ("scheduling.k8s.io", "PriorityClass") => decode::<api::scheduling::v1::PriorityClass>,
        ("admissionregistration.k8s.io", "ValidatingWebhookConfiguration") => {
            decode::<api::admissionregistration::v1::ValidatingWebhookConfiguration>
        }
        ("admissionregistration.k8s.io", "MutatingWebhookConfiguration") => {
            decode::<api::admissionregistration::v1::MutatingWebhookConfiguration>
        }
        ("admissionregistration.k8s.io", "ValidatingAdmissionPolicy") => {
            decode::<api::admissionregistration::v1::ValidatingAdmissionPolicy>
        }
        ("admissionregistration.k8s.io", "ValidatingAdmissionPolicyBinding") => {
            decode::<api::admissionregistration::v1::ValidatingAdmissionPolicyBinding>
        }
        ("apiextensions.k8s.io", "CustomResourceDefinition") => {
            decode::<apiextensions::CustomResourceDefinition>
        }
        ("apiregistration.k8s.io", "APIService") => decode::<apiregistration::APIService>,
        _ => return None,
    };
    Some(decoder)
}

/// Decodes a built-in object as its Go type would, in place: quantities given as numbers become
/// strings; unknown fields are an error when `strict`, else dropped.
pub fn decode_builtin(
    kind: &ResourceType,
    object: &mut Value,
    strict: bool,
) -> Result<(), ApiError> {
    let Some(decoder) = decoder(kind) else {
        return Ok(());
    };
    quantities_as_strings(object);
    // The body's apiVersion and kind are the route's (a body may leave them out).
    let mut typed = object.clone();
    typed["apiVersion"] = Value::String(kind.api_version());
    typed["kind"] = Value::String(kind.kind.clone());
    let cannot = |why: String| {
        ApiError::bad_request(format!(
            "{kind} in version \"{version}\" cannot be handled as a {kind}: {why}",
            kind = kind.kind,
            version = kind.version
        ))
    };
    let unknown = decoder(&typed).map_err(cannot)?;
    if unknown.is_empty() {
        return Ok(());
    }
    if strict {
        let listed: Vec<String> = unknown
            .iter()
            .map(|steps| format!("unknown field \"{}\"", dotted(steps)))
            .collect();
        return Err(cannot(format!(
            "strict decoding error: {}",
            listed.join(", ")
        )));
    }
    for steps in &unknown {
        remove(object, steps);
    }
    Ok(())
}

/// Drops the fields `metadata` has that `ObjectMeta` has not (a custom resource's metadata, or an
/// embedded resource's, is decoded into one too), naming them under `path`. Metadata that does
/// not decode is left to validation.
pub fn prune_object_meta(metadata: &mut Value, path: &str, unknown: &mut Vec<String>) {
    let Ok(found) = decode::<k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta>(metadata)
    else {
        return;
    };
    for steps in &found {
        remove(metadata, steps);
        unknown.push(format!("{path}.{}", dotted(steps)));
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::decode_builtin;
    use crate::resources::Registry;

    fn kind(group: &str, plural: &str) -> std::sync::Arc<crate::resources::ResourceType> {
        Registry::default().find_any_version(group, plural).unwrap()
    }

    #[test]
    fn unknown_fields_are_named_as_the_go_decoder_names_them() {
        let mut pod = json!({"metadata": {"name": "p", "colour": "red"}, "spec": {"containers": [{"name": "c", "image": "i", "imagePolicy": "x"}]}});
        let error = decode_builtin(&kind("", "pods"), &mut pod.clone(), true).unwrap_err();
        assert_eq!(error.code, 400);
        assert_eq!(
            error.message,
            "Pod in version \"v1\" cannot be handled as a Pod: strict decoding error: unknown field \"metadata.colour\", unknown field \"spec.containers[0].imagePolicy\""
        );
        decode_builtin(&kind("", "pods"), &mut pod, false).unwrap();
        assert_eq!(
            pod,
            json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "i"}]}})
        );
    }

    #[test]
    fn a_value_of_the_wrong_type_is_refused_whatever_the_validation() {
        let mut lease = json!({"metadata": {"name": "l"}, "spec": {"leaseDurationSeconds": "15"}});
        let error =
            decode_builtin(&kind("coordination.k8s.io", "leases"), &mut lease, false).unwrap_err();
        assert_eq!(
            error.message,
            "Lease in version \"v1\" cannot be handled as a Lease: json: cannot unmarshal string into Go struct field .spec.leaseDurationSeconds of type int32"
        );
    }

    #[test]
    fn metadata_keeps_only_what_object_meta_has() {
        let mut metadata = json!({"name": "w", "labels": {"a": "b"}, "colour": "red"});
        let mut unknown = Vec::new();
        super::prune_object_meta(&mut metadata, "metadata", &mut unknown);
        assert_eq!(metadata, json!({"name": "w", "labels": {"a": "b"}}));
        assert_eq!(unknown, ["metadata.colour"]);
    }

    #[test]
    fn quantities_may_be_numbers() {
        let mut pod = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": 1}}}]}});
        decode_builtin(&kind("", "pods"), &mut pod, true).unwrap();
        assert_eq!(
            pod["spec"]["containers"][0]["resources"]["requests"]["cpu"],
            "1"
        );
    }
}
