//! Defaults and the selector checks of the workload kinds and Services, as their
//! `SetDefaults_*` functions (pkg/apis/apps/v1/defaults.go, pkg/apis/batch/v1/defaults.go,
//! pkg/apis/core/v1/defaults.go) and validation (pkg/apis/apps/validation) give them, so
//! `kubectl rollout status` and controllers see the fields a real server returns.

use serde_json::{Value, json};

use crate::error::ApiError;
use crate::resources::ResourceType;

fn default(object: &mut Value, field: &str, value: Value) {
    if object[field].is_null() {
        object[field] = value;
    }
}

/// The defaults a pod template's spec gets (the ones `prepare_create` gives a pod).
fn default_template(spec: &mut Value) {
    default(spec, "restartPolicy", json!("Always"));
    default(spec, "terminationGracePeriodSeconds", json!(30));
    default(spec, "dnsPolicy", json!("ClusterFirst"));
    default(spec, "schedulerName", json!("default-scheduler"));
    default(spec, "securityContext", json!({}));
}

pub fn apply(kind: &ResourceType, object: &mut Value) -> Result<(), ApiError> {
    match (kind.group.as_str(), kind.plural.as_str()) {
        ("apps", "deployments") => {
            let spec = &mut object["spec"];
            default(spec, "replicas", json!(1));
            default(
                spec,
                "strategy",
                json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": "25%"}}),
            );
            default(spec, "revisionHistoryLimit", json!(10));
            default(spec, "progressDeadlineSeconds", json!(600));
            default_template(&mut spec["template"]["spec"]);
            selector_matches_template(kind, object)
        }
        ("apps", "replicasets") => {
            default(&mut object["spec"], "replicas", json!(1));
            default_template(&mut object["spec"]["template"]["spec"]);
            selector_matches_template(kind, object)
        }
        ("apps", "statefulsets") => {
            let spec = &mut object["spec"];
            default(spec, "replicas", json!(1));
            default(spec, "podManagementPolicy", json!("OrderedReady"));
            default(
                spec,
                "updateStrategy",
                json!({"type": "RollingUpdate", "rollingUpdate": {"partition": 0}}),
            );
            default(spec, "revisionHistoryLimit", json!(10));
            default(
                spec,
                "persistentVolumeClaimRetentionPolicy",
                json!({"whenDeleted": "Retain", "whenScaled": "Retain"}),
            );
            for claim in spec["volumeClaimTemplates"]
                .as_array_mut()
                .into_iter()
                .flatten()
            {
                default(claim, "apiVersion", json!("v1"));
                default(claim, "kind", json!("PersistentVolumeClaim"));
                default(&mut claim["spec"], "volumeMode", json!("Filesystem"));
                default(claim, "status", json!({"phase": "Pending"}));
            }
            default_template(&mut spec["template"]["spec"]);
            selector_matches_template(kind, object)
        }
        ("apps", "daemonsets") => {
            let spec = &mut object["spec"];
            default(
                spec,
                "updateStrategy",
                json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}}),
            );
            default(spec, "revisionHistoryLimit", json!(10));
            default_template(&mut spec["template"]["spec"]);
            selector_matches_template(kind, object)
        }
        ("batch", "jobs") => {
            default_job(object);
            Ok(())
        }
        ("batch", "cronjobs") => {
            let spec = &mut object["spec"];
            default(spec, "concurrencyPolicy", json!("Allow"));
            default(spec, "suspend", json!(false));
            default(spec, "successfulJobsHistoryLimit", json!(3));
            default(spec, "failedJobsHistoryLimit", json!(1));
            default_template(&mut spec["jobTemplate"]["spec"]["template"]["spec"]);
            Ok(())
        }
        ("", "services") => {
            default_service(object);
            Ok(())
        }
        ("", "secrets") => {
            default(object, "type", json!("Opaque"));
            merge_string_data(object);
            Ok(())
        }
        _ => Ok(()),
    }
}

