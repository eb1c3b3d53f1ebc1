//! The resource types the simulator serves: the built-in kinds our components use, plus those
//! defined by CustomResourceDefinitions at run time.

use std::sync::{Arc, RwLock};

use serde_json::Value;

/// One served resource (a group/version/plural), as discovery describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceType {
    pub group: String,
    pub version: String,
    pub kind: String,
    pub plural: String,
    pub singular: String,
    pub namespaced: bool,
    pub short_names: Vec<String>,
    /// Whether `/status` is a separate subresource (main-resource writes then ignore status).
    pub has_status: bool,
    /// Whether the kind has `metadata.generation`, set to 1 on create and bumped by writes to
    /// `.spec`.
    pub has_generation: bool,
    pub categories: Vec<String>,
    /// Defined by a CRD (no strategic merge patch, schema from the CRD).
    pub custom: bool,
    /// Where a `/scale` subresource finds its numbers, when the kind has one.
    pub scale: Option<ScalePaths>,
}

/// A scale subresource's paths into the object (`.spec.replicas` style, as CRDs declare them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScalePaths {
    pub spec_replicas: String,
    pub status_replicas: String,
    /// Where the label selector is read from, already in string form (custom resources); the
    /// built-in kinds serialise their `spec.selector` instead.
    pub label_selector: Option<String>,
}

impl ResourceType {
    /// `v1` for the core group, `group/version` otherwise.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// core/v1 pods: the kind the store indexes by node.
    pub fn is_core_pods(&self) -> bool {
        self.group.is_empty() && self.plural == "pods"
    }

    /// The store key: one collection per group and plural, whatever the version.
    pub fn key(&self) -> String {
        format!("{}/{}", self.group, self.plural)
    }

    pub fn list_kind(&self) -> String {
        format!("{}List", self.kind)
    }

    /// Reviews (token, access, self-subject) are only ever created, never stored.
    pub fn is_review(&self) -> bool {
        matches!(
            self.group.as_str(),
            "authentication.k8s.io" | "authorization.k8s.io"
        )
    }

    /// The verbs discovery lists: reviews can only be created.
    pub fn verbs(&self) -> &'static [&'static str] {
        if self.is_review() {
            &["create"]
        } else {
            &[
                "create",
                "delete",
                "deletecollection",
                "get",
                "list",
                "patch",
                "update",
                "watch",
            ]
        }
    }

    fn is(&self, group: &str, plural: &str) -> bool {
        self.group == group && self.plural == plural
    }

    /// The subresources served for this kind, as discovery lists them.
    pub fn subresources(&self) -> Vec<Subresource> {
        let mut all = Vec::new();
        if self.has_status {
            all.push(Subresource {
                name: "status",
                response: None,
                verbs: &["get", "patch", "update"],
            });
        }
        if self.scale.is_some() {
            all.push(Subresource {
                name: "scale",
                response: Some(("autoscaling", "v1", "Scale")),
                verbs: &["get", "patch", "update"],
            });
        }
        if self.is("", "pods") {
            all.push(Subresource {
                name: "eviction",
                response: Some(("policy", "v1", "Eviction")),
                verbs: &["create"],
            });
            all.push(Subresource {
                name: "log",
                response: None,
                verbs: &["get"],
            });
        }
        if self.is("", "serviceaccounts") {
            all.push(Subresource {
                name: "token",
                response: Some(("authentication.k8s.io", "v1", "TokenRequest")),
                verbs: &["create"],
            });
        }
        all
    }
}

/// A subresource: its name, the kind it answers with (`None`: the resource's own), its verbs.
#[derive(Debug, Clone, Copy)]
pub struct Subresource {
    pub name: &'static str,
    pub response: Option<(&'static str, &'static str, &'static str)>,
    pub verbs: &'static [&'static str],
}

#[allow(clippy::too_many_arguments)]
fn builtin(
    group: &str,
    version: &str,
    kind: &str,
    plural: &str,
    namespaced: bool,
    short_names: &[&str],
    has_status: bool,
    has_generation: bool,
) -> ResourceType {
    ResourceType {
        group: group.to_owned(),
        version: version.to_owned(),
        kind: kind.to_owned(),
        plural: plural.to_owned(),
        singular: kind.to_lowercase(),
        namespaced,
        short_names: short_names.iter().map(|s| (*s).to_owned()).collect(),
        has_status,
        has_generation,
        categories: Vec::new(),
        custom: false,
        scale: None,
    }
}

