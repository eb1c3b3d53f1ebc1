//! A run's cluster before its schedule: the programs' identities (a ServiceAccount each, bound
//! to cluster-admin: the explorer judges behaviour, the e2e least-privilege proof judges RBAC),
//! the NodeDisruptionBudget CRD, the webhook configurations, node labels, and the workloads.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Node, Pod, ServiceAccount};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

use super::schedule::{NODES, node};
use crate::manifests::{create, parse_documents};
use crate::stage::pod_ready;
use crate::wait::poll_until;

pub const NAMESPACE: &str = "nodegrace";
pub const APPS: &str = "apps";
pub const WEBHOOK_CONFIGURATION: &str = "nodegrace-termination";
pub const WEBHOOK_SECRET: &str = "termination-controller-webhook";
const WORKLOADS: &str = include_str!("../../explore/workloads.yaml");
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// The zone of node `index`: the first three in `a`, the rest in `b`.
pub fn zone(index: usize) -> &'static str {
    if index < 3 { "a" } else { "b" }
}

/// Creates the namespace and each program's ServiceAccount, and returns a token for each.
pub async fn identities(client: &Client, programs: &[&str]) -> Result<Vec<String>> {
    create(
        client,
        &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}),
        NAMESPACE,
    )
    .await?;
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
        let request = TokenRequest {
            spec: TokenRequestSpec {
                audiences: Vec::new(),
                expiration_seconds: Some(24 * 3600),
                ..TokenRequestSpec::default()
            },
            ..TokenRequest::default()
        };
        let issued = accounts
            .create_token_request(program, &PostParams::default(), &request)
            .await
            .with_context(|| format!("a token for {program}"))?;
        tokens.push(
            issued
                .status
                .map(|status| status.token)
                .context("the TokenRequest came back without a token")?,
        );
    }
    Ok(tokens)
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

/// Labels the nodes (pool, zone) and creates the workloads and budgets; waits until every
/// workload pod is Ready.
pub async fn workloads(client: &Client) -> Result<()> {
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
    for document in parse_documents(WORKLOADS)? {
        create(client, &document, APPS).await?;
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), APPS);
    // 6 web + 3 api + 2 db + 1 keeper + one agent per node.
    let expected = 12 + NODES;
    let ready = poll_until(READY_TIMEOUT, || async {
        pods.list(&ListParams::default())
            .await
            .is_ok_and(|list| list.items.iter().filter(|pod| pod_ready(pod)).count() >= expected)
    })
    .await;
    if !ready {
        bail!("the workloads' {expected} pods were not Ready within {READY_TIMEOUT:?}");
    }
    Ok(())
}
