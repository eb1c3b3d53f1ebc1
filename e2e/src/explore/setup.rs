//! A run's cluster before its schedule: the programs' identities (a ServiceAccount each, bound
//! to cluster-admin: the explorer judges behaviour, the e2e least-privilege proof judges RBAC),
//! the NodeDisruptionBudget CRD, the webhook configurations, node labels, and the workloads.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Node, ServiceAccount};
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use kube_sim::cluster::{Workload, daemonset, deployment, statefulset};
use serde_json::json;

use super::schedule::{NODES, node};
use crate::manifests::{create, ensure_namespace, parse_documents};

pub const NAMESPACE: &str = "nodegrace";
pub const APPS: &str = "apps";
pub const WEBHOOK_CONFIGURATION: &str = "nodegrace-termination";
pub const WEBHOOK_SECRET: &str = "termination-controller-webhook";
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// The zone of node `index`: the first three in `a`, the rest in `b`.
pub fn zone(index: usize) -> &'static str {
    if index < 3 { "a" } else { "b" }
}

/// Creates the namespace and each program's ServiceAccount, and returns a token for each.
pub async fn identities(client: &Client, programs: &[&str]) -> Result<Vec<String>> {
    ensure_namespace(client, NAMESPACE).await?;
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), NAMESPACE);
    let mut tokens = Vec::new();
    for program in programs {
        create(
            client,
            &json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": program}}),
            NAMESPACE,
        )
        .await?;
        create(
            client,
            &json!({
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": format!("explore-{program}")},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
                "subjects": [{"kind": "ServiceAccount", "name": program, "namespace": NAMESPACE}],
            }),
            NAMESPACE,
        )
        .await?;
        tokens.push(token(&accounts, program).await?);
    }
    Ok(tokens)
}

/// A day's token of the ServiceAccount `account`.
pub async fn token(accounts: &Api<ServiceAccount>, account: &str) -> Result<String> {
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(24 * 3600),
            ..TokenRequestSpec::default()
        }),
        ..TokenRequest::default()
    };
    let issued = accounts
        .create_token_request(account, &PostParams::default(), &request)
        .await
        .with_context(|| format!("a token for {account}"))?;
    issued
        .status
        .and_then(|status| status.token)
        .context("the TokenRequest came back without a token")
}

/// The NodeDisruptionBudget CRD from the chart, served once created.
pub async fn crd(client: &Client, charts_dir: &Path) -> Result<()> {
    let dir = charts_dir.join("termination-controller/crds");
    for entry in std::fs::read_dir(&dir).with_context(|| format!("read {}", dir.display()))? {
        let text = std::fs::read_to_string(entry?.path())?;
        for document in parse_documents(&text)? {
            create(client, &document, NAMESPACE).await?;
        }
    }
    Ok(())
}

/// The DELETE and CREATE webhooks of the chart, reached at `address` (the webhook proxy).
pub async fn webhooks(client: &Client, address: std::net::SocketAddr) -> Result<()> {
    let hook = |name: &str, path: &str, operation: &str, side_effects: &str| {
        json!({
            "name": name,
            "clientConfig": {"url": format!("https://{address}{path}")},
            "rules": [{"operations": [operation], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["nodes"], "scope": "Cluster"}],
            "failurePolicy": "Ignore",
            "sideEffects": side_effects,
            "timeoutSeconds": 5,
            "admissionReviewVersions": ["v1"],
        })
    };
    create(
        client,
        &json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": WEBHOOK_CONFIGURATION},
            "webhooks": [hook("validate-node.nodegrace.io", "/validate-node", "DELETE", "NoneOnDryRun")],
        }),
        NAMESPACE,
    )
    .await?;
    create(
        client,
        &json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": WEBHOOK_CONFIGURATION},
            "webhooks": [hook("mutate-node.nodegrace.io", "/mutate-node", "CREATE", "None")],
        }),
        NAMESPACE,
    )
    .await?;
    Ok(())
}

