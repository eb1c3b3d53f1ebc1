//! The admission webhook through kube-sim's admission path, which calls it over HTTPS trusting
//! the caBundle the controller issued and published: deny mode refuses a `kubectl delete
//! node` the NodeDisruptionBudget does not allow, queue mode admits it and the controller
//! waits, five nodes deleted at once go one at a time in both modes, a created Node gets the
//! finalizer, and the serving certificate rotates without a failed review.

use std::collections::BTreeSet;
use std::process::Command;
use std::sync::{Arc, Mutex};

use crate::common::*;
use anyhow::{Context, Result, ensure};
use futures::StreamExt;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{Node, Secret};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use kube_sim::KubeSim;
use nodegrace_testing::ProgramUnderTest;
use serde_json::json;
use termination_controller::api::{FINALIZER, NodeDisruptionBudget};

const CONFIGURATION: &str = "termination-controller";

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// The webhook configurations a chart would install, pointing at `port` with an empty
/// caBundle for the controller to fill.
async fn configurations(client: &Client, port: u16) -> Result<()> {
    for (kind, path, operation) in [
        ("ValidatingWebhookConfiguration", "validate-node", "DELETE"),
        ("MutatingWebhookConfiguration", "mutate-node", "CREATE"),
    ] {
        let body = json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": kind,
            "metadata": {"name": CONFIGURATION},
            "webhooks": [{
                "name": format!("{path}.nodegrace.io"),
                "clientConfig": {"url": format!("https://127.0.0.1:{port}/{path}")},
                "rules": [{"operations": [operation], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["nodes"]}],
                "failurePolicy": "Fail",
                "sideEffects": "NoneOnDryRun",
                "admissionReviewVersions": ["v1"],
                "timeoutSeconds": 5,
            }],
        });
        let plural = format!("{}s", kind.to_lowercase());
        let resource = kube::core::ApiResource::from_gvk_with_plural(
            &kube::core::GroupVersionKind::gvk("admissionregistration.k8s.io", "v1", kind),
            &plural,
        );
        let api: Api<kube::core::DynamicObject> = Api::all_with(client.clone(), &resource);
        api.create(&PostParams::default(), &serde_json::from_value(body)?)
            .await?;
    }
    Ok(())
}

/// A cluster of `nodes` under the NodeDisruptionBudget `workers` (maxUnavailable 1 over every
/// node), with the controller serving the webhook in `mode`.
async fn with_webhook(
    nodes: usize,
    mode: &str,
    extra: &[&str],
) -> Result<(KubeSim, ProgramUnderTest)> {
    let port = free_port()?;
    with_webhook_on(port, nodes, mode, extra).await
}

async fn with_webhook_on(
    port: u16,
    nodes: usize,
    mode: &str,
    extra: &[&str],
) -> Result<(KubeSim, ProgramUnderTest)> {
    let sim = sim(nodes).await?;
    let client = sim.client();
    configurations(&client, port).await?;
    workers_budget(&client).await?;
    let mut flags = vec![
        format!("--webhook-listen=127.0.0.1:{port}"),
        format!("--webhook-mode={mode}"),
        "--webhook-secret=termination-controller-webhook".to_owned(),
        "--webhook-secret-namespace=default".to_owned(),
        "--webhook-issue-certificates=true".to_owned(),
        "--webhook-dns-names=127.0.0.1".to_owned(),
        format!("--webhook-configurations={CONFIGURATION}"),
    ];
    flags.extend(extra.iter().map(|flag| (*flag).to_owned()));
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let controller = controller(&sim, &flags).await?;
    finalizer_on_every_node(&client, nodes).await?;
    Ok((sim, controller))
}

/// The most nodes cordoned and not yet gone at once, and the most grants the budget held at
/// once, over the test.
#[derive(Debug, Default)]
struct Overlap {
    disrupting: BTreeSet<String>,
    most_disrupting: usize,
    most_grants: usize,
}

