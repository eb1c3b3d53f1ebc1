//! `cargo xtask bench drain`: one node of 110 pods under 10 PodDisruptionBudgets
//! (maxUnavailable 1, 11 pods each, replacements Ready 2 s after they start), drained
//! (a) by this controller (`kubectl delete node`), (b) by the real `kubectl drain`; the wall
//! time of each until the last pod is gone, the lower bound (the longest budget chain: pods ×
//! (stop + replacement ready)), the ratios, and kube-sim's availability audit for each. Then
//! the controller's RSS with 5,000 nodes and 150,000 pods in the cluster. Then rollouts of one
//! shape: every node of a pool deleted at once under a NodeDisruptionBudget of 10 %, each node
//! replaced by a successor as it goes (a fleet rolled node by node), for pools of 100 and 1,000
//! (of 5,000 nodes) and 5,000 (of 10,000), each three times: wall time, the controller's CPU
//! time, its requests per node as kube-sim counted them (Events among them), budget status
//! conflicts, the most nodes disrupted at once (seen by a watch of our own) and the
//! controller's peak RSS; then the CPU per node of the medians and their ratios, and the
//! 5,000-node rollout's worst RSS, median requests and most disrupted.
//! `cargo bench --bench drain -- rollout` runs the rollouts alone, `-- pool=N` one rollout of
//! that pool with its requests by kind and its Events by reason, `-- rss` the memory alone,
//! `-- eviction-request` the drain through the Eviction API and through EvictionRequests alone
//! (after (a), the same node is drained through EvictionRequests: the line `drain
//! eviction-request s=… ours/eviction-api=… violations=…`).

// A benchmark is one measured run, top to bottom, as a test is.
#![allow(clippy::too_many_lines)]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, CustomResourceExt};
use kube_sim::cluster::{Cluster, Workload, deployment};
use kube_sim::{KubeSim, SimOptions, WorldOptions};
use nodegrace_testing::bench::BenchedController;
use serde_json::json;
use termination_controller::api::{FINALIZER, NodeDisruptionBudget};

const BINARY: &str = env!("CARGO_BIN_EXE_termination-controller");
const BUDGETS: usize = 10;
const PODS_PER_BUDGET: usize = 11;
const READY_AFTER: f64 = 2.0;
const STOP: f64 = 0.5;

/// The controller with the benchmark's flags and `extra`.
fn start_controller(sim: &KubeSim, extra: &[&str]) -> Result<BenchedController> {
    let flags: Vec<&str> = std::iter::once("--instance-provider=sim")
        .chain(extra.iter().copied())
        .collect();
    BenchedController::start(
        BINARY,
        "nodegrace_termination_controller",
        sim.kubeconfig_path(),
        &flags,
    )
}

/// Waits until every node `selected` lists carries our finalizer.
async fn finalizer_on_every(nodes: &Api<Node>, selected: ListParams) -> Result<()> {
    nodegrace_testing::wait_for_within(
        "the finalizer on every managed node",
        Duration::from_secs(600),
        || {
            let (nodes, selected) = (nodes.clone(), selected.clone());
            async move {
                let list = nodes.list_metadata(&selected).await?;
                Ok(list.items.iter().all(|node| {
                    node.metadata
                        .finalizers
                        .iter()
                        .flatten()
                        .any(|f| f == FINALIZER)
                }))
            }
        },
    )
    .await
}