/// The workloads every run starts with: Deployments under PodDisruptionBudgets, StatefulSets
/// with a volume each, and a DaemonSet. Schedules change the budgets and add pods on top.
fn apps() -> Vec<Workload> {
    let evicted_after_3s = json!({"spec": {"tolerations": [
        {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 3},
        {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 3},
    ]}});
    // out-of-service-gc must never touch `keeper` or its volume's attachment.
    let out_of_service_for_good = json!({"spec": {"tolerations": [
        {"key": "node.kubernetes.io/out-of-service", "operator": "Exists", "effect": "NoExecute"},
    ]}});
    [
        deployment("web", 6)
            .image("registry.example/web:1")
            .budget(json!({"maxUnavailable": 1})),
        deployment("api", 3)
            .image("registry.example/api:1")
            .budget(json!({"minAvailable": 2})),
        statefulset("db", 2)
            .image("registry.example/db:1")
            .pod(&evicted_after_3s)
            .claim("data", "1Gi")
            .budget(json!({"maxUnavailable": 1})),
        statefulset("keeper", 1)
            .image("registry.example/keeper:1")
            .pod(&out_of_service_for_good)
            .claim("data", "1Gi"),
        daemonset("agent").image("registry.example/agent:1"),
    ]
    .into_iter()
    .map(|app| app.namespace(APPS))
    .collect()
}

/// The NodeDisruptionBudgets: the pool one node at a time, and zone a keeping two.
fn initial_node_budgets() -> [serde_json::Value; 2] {
    let budget = |name: &str, spec: serde_json::Value| {
        json!({"apiVersion": "nodegrace.io/v1alpha1", "kind": "NodeDisruptionBudget",
            "metadata": {"name": name}, "spec": spec})
    };
    [
        budget(
            "workers",
            json!({"selector": {"matchLabels": {"pool": "workers"}}, "maxUnavailable": 1}),
        ),
        budget(
            "zone-a",
            json!({"selector": {"matchLabels": {"zone": "a"}}, "minAvailable": 2}),
        ),
    ]
}

/// Labels the nodes (pool, zone) and creates the workloads and budgets; waits until every
/// workload is ready.
pub async fn workloads(client: &Client, eviction_requests: bool) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    for index in 0..NODES {
        nodes
            .patch(
                &node(index),
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"metadata": {"labels": {"pool": "workers", "zone": zone(index)}}}),
                ),
            )
            .await?;
    }
    let namespace = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": APPS}});
    create(client, &namespace, APPS).await?;
    let apps: Vec<Workload> = apps()
        .into_iter()
        .map(|app| {
            if eviction_requests {
                super::responders::named_on(app)
            } else {
                app
            }
        })
        .collect();
    for app in &apps {
        app.create(client).await?;
    }
    for budget in initial_node_budgets() {
        create(client, &budget, APPS).await?;
    }
    let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
    for app in &apps {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        app.wait_ready(client, left).await?;
    }
    Ok(())
}

/// The NodeDisruptionBudget resource, for dynamic clients (the explorer has no typed one).
pub fn node_budget_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("nodegrace.io", "v1alpha1", "NodeDisruptionBudget"),
        "nodedisruptionbudgets",
    )
}

pub fn node_budgets(client: &Client) -> Api<DynamicObject> {
    Api::all_with(client.clone(), &node_budget_resource())
}

/// A kubeconfig that reaches `server` with `token`.
pub fn write_kubeconfig(path: &Path, server: &str, token: &str) -> Result<()> {
    let config = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "sim", "cluster": {"server": server}}],
        "users": [{"name": "program", "user": {"token": token}}],
        "contexts": [{"name": "sim", "context": {"cluster": "sim", "user": "program"}}],
        "current-context": "sim",
    });
    std::fs::write(path, serde_json::to_vec_pretty(&config)?)?;
    Ok(())
}
