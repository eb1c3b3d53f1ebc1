//! What the controller's integration tests share: a kube-sim cluster with the CRD, the
//! controller in-process, workloads under budgets, and what to wait on.
#![allow(dead_code, unused_imports)] // each test binary uses its own part

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use clap::Parser;
use futures::StreamExt;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, CustomResourceExt};
use kube_sim::cluster::{Cluster, Workload, daemonset, deployment};
use kube_sim::{KubeSim, WorldOptions};
use nodegrace_testing::cluster::node_condition;
pub use nodegrace_testing::cluster::{
    event_notes, event_reasons, event_seen, has_attachment, has_event, machine_node, pods_on,
};
pub use nodegrace_testing::wait_for;
use nodegrace_testing::{ProgramUnderTest, command_line};
use serde_json::json;
use termination_controller::api::{FINALIZER, NodeDisruptionBudget, NodeDrainRule};
use termination_controller::app::{self, PROGRAM};
use termination_controller::cli::Args;
use tokio_util::sync::CancellationToken;

const METRICS_PREFIX: &str = "nodegrace_termination_controller";

pub fn world() -> WorldOptions {
    WorldOptions {
        lease_renew_interval: Duration::from_millis(100),
        node_monitor_grace: Duration::from_secs(2),
        detach_delay: Duration::from_millis(200),
        pod_gc_period: Duration::from_secs(3600),
        ..WorldOptions::default()
    }
}

/// `nodes` nodes with this controller's CRDs and the tests' world timings; add workloads with
/// `.with(…)`.
pub fn cluster(nodes: usize) -> Cluster {
    Cluster::new(nodes)
        .world(world())
        .crd(NodeDisruptionBudget::crd())
        .crd(NodeDrainRule::crd())
}

pub async fn sim(nodes: usize) -> Result<KubeSim> {
    Ok(cluster(nodes).start().await?)
}

pub async fn controller(sim: &KubeSim, flags: &[&str]) -> Result<ProgramUnderTest> {
    controller_via(sim.kubeconfig_path(), flags).await
}

/// The controller reaching the API server through `kubeconfig`; without election unless
/// `flags` set `--leader-elect`.
pub async fn controller_via(
    kubeconfig: &std::path::Path,
    flags: &[&str],
) -> Result<ProgramUnderTest> {
    controller_with_clock(
        kubeconfig,
        flags,
        std::sync::Arc::new(nodegrace_core::clock::SystemClock),
    )
    .await
}

/// [`controller_via`] with the wall clock grants and maintenance windows are read off.
pub async fn controller_with_clock(
    kubeconfig: &std::path::Path,
    flags: &[&str],
    clock: std::sync::Arc<dyn nodegrace_core::clock::Clock>,
) -> Result<ProgramUnderTest> {
    let defaults = [
        format!("--kubeconfig={}", kubeconfig.display()),
        "--admin-listen=127.0.0.1:0".to_owned(),
        "--instance-provider=sim".to_owned(),
        "--eviction-backoff-max=1s".to_owned(),
        "--leader-elect=false".to_owned(),
    ];
    let args = Args::try_parse_from(command_line(PROGRAM, &defaults, flags))?;
    ProgramUnderTest::start(METRICS_PREFIX, |stop| {
        app::start_with_clock(args, clock, stop)
    })
    .await
}

pub async fn create(client: &Client, body: serde_json::Value) -> Result<()> {
    let kind = body["kind"].as_str().unwrap_or_default().to_owned();
    let namespace = body["metadata"]["namespace"]
        .as_str()
        .unwrap_or("default")
        .to_owned();
    let (group, version) = match body["apiVersion"]
        .as_str()
        .unwrap_or_default()
        .split_once('/')
    {
        Some((group, version)) => (group.to_owned(), version.to_owned()),
        None => (
            String::new(),
            body["apiVersion"].as_str().unwrap_or_default().to_owned(),
        ),
    };
    let gvk = kube::core::GroupVersionKind::gvk(&group, &version, &kind);
    let resource = kube::core::ApiResource::from_gvk(&gvk);
    let object: kube::core::DynamicObject = serde_json::from_value(body)?;
    let cluster_scoped = matches!(
        kind.as_str(),
        "NodeDisruptionBudget" | "NodeDrainRule" | "Namespace"
    );
    let api: Api<kube::core::DynamicObject> = if cluster_scoped {
        Api::all_with(client.clone(), &resource)
    } else {
        Api::namespaced_with(client.clone(), &namespace, &resource)
    };
    api.create(&PostParams::default(), &object).await?;
    Ok(())
}