/// The resources of a group version with a status subresource and a spec, and none of them
/// with short names: most of the built-in kinds added here.
fn workload(group: &str, kind: &str, plural: &str, short: &[&str]) -> ResourceType {
    builtin(group, "v1", kind, plural, true, short, true, true)
}

/// A kind with neither status nor generation (RBAC, Secrets, ...).
fn plain(group: &str, kind: &str, plural: &str, namespaced: bool, short: &[&str]) -> ResourceType {
    builtin(group, "v1", kind, plural, namespaced, short, false, false)
}

/// The built-in kinds, as their real API groups define them.
pub fn builtins() -> Vec<ResourceType> {
    let mut all = vec![
        builtin(
            "",
            "v1",
            "Namespace",
            "namespaces",
            false,
            &["ns"],
            true,
            true,
        ),
        builtin("", "v1", "Node", "nodes", false, &["no"], true, false),
        builtin("", "v1", "Pod", "pods", true, &["po"], true, true),
        builtin("", "v1", "Event", "events", true, &["ev"], false, false),
        builtin(
            "",
            "v1",
            "PersistentVolumeClaim",
            "persistentvolumeclaims",
            true,
            &["pvc"],
            true,
            false,
        ),
        builtin(
            "",
            "v1",
            "PersistentVolume",
            "persistentvolumes",
            false,
            &["pv"],
            true,
            false,
        ),
        builtin(
            "",
            "v1",
            "ConfigMap",
            "configmaps",
            true,
            &["cm"],
            false,
            false,
        ),
        builtin(
            "",
            "v1",
            "ServiceAccount",
            "serviceaccounts",
            true,
            &["sa"],
            false,
            false,
        ),
        builtin(
            "coordination.k8s.io",
            "v1",
            "Lease",
            "leases",
            true,
            &[],
            false,
            false,
        ),
        builtin(
            "policy",
            "v1",
            "PodDisruptionBudget",
            "poddisruptionbudgets",
            true,
            &["pdb"],
            true,
            true,
        ),
        builtin(
            "storage.k8s.io",
            "v1",
            "VolumeAttachment",
            "volumeattachments",
            false,
            &[],
            true,
            false,
        ),
        builtin(
            "events.k8s.io",
            "v1",
            "Event",
            "events",
            true,
            &["ev"],
            false,
            false,
        ),
        builtin(
            "apps",
            "v1",
            "ReplicaSet",
            "replicasets",
            true,
            &["rs"],
            true,
            true,
        ),
        builtin(
            "apps",
            "v1",
            "DaemonSet",
            "daemonsets",
            true,
            &["ds"],
            true,
            true,
        ),
        builtin(
            "apps",
            "v1",
            "Deployment",
            "deployments",
            true,
            &["deploy"],
            true,
            true,
        ),
        builtin(
            "admissionregistration.k8s.io",
            "v1",
            "ValidatingAdmissionPolicy",
            "validatingadmissionpolicies",
            false,
            &[],
            true,
            true,
        ),
        builtin(
            "admissionregistration.k8s.io",
            "v1",
            "ValidatingAdmissionPolicyBinding",
            "validatingadmissionpolicybindings",
            false,
            &[],
            false,
            true,
        ),
        builtin(
            "admissionregistration.k8s.io",
            "v1",
            "ValidatingWebhookConfiguration",
            "validatingwebhookconfigurations",
            false,
            &[],
            false,
            true,
        ),
        builtin(
            "admissionregistration.k8s.io",
            "v1",
            "MutatingWebhookConfiguration",
            "mutatingwebhookconfigurations",
            false,
            &[],
            false,
            true,
        ),
        builtin(
            "apiextensions.k8s.io",
            "v1",
            "CustomResourceDefinition",
            "customresourcedefinitions",
            false,
            &["crd", "crds"],
            true,
            true,
        ),
        builtin(
            "scheduling.k8s.io",
            "v1",
            "PriorityClass",
            "priorityclasses",
            false,
            &["pc"],
            false,
            false,
        ),
        // A spec but no generation: the strategy sets none, as those of nodes, volumes,
        // claims, attachments and leases do not either.
        builtin("", "v1", "Service", "services", true, &["svc"], true, false),
        plain("", "Secret", "secrets", true, &[]),
        plain("", "Endpoints", "endpoints", true, &["ep"]),
        workload("apps", "StatefulSet", "statefulsets", &["sts"]),
        plain(
            "apps",
            "ControllerRevision",
            "controllerrevisions",
            true,
            &[],
        ),
        workload("batch", "Job", "jobs", &[]),
        workload("batch", "CronJob", "cronjobs", &["cj"]),
        plain("rbac.authorization.k8s.io", "Role", "roles", true, &[]),
        plain(
            "rbac.authorization.k8s.io",
            "RoleBinding",
            "rolebindings",
            true,
            &[],
        ),
        plain(
            "rbac.authorization.k8s.io",
            "ClusterRole",
            "clusterroles",
            false,
            &[],
        ),
        plain(
            "rbac.authorization.k8s.io",
            "ClusterRoleBinding",
            "clusterrolebindings",
            false,
            &[],
        ),
        plain(
            "authentication.k8s.io",
            "TokenReview",
            "tokenreviews",
            false,
            &[],
        ),
        plain(
            "authentication.k8s.io",
            "SelfSubjectReview",
            "selfsubjectreviews",
            false,
            &[],
        ),
        plain(
            "authorization.k8s.io",
            "SelfSubjectAccessReview",
            "selfsubjectaccessreviews",
            false,
            &[],
        ),
        plain(
            "authorization.k8s.io",
            "SubjectAccessReview",
            "subjectaccessreviews",
            false,
            &[],
        ),
        plain(
            "authorization.k8s.io",
            "LocalSubjectAccessReview",
            "localsubjectaccessreviews",
            true,
            &[],
        ),
        builtin(
            "apiregistration.k8s.io",
            "v1",
            "APIService",
            "apiservices",
            false,
            &[],
            true,
            true,
        ),
    ];
    // `kubectl get all` lists the kinds in the "all" category.
    for kind in &mut all {
        if matches!(
            kind.plural.as_str(),
            "pods"
                | "services"
                | "replicasets"
                | "daemonsets"
                | "deployments"
                | "statefulsets"
                | "jobs"
                | "cronjobs"
        ) {
            kind.categories = vec!["all".to_owned()];
        }
        if matches!(
            kind.plural.as_str(),
            "replicasets" | "deployments" | "statefulsets"
        ) && kind.group == "apps"
        {
            kind.scale = Some(ScalePaths {
                spec_replicas: ".spec.replicas".to_owned(),
                status_replicas: ".status.replicas".to_owned(),
                label_selector: None,
            });
        }
    }
    all
}

