//! `cargo xtask bench oos`: the release binary against kube-sim.
//! (1) taint → last pod force-deleted, one node of 110 pods and 100 such nodes at once;
//! (2) StatefulSet failover (taint → replacement Running with its volume attached) with this
//!     controller vs the KCM-like pod GC sweep alone (20 s), as a ratio;
//! (3) fencing: a machine hangs (its kubelet stops, its machine runs) → the StatefulSet's pod
//!     Running on another node with its volume, with `--fence-after 10s`, and → the machine
//!     powered on again and its node Ready without the taint (`--recover-after-cleanup`);
//! (4) the controller's RSS with 5,000 nodes and 150,000 pods in the cluster;
//! (5) a zone outage: 100, then 1,000 of those 5,000 nodes NotReady and tainted at once: the
//!     controller's peak RSS, its requests per dead node (kube-sim counts them by client) and
//!     the time until no pod is left on them. `cargo bench --bench oos -- outage` runs it alone.

use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::ListParams;
use kube::{Api, Client};
use kube_sim::cluster::statefulset;
use kube_sim::{KubeSim, SimOptions, WorldOptions};
use nodegrace_testing::bench::BenchedController;

#[path = "../tests/common/mod.rs"]
mod common;
use common::{stop_kubelet, taint};

const BINARY: &str = env!("CARGO_BIN_EXE_out-of-service-gc");

fn world() -> WorldOptions {
    WorldOptions {
        lease_renew_interval: Duration::from_millis(500),
        node_monitor_grace: Duration::from_secs(2),
        detach_delay: Duration::from_millis(200),
        ..WorldOptions::default()
    }
}

/// The controller with the benchmark's flags and `extra`.
fn start_controller(sim: &KubeSim, extra: &[&str]) -> Result<BenchedController> {
    let flags: Vec<&str> = std::iter::once("--liveness-guard-window=1s")
        .chain(extra.iter().copied())
        .collect();
    BenchedController::start(
        BINARY,
        "nodegrace_out_of_service_gc",
        sim.kubeconfig_path(),
        &flags,
    )
}

/// Stops the kubelets of `nodes` and waits until they are NotReady and their heartbeat is
/// older than the controller's guard window.
async fn kill(client: &Client, nodes: &[String]) -> Result<()> {
    let api: Api<Node> = Api::all(client.clone());
    for node in nodes {
        stop_kubelet(client, node).await?;
    }
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    for node in nodes {
        nodegrace_testing::wait_for("NotReady and silent", || async {
            let down = api
                .get(node)
                .await?
                .status
                .and_then(|s| s.conditions)
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status != "True"));
            let renewed = leases
                .get(node)
                .await?
                .spec
                .and_then(|s| s.renew_time)
                .map(|t| t.0);
            let silent = renewed
                .is_none_or(|t| jiff::Timestamp::now().duration_since(t).as_secs_f64() > 1.5);
            Ok(down && silent)
        })
        .await?;
    }
    Ok(())
}

async fn pods_on(client: &Client, nodes: &[String]) -> Result<usize> {
    let pods: Api<Pod> = Api::all(client.clone());
    let mut count = 0;
    for node in nodes {
        count += pods
            .list_metadata(&ListParams::default().fields(&format!("spec.nodeName={node}")))
            .await?
            .items
            .len();
    }
    Ok(count)
}