async fn set_unschedulable(client: &Client, nodes: &[&str], unschedulable: bool) -> Result<()> {
    let api: Api<Node> = Api::all(client.clone());
    for node in nodes {
        let patch = json!({"spec": {"unschedulable": unschedulable}});
        api.patch(node, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
    }
    Ok(())
}

async fn pods_left(client: &Client, node: &str) -> Result<usize> {
    let pods: Api<Pod> = Api::all(client.clone());
    Ok(pods
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await?
        .items
        .len())
}

/// A simulated cluster with the NodeDisruptionBudget CRD installed.
async fn sim_with_crd(options: SimOptions) -> Result<KubeSim> {
    Ok(Cluster::new(options.nodes)
        .options(options)
        .crd(NodeDisruptionBudget::crd())
        .start()
        .await?)
}

/// A cluster whose node-0 holds every pod of the 10 budgets, with room elsewhere for the
/// replacements; serving the EvictionRequest API when `eviction_requests`.
async fn cluster(eviction_requests: bool) -> Result<KubeSim> {
    let sim = sim_with_crd(SimOptions {
        nodes: 4,
        eviction_request_api: eviction_requests,
        world: WorldOptions {
            lease_renew_interval: Duration::from_millis(500),
            node_monitor_grace: Duration::from_secs(5),
            detach_delay: Duration::from_millis(200),
            ..WorldOptions::default()
        },
        ..SimOptions::default()
    })
    .await?;
    let client = sim.client();
    let others = ["node-1", "node-2", "node-3"];
    set_unschedulable(&client, &others, true).await?;
    let apps: Vec<Workload> = (0..BUDGETS)
        .map(|index| {
            deployment(
                &format!("app-{index}"),
                i32::try_from(PODS_PER_BUDGET).unwrap_or(0),
            )
            .timing(READY_AFTER, STOP)
            .budget(json!({"maxUnavailable": 1}))
        })
        .collect();
    for app in &apps {
        app.create(&client).await?;
    }
    for app in &apps {
        app.wait_ready(&client, Duration::from_secs(120)).await?;
    }
    set_unschedulable(&client, &others, false).await?;
    Ok(sim)
}

async fn until_drained(client: &Client, started: Instant) -> Result<Duration> {
    nodegrace_testing::wait_for_within("node-0 drained", Duration::from_secs(600), || {
        let client = client.clone();
        async move { Ok(pods_left(&client, "node-0").await? == 0) }
    })
    .await?;
    Ok(started.elapsed())
}

/// This controller's drain of node-0, through the Eviction API or (`eviction_requests`)
/// EvictionRequests: its time and the audit's violations.
async fn ours(eviction_requests: bool) -> Result<(Duration, usize)> {
    let sim = cluster(eviction_requests).await?;
    let client = sim.client();
    let api = if eviction_requests {
        "--eviction-api=eviction-request"
    } else {
        "--eviction-api=eviction"
    };
    let controller = start_controller(&sim, &[api])?;
    controller.until_ready().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    nodegrace_testing::wait_for("the finalizer on node-0", || {
        let nodes = nodes.clone();
        async move {
            Ok(nodes
                .get("node-0")
                .await?
                .metadata
                .finalizers
                .iter()
                .flatten()
                .any(|f| f == FINALIZER))
        }
    })
    .await?;
    let started = Instant::now();
    nodes.delete("node-0", &DeleteParams::default()).await?;
    let took = until_drained(&client, started).await?;
    Ok((took, sim.world().audit().violations().len()))
}

async fn kubectl() -> Result<(Duration, usize)> {
    let sim = cluster(false).await?;
    let client = sim.client();
    let started = Instant::now();
    let kubeconfig = sim.kubeconfig_path().to_path_buf();
    let status = tokio::task::spawn_blocking(move || {
        Command::new("kubectl")
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .args([
                "drain",
                "node-0",
                "--ignore-daemonsets",
                "--delete-emptydir-data",
                "--timeout=600s",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
    })
    .await??;
    if !status.success() {
        bail!("kubectl drain failed: {status}");
    }
    let took = until_drained(&client, started).await?;
    Ok((took, sim.world().audit().violations().len()))
}

async fn rss_at_scale() -> Result<f64> {
    let sim = sim_with_crd(nodegrace_testing::bench::idle_fleet()).await?;
    let controller = start_controller(&sim, &[])?;
    controller.until_ready().await?;
    // The finalizer goes onto every node; let those writes and their watch events settle.
    finalizer_on_every(&Api::all(sim.client()), ListParams::default()).await?;
    Ok(nodegrace_testing::rss_mib(controller.pid()))
}

/// How many times each size of rollout runs; their medians are compared.
const RUNS: usize = 3;
/// The controller's requests, as the simulator tells clients apart.
const AGENT: &str = "nodegrace-termination-controller";

/// A rollout's cluster: `nodes` in all, the first `pool` of them managed under a 10 % budget,
/// every one of them deleted at once.
#[derive(Clone, Copy)]
struct Fleet {
    nodes: usize,
    pool: usize,
}

/// The rollouts of one shape: all of a pool deleted at once under 10 %, the pool growing
/// tenfold and then fivefold (in a cluster twice the size).
const SHAPE: [Fleet; 3] = [
    Fleet {
        nodes: 5_000,
        pool: 100,
    },
    Fleet {
        nodes: 5_000,
        pool: 1_000,
    },
    Fleet {
        nodes: 10_000,
        pool: 5_000,
    },
];

/// What one rollout measured.
struct Rollout {
    seconds: f64,
    cpu_seconds: f64,
    conflicts: u64,
    max_disrupted: usize,
    /// Once the finalizers are on, before the first deletion.
    rss_before_mib: f64,
    max_rss_mib: f64,
    /// From the last node gone until the controller is quiet: the reporter's trailing writes.
    reporting_tail_seconds: f64,
    /// Every request the controller sent from the first deletion until it was quiet.
    requests: u64,
    /// Of those, the Events it created or counted up.
    events: u64,
    /// The requests by kind, most first: where they went.
    by_kind: Vec<(String, u64)>,
}

fn disrupted(node: &Node) -> bool {
    node.spec.as_ref().is_some_and(|spec| {
        spec.unschedulable == Some(true)
            || spec
                .taints
                .iter()
                .flatten()
                .any(|taint| taint.key == termination_controller::api::DISRUPTED_TAINT)
    })
}

/// A deleted pool node's successor in the pool the budget counts: a Node of its own machine,
/// registered and reported Ready as its kubelet would (kube-sim's kubelets report at their
/// Lease renewal, which this bench puts an hour away).
async fn register_successor(nodes: Api<Node>, gone: String) {
    let name = format!("{gone}-next");
    // A slow moment of the simulator (5,000 nodes going at once) must not leave the pool a
    // node short, or one NotReady for good: each write is tried until it lands.
    for attempt in 1..=20 {
        match register(&nodes, &name).await {
            Ok(()) => return,
            Err(error) if attempt == 20 => eprintln!("successor {name} not registered: {error}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

async fn register(nodes: &Api<Node>, name: &str) -> kube::Result<()> {
    let node = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"pool": "rollout", "kubernetes.io/hostname": name}},
        "spec": {"providerID": format!("sim:///{name}")},
    }))
    .map_err(kube::Error::SerdeError)?;
    match nodes.create(&PostParams::default(), &node).await {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 409 => {}
        Err(error) => return Err(error),
    }
    let now = jiff::Timestamp::now().to_string();
    let ready = json!({"status": {"conditions": [{
        "type": "Ready", "status": "True", "reason": "KubeletReady",
        "lastHeartbeatTime": now, "lastTransitionTime": now,
    }]}});
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&ready))
        .await
        .map(drop)
}