/// The EvictionRequest API of Kubernetes 1.37 (alpha): served only when the API server is
/// started with its feature gate and runtime config (see `SimOptions::eviction_request_api`).
pub fn eviction_request_api() -> Vec<ResourceType> {
    [
        ("EvictionRequest", "evictionrequests"),
        ("Eviction", "evictions"),
    ]
    .into_iter()
    .map(|(kind, plural)| {
        builtin(
            "lifecycle.k8s.io",
            "v1alpha1",
            kind,
            plural,
            true,
            &[],
            true,
            true,
        )
    })
    .collect()
}

/// The live set of served resources. CRDs add and remove entries.
#[derive(Debug, Clone)]
pub struct Registry {
    types: Arc<RwLock<Vec<Arc<ResourceType>>>>,
}

impl Default for Registry {
    fn default() -> Self {
        Self {
            types: Arc::new(RwLock::new(builtins().into_iter().map(Arc::new).collect())),
        }
    }
}

impl Registry {
    pub fn find(&self, group: &str, version: &str, plural: &str) -> Option<Arc<ResourceType>> {
        self.read()
            .iter()
            .find(|t| t.group == group && t.version == version && t.plural == plural)
            .cloned()
    }

    /// Any version of `group/plural` (for store-level operations that are version-blind).
    pub fn find_any_version(&self, group: &str, plural: &str) -> Option<Arc<ResourceType>> {
        self.read()
            .iter()
            .find(|t| t.group == group && t.plural == plural)
            .cloned()
    }