fn watch_overlap(client: &Client) -> Arc<Mutex<Overlap>> {
    let overlap = Arc::new(Mutex::new(Overlap::default()));
    let nodes: Api<Node> = Api::all(client.clone());
    let seen = Arc::clone(&overlap);
    tokio::spawn(async move {
        let mut events =
            std::pin::pin!(watcher(nodes, watcher::Config::default()).default_backoff());
        while let Some(Ok(event)) = events.next().await {
            let mut seen = seen.lock().expect("overlap");
            match event {
                watcher::Event::Apply(node) | watcher::Event::InitApply(node)
                    if node.spec.as_ref().and_then(|spec| spec.unschedulable) == Some(true) =>
                {
                    seen.disrupting
                        .insert(node.metadata.name.unwrap_or_default());
                }
                watcher::Event::Delete(node) => {
                    seen.disrupting
                        .remove(&node.metadata.name.unwrap_or_default());
                }
                _ => {}
            }
            seen.most_disrupting = seen.most_disrupting.max(seen.disrupting.len());
        }
    });
    let budgets: Api<NodeDisruptionBudget> = Api::all(client.clone());
    let seen = Arc::clone(&overlap);
    tokio::spawn(async move {
        let mut events = std::pin::pin!(
            watcher(budgets, watcher::Config::default())
                .default_backoff()
                .applied_objects()
        );
        while let Some(Ok(budget)) = events.next().await {
            let grants = budget
                .status
                .map_or(0, |status| status.disrupted_nodes.len());
            let mut seen = seen.lock().expect("overlap");
            seen.most_grants = seen.most_grants.max(grants);
        }
    });
    overlap
}

fn kubectl(sim: &KubeSim, args: &[&str]) -> Result<std::process::Output> {
    Command::new("kubectl")
        .arg(format!("--kubeconfig={}", sim.kubeconfig_path().display()))
        .args(args)
        .output()
        .context("run kubectl")
}

/// Deletes every node at once; returns the names whose DELETE was admitted and the errors of
/// the others.
async fn delete_all_at_once(client: &Client, names: &[String]) -> (Vec<String>, Vec<String>) {
    let deletes = names.iter().map(|name| {
        let nodes: Api<Node> = Api::all(client.clone());
        let name = name.clone();
        async move {
            let result = nodes.delete(&name, &DeleteParams::default()).await;
            (name, result)
        }
    });
    let mut admitted = Vec::new();
    let mut refused = Vec::new();
    for (name, result) in futures::future::join_all(deletes).await {
        match result {
            Ok(_) => admitted.push(name),
            Err(error) => refused.push(format!("{name}: {error}")),
        }
    }
    (admitted, refused)
}