/// Taints `nodes` (already dead) and returns the time until none of their pods is left.
async fn force_delete_time(client: &Client, nodes: &[String]) -> Result<Duration> {
    let started = Instant::now();
    for node in nodes {
        taint(client, node).await?;
    }
    while pods_on(client, nodes).await? > 0 {
        if started.elapsed() > Duration::from_secs(600) {
            bail!("pods were still there after 10 minutes");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(started.elapsed())
}

async fn deletion(nodes: usize, extra: &[&str]) -> Result<Duration> {
    let sim = KubeSim::start(SimOptions {
        nodes: nodes + 1,
        pods_per_node: 110,
        world: WorldOptions {
            workloads: false,
            pod_gc: false,
            ..world()
        },
        ..SimOptions::default()
    })
    .await?;
    let controller = start_controller(&sim, extra)?;
    controller.until_ready().await?;
    // node-0 … node-{nodes-1} die; the last node stays.
    let dead: Vec<String> = (0..nodes).map(|index| format!("node-{index}")).collect();
    let client = sim.client();
    kill(&client, &dead).await?;
    force_delete_time(&client, &dead).await
}

/// taint → the StatefulSet's replacement Running on another node with its volume attached.
async fn failover(with_controller: bool) -> Result<Duration> {
    let sim = KubeSim::start(SimOptions {
        nodes: 3,
        world: world(),
        ..SimOptions::default()
    })
    .await?;
    let client = sim.client();
    let _controller = if with_controller {
        let controller = start_controller(&sim, &[])?;
        controller.until_ready().await?;
        Some(controller)
    } else {
        None
    };
    statefulset("db", 1)
        .image("postgres")
        .claim("data", "1Gi")
        .create(&client)
        .await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let mut node = None;
    while node.is_none() {
        node = pods.get_opt("db-0").await?.as_ref().and_then(running_on);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let node = node.unwrap_or_default();
    kill(&client, std::slice::from_ref(&node)).await?;
    let started = Instant::now();
    taint(&client, &node).await?;
    let attachments: Api<VolumeAttachment> = Api::all(client.clone());
    loop {
        if let Some(new_node) = pods.get_opt("db-0").await?.as_ref().and_then(running_on)
            && new_node != node
            && attached_on(&attachments, &new_node).await?
        {
            return Ok(started.elapsed());
        }
        if started.elapsed() > Duration::from_secs(120) {
            bail!("no failover within 2 minutes");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// `(hang → db-0 Running elsewhere with its volume attached, hang → node back untainted)`.
async fn fence_failover(fence_after: Duration) -> Result<(Duration, Duration)> {
    let sim = KubeSim::start(SimOptions {
        nodes: 5,
        world: world(),
        ..SimOptions::default()
    })
    .await?;
    let client = sim.client();
    let after = format!("--fence-after={}s", fence_after.as_secs());
    let controller = start_controller(
        &sim,
        &[
            &after,
            "--instance-provider=sim",
            "--auto-untaint=true",
            "--recover-after-cleanup=true",
        ],
    )?;
    controller.until_ready().await?;
    statefulset("db", 1)
        .image("postgres")
        .claim("data", "1Gi")
        .create(&client)
        .await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let mut node = None;
    while node.is_none() {
        node = pods.get_opt("db-0").await?.as_ref().and_then(running_on);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let node = node.unwrap_or_default();
    // Silent for the guard window first, as a machine that hung a moment ago would be by the
    // time it is NotReady: the clock starts at the hang.
    let started = Instant::now();
    stop_kubelet(&client, &node).await?;
    let attachments: Api<VolumeAttachment> = Api::all(client.clone());
    let moved = loop {
        if let Some(new_node) = pods.get_opt("db-0").await?.as_ref().and_then(running_on)
            && new_node != node
            && attached_on(&attachments, &new_node).await?
        {
            break started.elapsed();
        }
        if started.elapsed() > Duration::from_secs(180) {
            bail!("no failover within 3 minutes of the hang");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let nodes: Api<Node> = Api::all(client.clone());
    loop {
        let current = nodes.get(&node).await?;
        let ready = current
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        let tainted = current
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|t| t.iter().any(|t| t.key == common::TAINT));
        if ready && !tainted {
            return Ok((moved, started.elapsed()));
        }
        if started.elapsed() > Duration::from_secs(300) {
            bail!("the fenced machine was not back within 5 minutes of the hang");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn running_on(pod: &Pod) -> Option<String> {
    (pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .then(|| pod.spec.as_ref().and_then(|s| s.node_name.clone()))
        .flatten()
}

async fn attached_on(attachments: &Api<VolumeAttachment>, node: &str) -> Result<bool> {
    Ok(attachments
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .any(|va| va.spec.node_name == node && va.status.as_ref().is_some_and(|s| s.attached)))
}

async fn rss_at_scale() -> Result<f64> {
    let sim = KubeSim::start(nodegrace_testing::bench::idle_fleet()).await?;
    let controller = start_controller(&sim, &[])?;
    controller.until_ready().await?;
    // Let the first full listings settle before reading.
    tokio::time::sleep(Duration::from_secs(2)).await;
    Ok(nodegrace_testing::rss_mib(controller.pid()))
}

/// The controller's requests, as the simulator tells clients apart.
const AGENT: &str = "nodegrace-out-of-service-gc";

/// What a zone outage cost the controller.
struct Outage {
    seconds: f64,
    rss_max_mib: f64,
    requests: u64,
}

/// `dead` of 5,000 nodes (30 pods each, 150,000 in all) lose their kubelets at once, as a
/// zone does: each is marked NotReady as the node lifecycle controller would, then all are
/// tainted out-of-service together. Until every pod of theirs is force-deleted.
async fn outage(dead: usize) -> Result<Outage> {
    use futures::{StreamExt, TryStreamExt};
    let fleet = nodegrace_testing::bench::idle_fleet();
    let pods_per_node = fleet.pods_per_node;
    let sim = KubeSim::start(fleet).await?;
    let client = sim.client();
    let controller = start_controller(&sim, &["--api-qps=2000", "--api-burst=4000"])?;
    controller.until_ready().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let names: Vec<String> = (0..dead).map(|index| format!("node-{index}")).collect();
    // No kubelet runs in this fleet: the nodes are silent, and their Ready condition goes
    // Unknown as the node lifecycle controller writes it.
    let unknown = serde_json::json!({"status": {"conditions": [{
        "type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown",
        "message": "Kubelet stopped posting node status.",
        "lastHeartbeatTime": "2026-01-01T00:00:00Z",
        "lastTransitionTime": jiff::Timestamp::now().to_string(),
    }]}});
    futures::stream::iter(&names)
        .map(|name| {
            let nodes = nodes.clone();
            let unknown = &unknown;
            async move {
                nodes
                    .patch_status(
                        name,
                        &kube::api::PatchParams::default(),
                        &kube::api::Patch::Strategic(unknown),
                    )
                    .await
            }
        })
        .buffer_unordered(32)
        .try_collect::<Vec<_>>()
        .await?;
    let pid = controller.pid();
    let peak = nodegrace_testing::bench::PeakRss::start(pid);
    sim.requests().reset();
    let started = Instant::now();
    futures::stream::iter(&names)
        .map(|name| taint(&client, name))
        .buffer_unordered(32)
        .try_collect::<Vec<_>>()
        .await?;
    let expected = (dead * pods_per_node) as f64;
    let admin = controller.admin();
    nodegrace_testing::wait_for_within(
        "every pod of the dead nodes force-deleted",
        Duration::from_secs(900),
        || async {
            Ok(admin
                .metric("pods_force_deleted_total")
                .await?
                .unwrap_or(0.0)
                >= expected)
        },
    )
    .await?;
    let seconds = started.elapsed().as_secs_f64();
    let requests = sim.requests().of(AGENT).values().sum();
    Ok(Outage {
        seconds,
        rss_max_mib: peak.finish().await?,
        requests,
    })
}

fn print_outage(dead: usize, outage: &Outage) {
    println!(
        "oos outage nodes={dead} rss-max-MiB={:.0} requests-per-node={:.1} s={:.1}",
        outage.rss_max_mib,
        outage.requests as f64 / dead as f64,
        outage.seconds
    );
}

fn main() -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let outage_only = std::env::args().any(|arg| arg == "outage");
    runtime.block_on(async {
        if !outage_only {
            everything_else().await?;
        }
        // A tenth of the outage first: a dead node's requests must not grow with their number.
        for dead in [100, 1_000] {
            print_outage(dead, &outage(dead).await?);
        }
        Ok(())
    })
}

async fn everything_else() -> Result<()> {
    {
        let single = deletion(1, &[]).await?;
        println!("oos single-node last-pod-deleted ms={}", single.as_millis());
        // 22,000 writes: at the default 100 requests/s that is the rate limit, not the
        // controller; the limit is raised to see the controller's own pace.
        println!("(100 nodes: --api-qps=2000 --api-burst=4000)");
        let many = deletion(100, &["--api-qps=2000", "--api-burst=4000"]).await?;
        println!("oos 100-nodes last-pod-deleted ms={}", many.as_millis());
        let ours = failover(true).await?;
        let sweep = failover(false).await?;
        println!(
            "oos failover ours ms={} kcm-sweep ms={} ratio={:.1}",
            ours.as_millis(),
            sweep.as_millis(),
            sweep.as_secs_f64() / ours.as_secs_f64()
        );
        let fence_after = Duration::from_secs(10);
        let (moved, recovered) = fence_failover(fence_after).await?;
        println!(
            "(fence: node-monitor-grace {}s, liveness guard window 1s)",
            world().node_monitor_grace.as_secs()
        );
        println!(
            "fence notready-to-running-elsewhere s={:.1} fence-after={} recovered-s={:.1}",
            moved.as_secs_f64(),
            fence_after.as_secs(),
            recovered.as_secs_f64()
        );
        println!("oos rss MiB={:.0}", rss_at_scale().await?);
        Ok(())
    }
}
