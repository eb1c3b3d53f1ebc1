//! What a new API server holds before anyone writes: the `kubernetes` Service
//! (pkg/controlplane/controller/kubernetesservice), the bootstrap cluster-admin role and its
//! binding and the roles every authenticated user has — discovery, public info, access reviews
//! of oneself — (plugin/pkg/auth/authorizer/rbac/bootstrappolicy), and an APIService per built-in
//! group version (the autoregister controller).

use serde_json::json;

use super::Store;
use crate::resources::builtins;

pub fn bootstrap(store: &Store) {
    let services = store.kind("", "services");
    let _ = store.create(
        &services,
        Some("default"),
        json!({
            "metadata": {"name": "kubernetes", "labels": {"component": "apiserver", "provider": "kubernetes"}},
            "spec": {"clusterIP": "10.96.0.1", "ports": [{"name": "https", "port": 443, "protocol": "TCP", "targetPort": 6443}]},
        }),
    );
    let defaults = json!({
        "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"},
        "annotations": {"rbac.authorization.kubernetes.io/autoupdate": "true"},
    });
    let roles = store.kind("rbac.authorization.k8s.io", "clusterroles");
    let _ = store.create(
        &roles,
        None,
        json!({
            "metadata": {"name": "cluster-admin", "labels": defaults["labels"], "annotations": defaults["annotations"]},
            "rules": [
                {"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]},
                {"nonResourceURLs": ["*"], "verbs": ["*"]},
            ],
        }),
    );
    let bindings = store.kind("rbac.authorization.k8s.io", "clusterrolebindings");
    let _ = store.create(
        &bindings,
        None,
        json!({
            "metadata": {"name": "cluster-admin", "labels": defaults["labels"], "annotations": defaults["annotations"]},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:masters"}],
        }),
    );
    for (role, rules, groups) in [
        (
            "system:discovery",
            json!([{"nonResourceURLs": ["/api", "/api/*", "/apis", "/apis/*", "/healthz", "/livez", "/openapi", "/openapi/*", "/readyz", "/version", "/version/"], "verbs": ["get"]}]),
            json!(["system:authenticated"]),
        ),
        (
            "system:public-info-viewer",
            json!([{"nonResourceURLs": ["/healthz", "/livez", "/readyz", "/version", "/version/"], "verbs": ["get"]}]),
            json!(["system:authenticated", "system:unauthenticated"]),
        ),
        (
            "system:basic-user",
            json!([
                {"apiGroups": ["authorization.k8s.io"], "resources": ["selfsubjectaccessreviews", "selfsubjectrulesreviews"], "verbs": ["create"]},
                {"apiGroups": ["authentication.k8s.io"], "resources": ["selfsubjectreviews"], "verbs": ["create"]},
            ]),
            json!(["system:authenticated"]),
        ),
    ] {
        let _ = store.create(
            &roles,
            None,
            json!({
                "metadata": {"name": role, "labels": defaults["labels"], "annotations": defaults["annotations"]},
                "rules": rules,
            }),
        );
        let subjects: Vec<_> = groups
            .as_array()
            .into_iter()
            .flatten()
            .map(|group| json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": group}))
            .collect();
        let _ = store.create(
            &bindings,
            None,
            json!({
                "metadata": {"name": role, "labels": defaults["labels"], "annotations": defaults["annotations"]},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                "subjects": subjects,
            }),
        );
    }
    let api_services = store.kind("apiregistration.k8s.io", "apiservices");
    let mut group_versions: Vec<(String, String)> = builtins()
        .into_iter()
        .map(|kind| (kind.group, kind.version))
        .collect();
    group_versions.sort();
    group_versions.dedup();
    for (group, version) in group_versions {
        let created = store.create(
            &api_services,
            None,
            json!({
                "metadata": {"name": format!("{version}.{group}"), "labels": {"kube-aggregator.kubernetes.io/automanaged": "onstart"}},
                "spec": {"group": group, "version": version, "groupPriorityMinimum": 18000, "versionPriority": 15},
            }),
        );
        // Local groups are served by this server itself: Available at once.
        if let Ok(created) = created {
            let name = created["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            let _ = store.update(&api_services, None, &name, super::Part::Status, |current| {
                let mut available = current.clone();
                available["status"] = json!({"conditions": [{"type": "Available", "status": "True", "reason": "Local", "message": "Local APIServices are always available", "lastTransitionTime": super::timestamps::now_rfc3339()}]});
                Ok(available)
            });
        }
    }
}