/// A Job's selector is generated from its UID unless `manualSelector` (pkg/registry/batch/job
/// strategy.go, generateSelector), and its pods carry the job's name.
fn default_job(job: &mut Value) {
    let uid = job["metadata"]["uid"].clone();
    let name = job["metadata"]["name"].clone();
    let spec = &mut job["spec"];
    if spec["completions"].is_null() && spec["parallelism"].is_null() {
        spec["completions"] = json!(1);
    }
    default(spec, "parallelism", json!(1));
    default(spec, "backoffLimit", json!(6));
    default(spec, "completionMode", json!("NonIndexed"));
    default(spec, "suspend", json!(false));
    default(spec, "podReplacementPolicy", json!("TerminatingOrFailed"));
    default(spec, "manualSelector", json!(false));
    if spec["manualSelector"] != true {
        spec["selector"] = json!({"matchLabels": {"batch.kubernetes.io/controller-uid": uid}});
        let labels = &mut spec["template"]["metadata"]["labels"];
        if !labels.is_object() {
            *labels = json!({});
        }
        for (key, value) in [
            ("batch.kubernetes.io/controller-uid", &uid),
            ("batch.kubernetes.io/job-name", &name),
            ("controller-uid", &uid),
            ("job-name", &name),
        ] {
            labels[key] = value.clone();
        }
    }
    default_template(&mut spec["template"]["spec"]);
}

/// `stringData` is write-only: its entries go into `data`, base64-encoded, overriding
/// same-named keys (pkg/apis/core/v1/conversion.go, Convert_v1_Secret_To_core_Secret).
pub fn merge_string_data(secret: &mut Value) {
    use base64::Engine;
    let Some(Value::Object(strings)) = secret.as_object_mut().and_then(|s| s.remove("stringData"))
    else {
        return;
    };
    if !secret["data"].is_object() {
        secret["data"] = json!({});
    }
    for (key, value) in strings {
        let encoded =
            base64::engine::general_purpose::STANDARD.encode(value.as_str().unwrap_or_default());
        secret["data"][key] = json!(encoded);
    }
}

/// A ClusterIP Service gets an address from the service range and its ports their protocol
/// and target port.
fn default_service(service: &mut Value) {
    let spec = &mut service["spec"];
    default(spec, "type", json!("ClusterIP"));
    default(spec, "sessionAffinity", json!("None"));
    if spec["clusterIP"] != "None" {
        let address = format!(
            "10.96.{}.{}",
            rand::random_range(0..=255),
            rand::random_range(1..=254)
        );
        default(spec, "clusterIP", json!(address));
    }
    if spec["clusterIPs"].is_null() {
        spec["clusterIPs"] = json!([spec["clusterIP"]]);
    }
    default(spec, "ipFamilies", json!(["IPv4"]));
    default(spec, "ipFamilyPolicy", json!("SingleStack"));
    default(spec, "internalTrafficPolicy", json!("Cluster"));
    for port in spec["ports"].as_array_mut().into_iter().flatten() {
        default(port, "protocol", json!("TCP"));
        if port["targetPort"].is_null() {
            port["targetPort"] = port["port"].clone();
        }
    }
    service["status"] = json!({"loadBalancer": {}});
}

/// A workload's selector is required and must select its own template
/// (apps/validation, ValidateDeploymentSpec and friends).
fn selector_matches_template(kind: &ResourceType, object: &Value) -> Result<(), ApiError> {
    let name = object["metadata"]["name"].as_str().unwrap_or_default();
    let invalid = |field: &str, reason: &'static str, message: String| {
        super::validation::invalid(kind, name, field, reason, message)
    };
    let selector = &object["spec"]["selector"];
    let empty = selector["matchLabels"]
        .as_object()
        .is_none_or(serde_json::Map::is_empty)
        && selector["matchExpressions"]
            .as_array()
            .is_none_or(Vec::is_empty);
    if empty {
        return Err(invalid(
            "spec.selector",
            "FieldValueRequired",
            "Required value".to_owned(),
        ));
    }
    let labels = &object["spec"]["template"]["metadata"]["labels"];
    let template = json!({"metadata": {"labels": labels}});
    if !crate::selector::LabelSelector::from_object(selector)?.matches(&template) {
        return Err(invalid(
            "spec.template.metadata.labels",
            "FieldValueInvalid",
            format!("Invalid value: {labels}: `selector` does not match template `labels`"),
        ));
    }
    Ok(())
}