/// Watches the pool's nodes: the most disrupted at once, and how many are gone. Each node
/// gone is replaced by a successor, as a fleet rolled node by node is: the budget's 10 %
/// stays 10 % of the same number of nodes to the end.
fn watch_pool(
    client: &Client,
) -> (
    tokio::sync::watch::Receiver<usize>,
    tokio::sync::watch::Receiver<usize>,
) {
    use futures::StreamExt;
    use kube::runtime::{WatchStreamExt, watcher};
    let (most, most_seen) = tokio::sync::watch::channel(0);
    let (gone, gone_seen) = tokio::sync::watch::channel(0);
    let nodes: Api<Node> = Api::all(client.clone());
    tokio::spawn(async move {
        let mut disrupting = std::collections::HashSet::new();
        let mut present = std::collections::HashSet::new();
        // The names a relist has shown so far: a node deleted while the watch was down shows
        // up as missing from the relist, not as a Delete.
        let mut relisted = std::collections::HashSet::new();
        let mut removed = 0;
        let config = watcher::Config::default().labels("pool=rollout");
        let mut events = std::pin::pin!(watcher(nodes.clone(), config).default_backoff());
        while let Some(event) = events.next().await {
            let Ok(event) = event else { continue };
            let mut gone_now = Vec::new();
            match event {
                watcher::Event::Init => relisted.clear(),
                watcher::Event::Apply(node) | watcher::Event::InitApply(node) => {
                    let name = node.metadata.name.clone().unwrap_or_default();
                    relisted.insert(name.clone());
                    if disrupted(&node) {
                        disrupting.insert(name.clone());
                    } else {
                        disrupting.remove(&name);
                    }
                    present.insert(name);
                }
                watcher::Event::InitDone => {
                    gone_now.extend(
                        present
                            .iter()
                            .filter(|name| !relisted.contains(*name))
                            .cloned(),
                    );
                }
                watcher::Event::Delete(node) => {
                    gone_now.push(node.metadata.name.unwrap_or_default());
                }
            }
            for name in gone_now {
                if present.remove(&name) {
                    tokio::spawn(register_successor(nodes.clone(), name.clone()));
                    disrupting.remove(&name);
                    removed += 1;
                    gone.send_replace(removed);
                }
            }
            most.send_if_modified(|most| {
                let bigger = disrupting.len() > *most;
                *most = (*most).max(disrupting.len());
                bigger
            });
        }
    });
    (most_seen, gone_seen)
}