async fn remaining(client: &Client) -> Result<Vec<String>> {
    let nodes: Api<Node> = Api::all(client.clone());
    Ok(nodes
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|node| node.metadata.name)
        .filter(|name| name.starts_with("node-"))
        .collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deny_mode_refuses_deletions_the_budget_does_not_allow() -> Result<()> {
    let (sim, controller) = with_webhook(5, "deny", &[]).await?;
    let client = sim.client();
    let overlap = watch_overlap(&client);

    // A created node is born with the finalizer.
    let nodes: Api<Node> = Api::all(client.clone());
    let created = nodes
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"metadata": {"name": "extra", "labels": {"team": "a"}}}),
            )?,
        )
        .await?;
    ensure!(
        created.metadata.finalizers == Some(vec![FINALIZER.to_owned()]),
        "{:?}",
        created.metadata.finalizers
    );
    // (It has no machine behind it and no hostname label: it stays, outside the budget.)

    // Five at once: one is admitted, four are refused with the budget's numbers.
    let names = remaining(&client).await?;
    ensure!(names.len() == 5, "{names:?}");
    let (admitted, refused) = delete_all_at_once(&client, &names).await;
    ensure!(
        admitted.len() == 1,
        "admitted {admitted:?}, refused {refused:?}"
    );
    for error in &refused {
        ensure!(
            error.contains("denied the request: deleting node")
                && error.contains("would exceed NodeDisruptionBudget workers"),
            "{error}"
        );
    }
    // kubectl (a real client) sees the refusal while the first node is still going; a server
    // dry run is refused the same way and takes nothing.
    let first = &admitted[0];
    let other = names
        .iter()
        .find(|name| *name != first)
        .context("a second node")?;
    let output = kubectl(&sim, &["delete", "node", other, "--dry-run=server"])?;
    let refused_text = String::from_utf8_lossy(&output.stderr).into_owned();
    if !node_gone(&client, first).await? {
        ensure!(
            !output.status.success(),
            "a dry run is judged too: {refused_text}"
        );
        ensure!(
            refused_text.contains("Error from server (Forbidden)")
                && refused_text.contains("of 5 selected nodes available, 4 must stay available"),
            "{refused_text}"
        );
    }

    // As an operator's script would, delete what is left until every node is gone.
    wait_for("every node deleted, one at a time", || {
        let client = client.clone();
        async move {
            let left = remaining(&client).await?;
            let deleting = Api::<Node>::all(client.clone())
                .list(&ListParams::default())
                .await?
                .items
                .iter()
                .any(|node| node.metadata.deletion_timestamp.is_some());
            // (Deleting the rest at once whenever none is going, until none is left.)
            if !deleting && !left.is_empty() {
                let (admitted, _) = delete_all_at_once(&client, &left).await;
                ensure!(admitted.len() <= 1, "two admitted at once: {admitted:?}");
            }
            Ok(left.is_empty())
        }
    })
    .await?;
    let (most_disrupting, most_grants) = {
        let overlap = overlap.lock().expect("overlap");
        (overlap.most_disrupting, overlap.most_grants)
    };
    ensure!(
        (most_disrupting, most_grants) == (1, 1),
        "at most one node disrupted and one grant at once: {most_disrupting}, {most_grants}"
    );
    let denied = controller
        .admin()
        .metric("webhook_reviews_total{operation=\"DELETE\",verdict=\"denied\"}")
        .await?
        .unwrap_or_default();
    ensure!(denied >= 4.0, "denied reviews counted: {denied}");
    controller.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_mode_admits_and_the_controller_drains_one_node_at_a_time() -> Result<()> {
    // Six nodes: the web pods need somewhere to go when five are deleted.
    let (sim, controller) = with_webhook(6, "queue", &[]).await?;
    let client = sim.client();
    let overlap = watch_overlap(&client);
    web(6).create(&client).await?;
    wait_ready(&client, "web", 6).await?;

    // node-0 takes the grant and is held by a do-not-evict pod, so the others must wait.
    create(
        &client,
        json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "batch", "namespace": "default",
                     "annotations": {"nodegrace.io/do-not-evict": "true"}},
        "spec": {"nodeName": "node-0", "containers": [{"name": "c", "image": "app"}]}}),
    )
    .await?;
    let output = kubectl(&sim, &["delete", "node", "node-0", "--wait=false"])?;
    ensure!(output.status.success(), "{output:?}");
    let names: Vec<String> = (1..4).map(|index| format!("node-{index}")).collect();
    let (admitted, refused) = delete_all_at_once(&client, &names).await;
    ensure!(
        refused.is_empty() && admitted.len() == 3,
        "queue mode admits: {refused:?}"
    );
    // kubectl, a real client, prints the webhook's warning.
    let output = kubectl(&sim, &["delete", "node", "node-4", "--wait=false"])?;
    let warned = String::from_utf8_lossy(&output.stderr).into_owned();
    ensure!(output.status.success(), "{warned}");
    ensure!(
        warned.contains("Warning: node node-4 waits for NodeDisruptionBudget workers: 5 of 6 selected nodes available, 5 must stay available"),
        "{warned}"
    );
    // The controller holds them: none but node-0 is cordoned while it is there.
    wait_for("node-4 to say it waits for the budget", || {
        let client = client.clone();
        async move {
            Ok(condition(&client, "node-4", "Terminating")
                .await?
                .is_some_and(|(reason, _)| reason == "AwaitingBudget"))
        }
    })
    .await?;
    Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client.clone(), "default")
        .delete("batch", &DeleteParams::default())
        .await?;
    wait_for("the five deleted nodes gone", || {
        let client = client.clone();
        async move { Ok(remaining(&client).await? == ["node-5"]) }
    })
    .await?;
    let (most_disrupting, most_grants) = {
        let overlap = overlap.lock().expect("overlap");
        (overlap.most_disrupting, overlap.most_grants)
    };
    ensure!(
        (most_disrupting, most_grants) == (1, 1),
        "at most one node disrupted and one grant at once: {most_disrupting}, {most_grants}"
    );
    ensure!(
        sim.world().audit().violations().is_empty(),
        "{:?}",
        sim.world().audit().violations()
    );
    controller.stop().await
}

