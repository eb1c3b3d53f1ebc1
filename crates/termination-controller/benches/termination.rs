//! `cargo xtask bench termination`: the proofs at full size, with their figures.
//!
//! - fuzz: 200,000 generated bodies through the review decoder (a new seed each run).
//! - chaos: the release binary SIGKILLed at 24 random points during three drains (40 web pods
//!   under a PDB, 5 api pods under another, an NDB of maxUnavailable 1), then the leader of two
//!   replicas killed 6 times.
//! - webhook: 100 clients at once, 20 reviews each over their own HTTPS connection, half node
//!   CREATEs (answered with the finalizer patch) and half server-dry-run node DELETEs under the
//!   NDB (the budget's verdict, computed from the caches); latency percentiles.

// A benchmark is one measured run, top to bottom, as a test is.
#![allow(clippy::too_many_lines)]

#[path = "../tests/proofs/chaos.rs"]
mod chaos;
#[path = "../tests/common/mod.rs"]
mod common;
#[path = "../tests/proofs/fuzz.rs"]
mod fuzz;

use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use serde_json::{Value, json};

const BINARY: &str = env!("CARGO_BIN_EXE_termination-controller");
const CLIENTS: usize = 100;
const REVIEWS_PER_CLIENT: usize = 20;

fn review(uid: usize, create: bool) -> Value {
    let node = json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": if create { format!("new-{uid}") } else { "node-1".to_owned() },
                     "labels": {"kubernetes.io/hostname": "node-1"}},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]}});
    let (object, old) = if create {
        (node, Value::Null)
    } else {
        (Value::Null, node)
    };
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": format!("bench-{uid}"),
        "kind": {"group": "", "version": "v1", "kind": "Node"},
        "resource": {"group": "", "version": "v1", "resource": "nodes"},
        "name": "node-1", "operation": if create { "CREATE" } else { "DELETE" },
        "userInfo": {"username": "bench"}, "object": object, "oldObject": old,
        "dryRun": !create}})
}

/// One client: a TLS connection trusting `ca`, then, once every client is connected,
/// `REVIEWS_PER_CLIENT` reviews one after another (so 100 are in flight at once).
async fn client(
    port: u16,
    ca: Arc<Vec<u8>>,
    index: usize,
    start: Arc<tokio::sync::Barrier>,
) -> Result<Vec<Duration>> {
    let mut sender = common::https_connect(port, &ca).await?;
    start.wait().await;
    let mut latencies = Vec::with_capacity(REVIEWS_PER_CLIENT);
    for round in 0..REVIEWS_PER_CLIENT {
        let uid = index * REVIEWS_PER_CLIENT + round;
        let create = uid.is_multiple_of(2);
        let path = if create {
            "/mutate-node"
        } else {
            "/validate-node"
        };
        let body = serde_json::to_vec(&review(uid, create))?;
        let request = http::Request::post(path)
            .header(http::header::HOST, format!("127.0.0.1:{port}"))
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body)))?;
        let started = Instant::now();
        let response = sender.send_request(request).await?;
        let status = response.status();
        let bytes = response.into_body().collect().await?.to_bytes();
        latencies.push(started.elapsed());
        ensure!(
            status == 200,
            "{status}: {}",
            String::from_utf8_lossy(&bytes)
        );
        let answer: Value = serde_json::from_slice(&bytes)?;
        ensure!(
            answer["response"]["uid"] == format!("bench-{uid}"),
            "{answer}"
        );
        ensure!(answer["response"]["allowed"] == true, "{answer}");
        if create {
            ensure!(answer["response"]["patchType"] == "JSONPatch", "{answer}");
        }
    }
    Ok(latencies)
}

async fn webhook_latency() -> Result<()> {
    let sim = common::sim(3).await?;
    let client = sim.client();
    common::workers_budget(&client).await?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let admin_port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let mut controller = tokio::process::Command::new(BINARY)
        .arg(format!("--kubeconfig={}", sim.kubeconfig_path().display()))
        .arg(format!("--admin-listen=127.0.0.1:{admin_port}"))
        .arg("--leader-elect=false")
        .arg(format!("--webhook-listen=127.0.0.1:{port}"))
        .arg("--webhook-secret=webhook")
        .arg("--webhook-secret-namespace=default")
        .arg("--webhook-issue-certificates=true")
        .arg("--webhook-dns-names=127.0.0.1")
        .arg("--log-level=warn")
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    let admin = nodegrace_testing::Admin {
        address: std::net::SocketAddr::from(([127, 0, 0, 1], admin_port)),
        prefix: "nodegrace_termination_controller",
    };
    common::wait_for("the webhook to be ready", || async move {
        Ok(admin.is_ready().await.unwrap_or(false))
    })
    .await?;
    let roots = Arc::new(common::webhook_ca(&client, "default", "webhook").await?);
    let start = Arc::new(tokio::sync::Barrier::new(CLIENTS + 1));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|index| {
            tokio::spawn(self::client(
                port,
                Arc::clone(&roots),
                index,
                Arc::clone(&start),
            ))
        })
        .collect();
    start.wait().await;
    let started = Instant::now();
    let mut latencies = Vec::new();
    for handle in clients {
        latencies.extend(handle.await??);
    }
    let elapsed = started.elapsed();
    latencies.sort();
    let percentile = |p: f64| {
        let index = ((latencies.len() as f64 * p).ceil() as usize).clamp(1, latencies.len()) - 1;
        latencies[index].as_secs_f64() * 1000.0
    };
    println!(
        "webhook reviews={} clients={CLIENTS} p50 ms={:.1} p99 ms={:.1} max ms={:.1} throughput/s={:.0}",
        latencies.len(),
        percentile(0.50),
        percentile(0.99),
        percentile(1.0),
        latencies.len() as f64 / elapsed.as_secs_f64()
    );
    println!("webhook p99 ms={:.1}", percentile(0.99));
    controller.start_kill()?;
    controller.wait().await?;
    Ok(())
}

fn main() -> Result<()> {
    let cases = 200_000;
    let started = Instant::now();
    let report = fuzz::run(cases, false);
    println!(
        "fuzz: {:.1} s; rejected {} (HTTP 400), judged {}, refused {}, unjudged {}",
        started.elapsed().as_secs_f64(),
        report.rejected,
        report.judged,
        report.refused,
        report.unjudged
    );
    println!("fuzz cases={} panics={}", report.cases, report.panics);
    ensure!(
        report.panics == 0 && report.failures.is_empty(),
        "{:#?}",
        report.failures
    );

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        for chaos in [
            chaos::Chaos {
                kills: 24,
                replicas: 1,
                web_replicas: 40,
                seed: rand::random(),
                eviction_requests: false,
            },
            chaos::Chaos {
                kills: 6,
                replicas: 2,
                web_replicas: 40,
                seed: rand::random(),
                eviction_requests: false,
            },
        ] {
            let started = Instant::now();
            let report = chaos::run(chaos).await?;
            println!(
                "chaos: {} replica(s), seed {}, {:.1} s",
                chaos.replicas,
                chaos.seed,
                started.elapsed().as_secs_f64()
            );
            println!("{report}");
        }
        webhook_latency().await
    })
}