    pub fn all(&self) -> Vec<Arc<ResourceType>> {
        self.read().clone()
    }

    /// Serves built-in `types` beyond the default set (an API group a flag turns on).
    pub fn serve(&self, types: Vec<ResourceType>) {
        let mut all = self
            .types
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for new in types {
            if !all.iter().any(|t| **t == new) {
                all.push(Arc::new(new));
            }
        }
    }

    /// Serves the versions a CRD declares as `served`.
    pub fn add_crd(&self, crd: &Value) {
        let types = crd_types(crd);
        let mut all = self
            .types
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for new in types {
            all.retain(|t| {
                !(t.group == new.group && t.version == new.version && t.plural == new.plural)
            });
            all.push(Arc::new(new));
        }
    }

    pub fn remove_crd(&self, crd: &Value) {
        let gone = crd_types(crd);
        let mut all = self
            .types
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        all.retain(|t| {
            !gone
                .iter()
                .any(|g| g.group == t.group && g.plural == t.plural)
        });
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Vec<Arc<ResourceType>>> {
        self.types
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

fn crd_types(crd: &Value) -> Vec<ResourceType> {
    let spec = &crd["spec"];
    let names = &spec["names"];
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    let short_names: Vec<String> = names["shortNames"]
        .as_array()
        .map(|a| a.iter().map(text).collect())
        .unwrap_or_default();
    let categories: Vec<String> = names["categories"]
        .as_array()
        .map(|a| a.iter().map(text).collect())
        .unwrap_or_default();
    spec["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|version| version["served"].as_bool().unwrap_or(false))
        .map(|version| ResourceType {
            group: text(&spec["group"]),
            version: text(&version["name"]),
            kind: text(&names["kind"]),
            plural: text(&names["plural"]),
            singular: names["singular"]
                .as_str()
                .map_or_else(|| text(&names["kind"]).to_lowercase(), str::to_owned),
            namespaced: spec["scope"].as_str() == Some("Namespaced"),
            short_names: short_names.clone(),
            has_status: version["subresources"]["status"].is_object(),
            has_generation: true,
            categories: categories.clone(),
            custom: true,
            scale: version["subresources"]["scale"]
                .as_object()
                .map(|scale| ScalePaths {
                    spec_replicas: text(&scale["specReplicasPath"]),
                    status_replicas: text(&scale["statusReplicasPath"]),
                    label_selector: scale
                        .get("labelSelectorPath")
                        .and_then(Value::as_str)
                        .map(str::to_owned),
                }),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn builtins_are_found_by_group_version_plural() {
        let registry = Registry::default();
        let leases = registry
            .find("coordination.k8s.io", "v1", "leases")
            .unwrap();
        assert!(leases.namespaced);
        assert_eq!(leases.api_version(), "coordination.k8s.io/v1");
        assert_eq!(
            registry.find("", "v1", "nodes").unwrap().api_version(),
            "v1"
        );
        assert!(registry.find("", "v2", "nodes").is_none());
    }

    #[test]
    fn crds_add_and_remove_served_versions() {
        let registry = Registry::default();
        let crd = json!({
            "spec": {
                "group": "nodegrace.io",
                "scope": "Cluster",
                "names": {"kind": "NodeDisruptionBudget", "plural": "nodedisruptionbudgets", "shortNames": ["ndb"]},
                "versions": [
                    {"name": "v1alpha1", "served": true, "storage": true, "subresources": {"status": {}}},
                    {"name": "v0", "served": false, "storage": false}
                ]
            }
        });
        registry.add_crd(&crd);
        let ndb = registry
            .find("nodegrace.io", "v1alpha1", "nodedisruptionbudgets")
            .unwrap();
        assert!(!ndb.namespaced && ndb.has_status);
        assert_eq!(ndb.short_names, vec!["ndb"]);
        assert!(
            registry
                .find("nodegrace.io", "v0", "nodedisruptionbudgets")
                .is_none()
        );
        registry.remove_crd(&crd);
        assert!(
            registry
                .find("nodegrace.io", "v1alpha1", "nodedisruptionbudgets")
                .is_none()
        );
    }
}