/// A Deployment of `replicas` whose pods are Ready 0.3 s after they start and gone 0.1 s after
/// their deletion; `.budget(…)` puts a PodDisruptionBudget over it, `.pod(…)` adds to its pods.
pub fn app(name: &str, replicas: i32) -> Workload {
    deployment(name, replicas).timing(0.3, 0.1)
}

/// The tests' usual service: `web`, under a PodDisruptionBudget of maxUnavailable 1.
pub fn web(replicas: i32) -> Workload {
    app("web", replicas).budget(json!({"maxUnavailable": 1}))
}

pub async fn ready_pods(client: &Client, app: &str) -> Result<usize> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let list = pods
        .list(&ListParams::default().labels(&format!("app={app}")))
        .await?;
    Ok(list
        .items
        .iter()
        .filter(|pod| pod.metadata.deletion_timestamp.is_none())
        .filter(|pod| {
            pod.status
                .iter()
                .flat_map(|status| status.conditions.iter().flatten())
                .any(|condition| condition.type_ == "Ready" && condition.status == "True")
        })
        .count())
}

pub async fn wait_ready(client: &Client, app: &str, count: usize) -> Result<()> {
    wait_for(&format!("{count} {app} pods Ready"), || async move {
        Ok(ready_pods(client, app).await? >= count)
    })
    .await
}

pub async fn has_finalizer(client: &Client, node: &str) -> Result<bool> {
    let nodes: Api<Node> = Api::all(client.clone());
    Ok(nodes.get_opt(node).await?.is_some_and(|node| {
        node.metadata
            .finalizers
            .iter()
            .flatten()
            .any(|f| f == FINALIZER)
    }))
}

pub async fn node_gone(client: &Client, node: &str) -> Result<bool> {
    let nodes: Api<Node> = Api::all(client.clone());
    Ok(nodes.get_opt(node).await?.is_none())
}

pub fn terminate_calls(sim: &KubeSim, node: &str) -> u32 {
    sim.world()
        .cloud()
        .instances()
        .iter()
        .find(|instance| instance.node == node)
        .map_or(0, |instance| instance.terminate_calls)
}

/// What the test saw happen, in order: pods starting to terminate and going, per node.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Seen {
    Leaving(String),
    /// The pod no longer holds a drain: its object is deleted, or it is leaving and finished
    /// (Succeeded/Failed), which the drain counts as done while the kubelet's final delete is
    /// still on its way. Once per pod, at the first of the two.
    Gone(String),
    AttachmentGone(String),
    Cordoned(String),
}

/// What [`record`] saw: the events at the time the test saw them, and for pods leaving and
/// nodes cordoned the store revision of the write (kube-sim's resourceVersions are one global
/// counter), which orders events seen on different watches.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub log: Arc<Mutex<Vec<(Timestamp, Seen)>>>,
    pub revisions: Arc<Mutex<std::collections::HashMap<Seen, u64>>>,
}

fn revision(meta: &kube::api::ObjectMeta) -> u64 {
    meta.resource_version
        .as_deref()
        .and_then(|version| version.parse().ok())
        .unwrap_or(u64::MAX)
}

fn finished(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|status| status.phase.as_deref())
        .is_some_and(|phase| matches!(phase, "Succeeded" | "Failed"))
}