/// With a 10 s certificate, the next one is issued at 6.7 s and served 1.5 s later; reviews
/// sent all along never fail, and the old CA leaves the bundle once it expires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_serving_certificate_rotates_without_a_failed_review() -> Result<()> {
    let (sim, controller) = with_webhook(2, "deny", &["--webhook-cert-validity=10s"]).await?;
    let client = sim.client();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "default");
    let serving = |secret: &Secret| {
        secret
            .data
            .as_ref()
            .and_then(|data| data.get("tls.crt"))
            .map(|bytes| bytes.0.clone())
    };
    let first = serving(&secrets.get("termination-controller-webhook").await?);
    let configurations: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let bundle = |configuration: &ValidatingWebhookConfiguration| -> usize {
        configuration
            .webhooks
            .iter()
            .flatten()
            .filter_map(|webhook| webhook.client_config.ca_bundle.as_ref())
            .map(|bundle| {
                String::from_utf8_lossy(&bundle.0)
                    .matches("BEGIN CERTIFICATE")
                    .count()
            })
            .max()
            .unwrap_or(0)
    };
    ensure!(bundle(&configurations.get(CONFIGURATION).await?) == 1);
    let nodes: Api<Node> = Api::all(client.clone());
    let mut reviews = 0;
    let mut saw_two_cas = false;
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    // Reviews at a steady pace (load, not a wait: the loop ends on what it sees).
    let mut pace = tokio::time::interval(std::time::Duration::from_millis(20));
    loop {
        pace.tick().await;
        // A server dry run of a node DELETE is reviewed (and granted, taking nothing).
        nodes
            .delete(
                "node-0",
                &DeleteParams {
                    dry_run: true,
                    ..DeleteParams::default()
                },
            )
            .await
            .with_context(|| format!("review {reviews} failed"))?;
        reviews += 1;
        let cas = bundle(&configurations.get(CONFIGURATION).await?);
        saw_two_cas |= cas == 2;
        let now_serving = serving(&secrets.get("termination-controller-webhook").await?);
        if now_serving != first && saw_two_cas && cas == 1 {
            break;
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "no full rotation in 30 s after {reviews} reviews"
        );
    }
    ensure!(reviews > 10, "{reviews}");
    controller.stop().await
}

/// What a caller other than the API server may send: each gets a clear answer, never a hang
/// or a dropped connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_clear_answers() -> Result<()> {
    use http_body_util::{BodyExt, Full};
    let port = free_port()?;
    let (sim, controller) = with_webhook_on(port, 1, "deny", &[]).await?;
    let ca = webhook_ca(&sim.client(), "default", "termination-controller-webhook").await?;
    // A body declared too large is refused after the headers, before it is read (a client
    // still sending would see the connection close, so this one sends only the headers).
    {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut tls = tls_connect(port, &ca).await?;
        tls.write_all(
            format!(
                "POST /validate-node HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\
                 Content-Type: application/json\r\nContent-Length: 4194304\r\n\r\n"
            )
            .as_bytes(),
        )
        .await?;
        let mut answer = Vec::new();
        tls.read_to_end(&mut answer).await.ok();
        let answer = String::from_utf8_lossy(&answer);
        ensure!(
            answer.starts_with("HTTP/1.1 413") && answer.contains("larger than 3145728 bytes"),
            "{answer}"
        );
    }
    let cases: [(&str, &str, Vec<u8>, u16, &str); 4] = [
        (
            "POST",
            "/validate-node",
            b"{\"apiVersion\":".to_vec(),
            400,
            "not a v1 AdmissionReview",
        ),
        (
            "POST",
            "/mutate-node",
            br#"{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview"}"#.to_vec(),
            400,
            "admissionReviewVersions: [v1]",
        ),
        (
            "GET",
            "/validate-node",
            Vec::new(),
            405,
            "POST an AdmissionReview",
        ),
        (
            "POST",
            "/other",
            Vec::new(),
            404,
            "reviews go to /mutate-node or /validate-node",
        ),
    ];
    for (method, path, body, code, expected) in cases {
        let mut sender = https_connect(port, &ca).await?;
        let request = http::Request::builder()
            .method(method)
            .uri(path)
            .header(http::header::HOST, format!("127.0.0.1:{port}"))
            .body(Full::new(bytes::Bytes::from(body)))?;
        let response = sender.send_request(request).await?;
        let status = response.status().as_u16();
        let text = String::from_utf8(response.into_body().collect().await?.to_bytes().to_vec())?;
        ensure!(
            status == code && text.contains(expected),
            "{method} {path}: {status} {text}"
        );
    }
    controller.stop().await
}
