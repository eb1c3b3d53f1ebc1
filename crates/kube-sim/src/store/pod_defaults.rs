//! What the API server does to a new pod before storing it: its defaults
//! (pkg/apis/core/v1/defaults.go, the Priority admission), the DefaultTolerationSeconds
//! admission's tolerations, the ServiceAccount admission's token volume
//! (plugin/pkg/admission/serviceaccount), and the QoS class its status starts with.

use serde_json::{Value, json};

use super::names::generated_suffix;
use super::validation::invalid;
use crate::error::ApiError;
use crate::resources::ResourceType;

/// Where the ServiceAccount admission mounts a pod's API credentials.
pub const SERVICE_ACCOUNT_MOUNT_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

pub(super) fn default_pod(
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
    Ok(())
}

/// The ServiceAccount admission (plugin/pkg/admission/serviceaccount): the pod runs as
/// `default` unless it names an account, and unless the pod or its account opts out, it gets
/// the projected `kube-api-access-*` volume (a bound token, the cluster's CA, the namespace)
/// mounted read-only in every container. Unlike the real plugin, a pod naming an account that
/// does not exist is not refused.
pub(super) fn mount_service_account_token(
    pod: &mut Value,
    namespace: &str,
    account_automount: &dyn Fn(&str, &str) -> Option<bool>,
) {
    let spec = &mut pod["spec"];
    let named = spec["serviceAccountName"]
        .as_str()
        .filter(|n| !n.is_empty())
        .map(str::to_owned);
    let account = named.unwrap_or_else(|| {
        spec["serviceAccountName"] = json!("default");
        "default".to_owned()
    });
    spec["serviceAccount"] = json!(account);
    let automount = spec["automountServiceAccountToken"]
        .as_bool()
        .or_else(|| account_automount(namespace, &account))
        .unwrap_or(true);
    if !automount {
        return;
    }
    let volume = format!("kube-api-access-{}", generated_suffix());
    let mut mounted = false;
    for list in ["initContainers", "containers"] {
        for container in spec[list].as_array_mut().into_iter().flatten() {
            let taken = container["volumeMounts"].as_array().is_some_and(|mounts| {
                mounts
                    .iter()
                    .any(|m| m["mountPath"] == SERVICE_ACCOUNT_MOUNT_PATH)
            });
            if taken {
                continue;
            }
            if !container["volumeMounts"].is_array() {
                container["volumeMounts"] = json!([]);
            }
            if let Some(mounts) = container["volumeMounts"].as_array_mut() {
                mounts.push(json!({"name": volume, "readOnly": true, "mountPath": SERVICE_ACCOUNT_MOUNT_PATH}));
                mounted = true;
            }
        }
    }
    if !mounted {
        return;
    }
    if !spec["volumes"].is_array() {
        spec["volumes"] = json!([]);
    }
    if let Some(volumes) = spec["volumes"].as_array_mut() {
        volumes.push(json!({
            "name": volume,
            "projected": {
                "defaultMode": 420,
                "sources": [
                    {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                    {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                    {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
                ],
            },
        }));
    }
}

/// The DefaultTolerationSeconds admission
/// (plugin/pkg/admission/defaulttolerationseconds/admission.go): a pod that does not tolerate
/// the not-ready or unreachable NoExecute taint may stay `seconds` on a node that has it.
pub(super) fn default_tolerations(pod: &mut Value, seconds: i64) {
    const TAINTS: [&str; 2] = [
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
    ];
    let tolerated: Vec<bool> = TAINTS
        .iter()
        .map(|taint| {
            pod["spec"]["tolerations"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|t| {
                    let key = t["key"].as_str().unwrap_or_default();
                    let effect = t["effect"].as_str().unwrap_or_default();
                    (key == *taint || key.is_empty())
                        && (effect == "NoExecute" || effect.is_empty())
                })
        })
        .collect();
    for (taint, tolerated) in TAINTS.iter().zip(tolerated) {
        if tolerated {
            continue;
        }
        if !pod["spec"]["tolerations"].is_array() {
            pod["spec"]["tolerations"] = json!([]);
        }
        if let Some(tolerations) = pod["spec"]["tolerations"].as_array_mut() {
            tolerations.push(json!({"key": taint, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": seconds}));
        }
    }
}

/// pkg/apis/core/helper/qos: Guaranteed when every container limits cpu and memory with
/// requests equal to the limits, BestEffort when none asks for anything, else Burstable.
pub(super) fn qos_class(spec: &Value) -> &'static str {
    let containers: Vec<&Value> = ["initContainers", "containers"]
        .iter()
        .flat_map(|field| spec[field].as_array().into_iter().flatten())
        .collect();
    let asks = |c: &&Value| {
        ["requests", "limits"].iter().any(|part| {
            c["resources"][part]
                .as_object()
                .is_some_and(|m| m.contains_key("cpu") || m.contains_key("memory"))
        })
    };
    if !containers.iter().any(asks) {
        return "BestEffort";
    }
    let guaranteed = containers.iter().all(|c| {
        ["cpu", "memory"].iter().all(|resource| {
            let limit = &c["resources"]["limits"][resource];
            let request = &c["resources"]["requests"][resource];
            !limit.is_null() && (request.is_null() || request == limit)
        })
    });
    if guaranteed {
        "Guaranteed"
    } else {
        "Burstable"
    }
}