pub fn record(client: &Client) -> Recorded {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let revisions = Arc::new(Mutex::new(std::collections::HashMap::new()));
    let pods: Api<Pod> = Api::all(client.clone());
    let log = Arc::clone(&seen);
    let ordered = Arc::clone(&revisions);
    tokio::spawn(async move {
        let mut leaving = std::collections::HashSet::new();
        let mut gone = std::collections::HashSet::new();
        let mut events =
            std::pin::pin!(watcher(pods, watcher::Config::default()).default_backoff());
        while let Some(event) = events.next().await {
            let Ok(event) = event else { continue };
            let mut log = log.lock().expect("log");
            match event {
                watcher::Event::Apply(pod) | watcher::Event::InitApply(pod) => {
                    let name = pod.metadata.name.clone().unwrap_or_default();
                    if pod.metadata.deletion_timestamp.is_none() {
                        continue;
                    }
                    if leaving.insert(name.clone()) {
                        ordered
                            .lock()
                            .expect("revisions")
                            .insert(Seen::Leaving(name.clone()), revision(&pod.metadata));
                        log.push((Timestamp::now(), Seen::Leaving(name.clone())));
                    }
                    if finished(&pod) && gone.insert(pod.metadata.uid.clone()) {
                        log.push((Timestamp::now(), Seen::Gone(name)));
                    }
                }
                watcher::Event::Delete(pod) if gone.insert(pod.metadata.uid.clone()) => {
                    log.push((
                        Timestamp::now(),
                        Seen::Gone(pod.metadata.name.unwrap_or_default()),
                    ));
                }
                _ => {}
            }
        }
    });
    let attachments: Api<VolumeAttachment> = Api::all(client.clone());
    let log = Arc::clone(&seen);
    let ordered = Arc::clone(&revisions);
    tokio::spawn(async move {
        let mut events =
            std::pin::pin!(watcher(attachments, watcher::Config::default()).default_backoff());
        while let Some(event) = events.next().await {
            if let Ok(watcher::Event::Delete(attachment)) = event {
                let name = attachment.metadata.name.clone().unwrap_or_default();
                ordered
                    .lock()
                    .expect("revisions")
                    .insert(Seen::AttachmentGone(name), revision(&attachment.metadata));
                log.lock().expect("log").push((
                    Timestamp::now(),
                    Seen::AttachmentGone(attachment.metadata.name.unwrap_or_default()),
                ));
            }
        }
    });
    let nodes: Api<Node> = Api::all(client.clone());
    let log = Arc::clone(&seen);
    let ordered = Arc::clone(&revisions);
    tokio::spawn(async move {
        let mut cordoned = std::collections::HashSet::new();
        let mut events =
            std::pin::pin!(watcher(nodes, watcher::Config::default()).default_backoff());
        while let Some(event) = events.next().await {
            if let Ok(watcher::Event::Apply(node)) = event {
                let name = node.metadata.name.clone().unwrap_or_default();
                let unschedulable = node.spec.and_then(|spec| spec.unschedulable) == Some(true);
                if unschedulable && cordoned.insert(name.clone()) {
                    ordered
                        .lock()
                        .expect("revisions")
                        .insert(Seen::Cordoned(name.clone()), revision(&node.metadata));
                    log.lock()
                        .expect("log")
                        .push((Timestamp::now(), Seen::Cordoned(name)));
                }
            }
        }
    });
    Recorded {
        log: seen,
        revisions,
    }
}

/// The store revision of the write that stamped the node's terminate-request annotation.
pub fn terminate_stamp(client: &Client, node: &str) -> Arc<Mutex<Option<u64>>> {
    let stamp = Arc::new(Mutex::new(None));
    let nodes: Api<Node> = Api::all(client.clone());
    let config = watcher::Config::default().fields(&format!("metadata.name={node}"));
    let found = Arc::clone(&stamp);
    tokio::spawn(async move {
        let mut events = std::pin::pin!(watcher(nodes, config).default_backoff());
        while let Some(event) = events.next().await {
            if let Ok(watcher::Event::Apply(node)) = event
                && node
                    .metadata
                    .annotations
                    .as_ref()
                    .is_some_and(|annotations| {
                        annotations
                            .contains_key(termination_controller::termination::TERMINATE_REQUESTED)
                    })
            {
                found
                    .lock()
                    .expect("stamp")
                    .get_or_insert(revision(&node.metadata));
            }
        }
    });
    stamp
}

pub async fn delete_node(client: &Client, node: &str) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    nodes.delete(node, &DeleteParams::default()).await?;
    Ok(())
}

/// The controller, started with `flags`, once its finalizer is on every node.
pub async fn managing(sim: &KubeSim, flags: &[&str]) -> Result<ProgramUnderTest> {
    let started = controller(sim, flags).await?;
    let client = sim.client();
    let nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await?;
    finalizer_on_every_node(&client, nodes.items.len()).await?;
    Ok(started)
}