/// Until none of the first `deleted` nodes is left. The watch's count of deletions is the
/// fast path; a LIST every few seconds is the truth, and registers the successor of a node
/// whose deletion the watch did not see (a 5,000-node rollout once lost some across a
/// relist and never ended).
async fn until_pool_replaced(
    nodes: &Api<Node>,
    deleted: usize,
    mut gone: tokio::sync::watch::Receiver<usize>,
) -> Result<()> {
    loop {
        let seen = tokio::time::timeout(
            Duration::from_secs(5),
            gone.wait_for(|gone| *gone >= deleted),
        )
        .await;
        if matches!(seen, Ok(Ok(_))) {
            return Ok(());
        }
        let names: std::collections::HashSet<String> = nodes
            .list_metadata(&ListParams::default().labels("pool=rollout"))
            .await?
            .items
            .into_iter()
            .filter_map(|node| node.metadata.name)
            .collect();
        let mut left = 0;
        for index in 0..deleted {
            let name = format!("node-{index}");
            if names.contains(&name) {
                left += 1;
            } else if !names.contains(&format!("{name}-next")) {
                tokio::spawn(register_successor(nodes.clone(), name));
            }
        }
        if left == 0 {
            return Ok(());
        }
    }
}

/// [`RUNS`] rollouts of `fleet`, the cheapest first.
async fn rollouts(fleet: Fleet) -> Result<Vec<Rollout>> {
    let mut runs = Vec::with_capacity(RUNS);
    for _ in 0..RUNS {
        runs.push(rollout(fleet).await?);
    }
    runs.sort_by(|a, b| a.cpu_seconds.total_cmp(&b.cpu_seconds));
    Ok(runs)
}