pub async fn finalizer_on_every_node(client: &Client, count: usize) -> Result<()> {
    for index in 0..count {
        let node = format!("node-{index}");
        wait_for(&format!("the finalizer on {node}"), || {
            let node = node.clone();
            async move { has_finalizer(client, &node).await }
        })
        .await?;
    }
    Ok(())
}

/// The node's condition `type_`, as its reason and message.
pub async fn condition(
    client: &Client,
    node: &str,
    type_: &str,
) -> Result<Option<(String, String)>> {
    Ok(node_condition(client, node, type_)
        .await?
        .map(|seen| (seen.reason, seen.message)))
}

pub async fn ndb(client: &Client, name: &str, spec: serde_json::Value) -> Result<()> {
    create(
        client,
        json!({
            "apiVersion": "nodegrace.io/v1alpha1", "kind": "NodeDisruptionBudget",
            "metadata": {"name": name}, "spec": spec,
        }),
    )
    .await
}

/// A TLS connection to 127.0.0.1:`port`, trusting the PEM CAs in `ca_pem`.
pub async fn tls_connect(
    port: u16,
    ca_pem: &[u8],
) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for certificate in rustls::pki_types::CertificateDer::pem_slice_iter(ca_pem) {
        roots.add(certificate?)?;
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(
            rustls::pki_types::ServerName::try_from("127.0.0.1")?,
            stream,
        )
        .await?)
}

/// An HTTP/1.1 connection over TLS to 127.0.0.1:`port`, trusting the PEM CAs in `ca_pem`.
pub async fn https_connect(
    port: u16,
    ca_pem: &[u8],
) -> Result<hyper::client::conn::http1::SendRequest<http_body_util::Full<bytes::Bytes>>> {
    let tls = tls_connect(port, ca_pem).await?;
    let (sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls)).await?;
    tokio::spawn(connection);
    Ok(sender)
}

/// The webhook's CA bundle, from the Secret it issued.
pub async fn webhook_ca(client: &Client, namespace: &str, secret: &str) -> Result<Vec<u8>> {
    let secret = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), namespace)
        .get(secret)
        .await?;
    Ok(secret
        .data
        .and_then(|mut data| data.remove("ca.crt"))
        .context("ca.crt in the webhook Secret")?
        .0)
}

/// The DaemonSet `logs`: a pod on every node.
pub async fn log_daemonset(client: &Client) -> Result<()> {
    Ok(daemonset("logs").image("logs").create(client).await?)
}

/// The NodeDisruptionBudget `workers`: every node (they all have a hostname label), one at a
/// time.
pub async fn workers_budget(client: &Client) -> Result<()> {
    ndb(
        client,
        "workers",
        json!({"selector": {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "Exists"}]}, "maxUnavailable": 1}),
    )
    .await
}

/// `termination-controller plan --node <node>` run as an operator runs it: the binary and a
/// kubeconfig; JSON with `json_output`.
pub fn plan(sim: &KubeSim, node: &str, json_output: bool) -> Result<String> {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_termination-controller"));
    command
        .arg("plan")
        .arg(format!("--node={node}"))
        .arg(format!("--kubeconfig={}", sim.kubeconfig_path().display()));
    if json_output {
        command.arg("-o").arg("json");
    }
    let output = command
        .output()
        .context("run termination-controller plan")?;
    ensure!(
        output.status.success(),
        "plan failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(String::from_utf8(output.stdout)?)
}

/// Waits for the node's `Terminating` condition to have `reason` and a message containing
/// `contains`.
pub async fn terminating_with(
    client: &Client,
    node: &str,
    reason: &str,
    contains: &str,
) -> Result<()> {
    wait_for(
        &format!("{node}: Terminating {reason}: {contains}"),
        || async {
            Ok(condition(client, node, "Terminating")
                .await?
                .is_some_and(|(seen, message)| seen == reason && message.contains(contains)))
        },
    )
    .await
}

/// Whether the node is marked unschedulable (its cordon began).
pub async fn is_cordoned(client: &Client, node: &str) -> Result<bool> {
    let nodes: Api<Node> = Api::all(client.clone());
    Ok(nodes
        .get_opt(node)
        .await?
        .and_then(|node| node.spec?.unschedulable)
        == Some(true))
}