/// `fleet.nodes` nodes with a pod each; the first `fleet.pool` in the pool under a 10 %
/// budget, all deleted at once.
async fn rollout(fleet: Fleet) -> Result<Rollout> {
    use futures::{StreamExt, TryStreamExt};
    let Fleet { nodes: size, pool } = fleet;
    let deleted = pool;
    let sim = sim_with_crd(SimOptions {
        nodes: size,
        pods_per_node: 1,
        world: WorldOptions {
            // Kubelets stop the evicted pods; nothing replaces them, and no node goes
            // NotReady while the bench runs.
            workloads: false,
            node_lifecycle: false,
            lease_renew_interval: Duration::from_secs(3600),
            ..WorldOptions::default()
        },
        ..SimOptions::default()
    })
    .await?;
    let client = sim.client();
    let nodes: Api<Node> = Api::all(client.clone());
    futures::stream::iter(0..pool)
        .map(|index| {
            let nodes = nodes.clone();
            async move {
                let patch = json!({"metadata": {"labels": {"pool": "rollout"}}});
                nodes
                    .patch(
                        &format!("node-{index}"),
                        &PatchParams::default(),
                        &Patch::Merge(&patch),
                    )
                    .await
            }
        })
        .buffer_unordered(32)
        .try_collect::<Vec<_>>()
        .await?;
    let budgets: Api<NodeDisruptionBudget> = Api::all(client.clone());
    budgets
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "nodegrace.io/v1alpha1", "kind": "NodeDisruptionBudget",
                "metadata": {"name": "rollout"},
                "spec": {"selector": {"matchLabels": {"pool": "rollout"}}, "maxUnavailable": "10%"},
            }))?,
        )
        .await?;
    // Only the pool is managed; the API limit is raised so the figures are the controller's
    // own cost, not its client's pacing.
    let controller = start_controller(
        &sim,
        &[
            "--node-selector=pool=rollout",
            "--api-qps=1000",
            "--api-burst=2000",
            "--eviction-qps=1000",
            "--eviction-burst=2000",
        ],
    )?;
    controller.until_ready().await?;
    finalizer_on_every(&nodes, ListParams::default().labels("pool=rollout")).await?;
    let (most, gone) = watch_pool(&client);
    let pid = controller.pid();
    let rss_before_mib = nodegrace_testing::rss_mib(pid);
    let cpu_before = nodegrace_testing::cpu_seconds(pid);
    let rss_peak = nodegrace_testing::bench::PeakRss::start(pid);
    sim.requests().reset();
    let started = Instant::now();
    futures::stream::iter(0..deleted)
        .map(|index| {
            let nodes = nodes.clone();
            async move {
                nodes
                    .delete(&format!("node-{index}"), &DeleteParams::default())
                    .await
            }
        })
        .buffer_unordered(64)
        .try_collect::<Vec<_>>()
        .await?;
    tokio::time::timeout(
        Duration::from_secs(1200),
        until_pool_replaced(&nodes, deleted, gone),
    )
    .await??;
    let seconds = started.elapsed().as_secs_f64();
    // What the rollout cost includes what it left queued: the conditions and Events the
    // reporter writes after the nodes are gone. A 100-node rollout is over before its reporter
    // has written a tenth of them, a 1,000-node one mostly is not: stopping the clock at the
    // last node would bill the larger rollout for work the smaller one leaves uncounted.
    let reporting_tail_seconds = until_quiet(pid).await;
    let cpu_seconds = nodegrace_testing::cpu_seconds(pid) - cpu_before;
    let max_rss_mib = rss_peak.finish().await?;
    let metrics = controller.admin().get("/metrics").await?;
    let conflicts = nodegrace_testing::sample(
        &metrics,
        "nodegrace_termination_controller_errors_total{kind=\"conflict\"}",
    )
    .unwrap_or(0.0);
    let max_disrupted = *most.borrow();
    let counts = sim.requests().of(AGENT);
    let requests = counts.values().sum();
    let events = counts
        .iter()
        .filter(|(kind, _)| kind.resource == "events" && kind.verb != "watch")
        .map(|(_, count)| count)
        .sum();
    let mut by_kind: Vec<(String, u64)> = counts
        .into_iter()
        .map(|(kind, count)| {
            let mut what = format!("{} {}", kind.verb, kind.resource);
            if !kind.subresource.is_empty() {
                what = format!("{what}/{}", kind.subresource);
            }
            (what, count)
        })
        .collect();
    by_kind.sort_by_key(|(_, count)| std::cmp::Reverse(*count));
    // And the Events it wrote, by reason (a count-up of a series is one more of it).
    let mut by_reason = std::collections::BTreeMap::<String, u64>::new();
    let events_api: Api<k8s_openapi::api::events::v1::Event> = Api::all(client.clone());
    for event in events_api.list(&ListParams::default()).await?.items {
        if event.reporting_controller.as_deref() == Some(AGENT) {
            let count = event.series.as_ref().map_or(1, |series| series.count);
            *by_reason
                .entry(event.reason.unwrap_or_default())
                .or_default() += u64::try_from(count).unwrap_or_default();
        }
    }
    by_kind.extend(
        by_reason
            .into_iter()
            .map(|(reason, count)| (format!("  Event {reason}"), count)),
    );
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    Ok(Rollout {
        seconds,
        cpu_seconds,
        conflicts: conflicts.round() as u64,
        max_disrupted,
        rss_before_mib,
        max_rss_mib,
        reporting_tail_seconds,
        requests,
        events,
        by_kind,
    })
}

/// Waits until `pid` spends less than 1 % of a core for two seconds in a row (at most five
/// minutes); returns how long that took.
async fn until_quiet(pid: u32) -> f64 {
    const QUIET_CPU_SECONDS_PER_SECOND: f64 = 0.01;
    let started = Instant::now();
    let mut last = nodegrace_testing::cpu_seconds(pid);
    let mut quiet_seconds = 0;
    while quiet_seconds < 2 && started.elapsed() < Duration::from_secs(300) {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = nodegrace_testing::cpu_seconds(pid);
        if now - last < QUIET_CPU_SECONDS_PER_SECOND {
            quiet_seconds += 1;
        } else {
            quiet_seconds = 0;
        }
        last = now;
    }
    // The two quiet seconds belong to no one.
    (started.elapsed().as_secs_f64() - 2.0).max(0.0)
}

fn main() -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let args: Vec<String> = std::env::args().collect();
    let has = |word: &str| args.iter().any(|arg| arg == word);
    // `-- pool=N`: one size of the shape, once, with its requests by kind.
    let one_pool: Option<usize> = args
        .iter()
        .find_map(|arg| arg.strip_prefix("pool=")?.parse().ok());
    runtime.block_on(async {
        if has("eviction-request") {
            return eviction_request_line(ours(false).await?.0).await;
        }
        if has("rss") {
            println!("termination rss MiB={:.0}", rss_at_scale().await?);
            return Ok(());
        }
        if let Some(pool) = one_pool {
            let fleet = SHAPE
                .into_iter()
                .find(|fleet| fleet.pool == pool)
                .unwrap_or(Fleet { nodes: 5_000, pool });
            let run = rollout(fleet).await?;
            print_run(fleet, &run);
            for (what, count) in &run.by_kind {
                println!("  {what}: {:.2} per node", *count as f64 / pool as f64);
            }
            return Ok(());
        }
        if !has("rollout") {
            drain_and_memory().await?;
        }
        // A rollout's CPU moves by up to a fifth between runs of the same code: the simulator
        // in this process shares the two cores, and the controller's CPU follows the wall time
        // it is given. Each size runs three times and its median counts.
        let mut medians = Vec::new();
        for fleet in SHAPE {
            let runs = rollouts(fleet).await?;
            for run in &runs {
                print_run(fleet, run);
            }
            medians.push((fleet, runs));
        }
        // `rollouts` sorts by CPU: the middle run is the median.
        let per_node = |index: usize| {
            let (fleet, runs) = &medians[index];
            runs.get(RUNS / 2)
                .map_or(f64::NAN, |run| run.cpu_seconds * 1000.0 / fleet.pool as f64)
        };
        println!(
            "rollout shape=all-at-once pool=100 pool=1000 pool=5000/10000 cpu-ms-per-node={:.1}/{:.1}/{:.1} ratio-1000/100={:.2} ratio-5000/1000={:.2} (medians of {RUNS})",
            per_node(0),
            per_node(1),
            per_node(2),
            per_node(1) / per_node(0),
            per_node(2) / per_node(1)
        );
        // Memory and disruption are bounds an operator sizes for: the worst of the runs.
        // Requests are the median's.
        let (fleet, runs) = &medians[2];
        let nodes = fleet.pool as f64;
        let median = |figure: fn(&Rollout) -> f64| {
            let mut figures: Vec<f64> = runs.iter().map(figure).collect();
            figures.sort_by(f64::total_cmp);
            figures.get(figures.len() / 2).copied().unwrap_or(f64::NAN)
        };
        println!(
            "rollout nodes={} rss-max-MiB={:.0} requests-per-node={:.1} events-per-node={:.1} max-disrupted={}",
            fleet.pool,
            runs.iter().map(|run| run.max_rss_mib).fold(0.0, f64::max),
            median(|run| run.requests as f64) / nodes,
            median(|run| run.events as f64) / nodes,
            runs.iter().map(|run| run.max_disrupted).max().unwrap_or_default()
        );
        Ok(())
    })
}

fn print_run(fleet: Fleet, run: &Rollout) {
    let nodes = fleet.pool as f64;
    println!(
        "rollout pool={}/{} s={:.1} reporting-tail-s={:.0} controller-cpu-s={:.2} requests-per-node={:.1} events-per-node={:.1} status-conflicts={} max-disrupted={} rss-before-MiB={:.0} rss-max-MiB={:.0}",
        fleet.pool,
        fleet.nodes,
        run.seconds,
        run.reporting_tail_seconds,
        run.cpu_seconds,
        run.requests as f64 / nodes,
        run.events as f64 / nodes,
        run.conflicts,
        run.max_disrupted,
        run.rss_before_mib,
        run.max_rss_mib
    );
}

/// The same node drained through EvictionRequests (every pod handed to the default evictor),
/// against `eviction_api`, the Eviction API's time.
async fn eviction_request_line(eviction_api: Duration) -> Result<()> {
    let (took, violations) = ours(true).await?;
    println!(
        "drain eviction-request s={:.1} ours/eviction-api={:.2} violations={violations}",
        took.as_secs_f64(),
        took.as_secs_f64() / eviction_api.as_secs_f64()
    );
    Ok(())
}

async fn drain_and_memory() -> Result<()> {
    {
        let (ours, ours_violations) = ours(false).await?;
        let (kubectl, kubectl_violations) = kubectl().await?;
        let bound = PODS_PER_BUDGET as f64 * (STOP + READY_AFTER);
        println!(
            "drain ours s={:.1} kubectl s={:.1} bound s={bound:.1}",
            ours.as_secs_f64(),
            kubectl.as_secs_f64()
        );
        println!(
            "drain ratio ours/kubectl={:.2} ours/bound={:.2}",
            ours.as_secs_f64() / kubectl.as_secs_f64(),
            ours.as_secs_f64() / bound
        );
        println!("drain violations ours={ours_violations} kubectl={kubectl_violations}");
        eviction_request_line(ours).await?;
        println!("termination rss MiB={:.0}", rss_at_scale().await?);
    }
    Ok(())
}
