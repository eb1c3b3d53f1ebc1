//! `cargo xtask bench shutdown`: how promptly the agent lets the shutdown proceed, and what it
//! costs. Runs the release binary against kube-sim and a real elogind, 20 shutdowns.

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, bail};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::PostParams;
use kube::runtime::watcher;
use kube::{Api, Client};
use kube_sim::{KubeSim, SimOptions};
use logind_harness::{LogindHarness, ScenarioOptions};
use serde_json::json;

const RUNS: usize = 20;
/// Three groups of three pods; each pod's stop time in seconds.
const GROUPS: [(&str, i32, [f64; 3]); 3] = [
    ("low", 0, [0.10, 0.25, 0.15]),
    ("mid", 1000, [0.20, 0.05, 0.10]),
    ("high", 100_000, [0.15, 0.10, 0.30]),
];

fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

struct Run {
    release_latency_ms: f64,
    overhead_ms: f64,
    rss_idle_kib: u64,
    rss_shutdown_kib: u64,
}

type Removals = Arc<Mutex<HashMap<String, SystemTime>>>;

/// When each pod of `node` left the API (a pod watch's deletions).
fn watch_removals(client: &Client, node: &str) -> (tokio::task::JoinHandle<()>, Removals) {
    let removed: Removals = Arc::default();
    let sink = Arc::clone(&removed);
    let config = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
    let watch_client = client.clone();
    let watch = tokio::spawn(async move {
        let mut events = watcher(Api::<Pod>::all(watch_client), config).boxed();
        while let Ok(Some(event)) = events.try_next().await {
            if let watcher::Event::Delete(pod) = event {
                sink.lock()
                    .unwrap()
                    .insert(pod.metadata.name.unwrap_or_default(), SystemTime::now());
            }
        }
    });
    (watch, removed)
}

/// A fresh elogind (30 s of inhibit delay) and the release agent for `node` on it, with
/// `flags` after the common ones. The state directory lives as long as the returned value.
async fn start_agent(
    sim: &KubeSim,
    binary: &str,
    node: &str,
    flags: &[String],
) -> Result<(LogindHarness, Child, tempfile::TempDir)> {
    let logind = LogindHarness::start(ScenarioOptions {
        inhibit_delay_max: Duration::from_secs(30),
        ..ScenarioOptions::default()
    })
    .await?;
    let state = tempfile::tempdir()?;
    std::fs::write(state.path().join("boot_id"), "bench\n")?;
    let agent = Command::new(binary)
        .args([
            format!("--node-name={node}"),
            format!("--kubeconfig={}", sim.kubeconfig_path().display()),
            format!("--dbus-address={}", logind.bus_address()),
            format!("--state-dir={}", state.path().display()),
            format!("--boot-id-file={}", state.path().join("boot_id").display()),
            format!("--logind-drop-in-dir={}", logind.drop_in_dir().display()),
            "--admin-listen=127.0.0.1:0".to_owned(),
            "--log-level=warn".to_owned(),
        ])
        .args(flags)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("start the agent binary")?;
    Ok((logind, agent, state))
}

async fn one_run(sim: &KubeSim, client: &Client, run: usize, binary: &str) -> Result<Run> {
    let node = format!("bench-{run}");
    Api::<Node>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(kube_sim::populate::node(&node))?,
        )
        .await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    for (class, _, stops) in GROUPS {
        for (index, stop) in stops.iter().enumerate() {
            let pod = json!({
                "metadata": {"name": format!("{node}-{class}-{index}"), "annotations": {"sim.nodegrace.io/stop-seconds": stop.to_string()}},
                "spec": {"nodeName": node, "priorityClassName": class, "containers": [{"name": "c", "image": "i"}]},
            });
            pods.create(&PostParams::default(), &serde_json::from_value(pod)?)
                .await?;
        }
    }
    let (watch, removed) = watch_removals(client, &node);
    let flags = ["--shutdown-grace-period-by-pod-priority=0=5,1000=5,100000=5".to_owned()];
    let (logind, mut agent, _state) = start_agent(sim, binary, &node, &flags).await?;
    let outcome = measure(&logind, &mut agent, &removed).await;
    watch.abort();
    let _ = agent.kill();
    let _ = agent.wait();
    outcome
}

/// Waits until the agent holds its delay lock, as it does before any shutdown can be measured.
async fn delay_lock_taken(logind: &LogindHarness, deadline: Instant) -> Result<()> {
    while !logind
        .list_inhibitors()
        .await?
        .iter()
        .any(|row| row.3 == "delay")
    {
        if Instant::now() > deadline {
            bail!("the agent never took its inhibitor");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}

async fn measure(logind: &LogindHarness, agent: &mut Child, removed: &Removals) -> Result<Run> {
    let deadline = Instant::now() + Duration::from_secs(20);
    delay_lock_taken(logind, deadline).await?;
    let rss_idle_kib = rss_kib(agent.id()).unwrap_or(0);
    let powered_off = SystemTime::now();
    logind.power_off().await?;
    let mut rss_shutdown_kib = rss_idle_kib;
    while logind.shutdown_hook_runs().is_empty() {
        rss_shutdown_kib = rss_shutdown_kib.max(rss_kib(agent.id()).unwrap_or(0));
        if Instant::now() > deadline + Duration::from_secs(30) {
            bail!("shutdown never proceeded");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let hook = logind.shutdown_hook_runs()[0];
    // The pod watch may deliver the last removal a moment after the hook ran.
    let settle = Instant::now() + Duration::from_secs(5);
    while removed.lock().unwrap().len() < 9 && Instant::now() < settle {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let last_removed = removed
        .lock()
        .unwrap()
        .values()
        .max()
        .copied()
        .context("no pod removal seen")?;
    let release_latency_ms = hook
        .duration_since(last_removed)
        .map_or_else(|early| -early.duration().as_secs_f64(), |d| d.as_secs_f64())
        * 1000.0;
    let ideal: f64 = GROUPS
        .iter()
        .map(|(_, _, stops)| stops.iter().copied().fold(0.0, f64::max))
        .sum();
    let total = hook.duration_since(powered_off)?.as_secs_f64();
    Ok(Run {
        release_latency_ms,
        overhead_ms: (total - ideal) * 1000.0,
        rss_idle_kib,
        rss_shutdown_kib,
    })
}

/// A full node (110 pods, the kubelet's default maxPods) in one group of 20 s, the agent at
/// the chart's API limit (5 requests/s, burst 10): how many pods are deleted within the group,
/// and how long until the last one is. `shutdown_api_burst` 0 is the agent's default (sized
/// from the node); 10 is the chart's burst alone, as before the shutdown had a client of its own.
/// Returns the pods deleted within the group, and the seconds from the power-off to the last
/// deletion (`None`: no pod was deleted before the machine went).
async fn full_node(
    sim: &KubeSim,
    client: &Client,
    binary: &str,
    shutdown_api_burst: u32,
) -> Result<(usize, Option<f64>)> {
    const PODS: usize = 110;
    const PERIOD: Duration = Duration::from_secs(20);
    let node = format!("full-node-{shutdown_api_burst}");
    let mut node_object = kube_sim::populate::node(&node);
    node_object["status"]["allocatable"]["pods"] = json!(PODS.to_string());
    Api::<Node>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(node_object)?,
        )
        .await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    for index in 0..PODS {
        let pod = json!({
            "metadata": {"name": format!("{node}-{index}"), "annotations": {"sim.nodegrace.io/stop-seconds": "0.1"}},
            "spec": {"nodeName": node, "priorityClassName": "low", "containers": [{"name": "c", "image": "i"}]},
        });
        pods.create(&PostParams::default(), &serde_json::from_value(pod)?)
            .await?;
    }
    let (watch, removed) = watch_removals(client, &node);
    let flags = [
        format!(
            "--shutdown-grace-period-by-pod-priority=0={}",
            PERIOD.as_secs()
        ),
        "--api-qps=5".to_owned(),
        "--api-burst=10".to_owned(),
        format!("--shutdown-api-burst={shutdown_api_burst}"),
    ];
    let (logind, mut agent, _state) = start_agent(sim, binary, &node, &flags).await?;
    let outcome = async {
        let deadline = Instant::now() + Duration::from_secs(20);
        delay_lock_taken(&logind, deadline).await?;
        let powered_off = SystemTime::now();
        logind.power_off().await?;
        while logind.shutdown_hook_runs().is_empty() {
            if Instant::now() > deadline + PERIOD + Duration::from_secs(30) {
                bail!("shutdown never proceeded");
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let settle = Instant::now() + Duration::from_secs(5);
        while removed.lock().unwrap().len() < PODS && Instant::now() < settle {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let removed = removed.lock().unwrap();
        let in_group = removed
            .values()
            .filter(|at| {
                at.duration_since(powered_off)
                    .is_ok_and(|after| after <= PERIOD)
            })
            .count();
        let last = removed
            .values()
            .filter_map(|at| at.duration_since(powered_off).ok())
            .max()
            .map(|last| last.as_secs_f64());
        Ok((in_group, last))
    }
    .await;
    watch.abort();
    let _ = agent.kill();
    let _ = agent.wait();
    outcome
}

fn main() -> Result<()> {
    if let Some(reason) = logind_harness::skip_reason() {
        println!("shutdown bench skipped: {reason}");
        return Ok(());
    }
    let binary = env!("CARGO_BIN_EXE_graceful-shutdown-agent");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let sim = KubeSim::start(SimOptions::default()).await?;
        let client = sim.client();
        let classes: Api<k8s_openapi::api::scheduling::v1::PriorityClass> = Api::all(client.clone());
        for (class, value, _) in GROUPS {
            classes.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": class}, "value": value}))?).await?;
        }
        let mut runs = Vec::with_capacity(RUNS);
        for run in 0..RUNS {
            runs.push(one_run(&sim, &client, run, binary).await.with_context(|| format!("run {run}"))?);
        }
        let mut latency: Vec<f64> = runs.iter().map(|r| r.release_latency_ms).collect();
        let mut overhead: Vec<f64> = runs.iter().map(|r| r.overhead_ms).collect();
        latency.sort_by(f64::total_cmp);
        overhead.sort_by(f64::total_cmp);
        let idle = runs.iter().map(|r| r.rss_idle_kib).max().unwrap_or(0) as f64 / 1024.0;
        let busy = runs.iter().map(|r| r.rss_shutdown_kib).max().unwrap_or(0) as f64 / 1024.0;
        println!("runs={RUNS} (3 priority groups x 3 pods, pods stop in 0.05-0.30 s)");
        println!("release latency p50={:.1} ms p99={:.1} ms (inhibitor release, seen as the shutdown hook, minus last pod removed)", percentile(&latency, 0.5), percentile(&latency, 0.99));
        println!("shutdown overhead p50={:.1} ms p99={:.1} ms (total shutdown time minus the slowest pod of each group)", percentile(&overhead, 0.5), percentile(&overhead, 0.99));
        println!("agent rss idle={idle:.1} MiB");
        println!("agent rss during shutdown={busy:.1} MiB");
        println!("release binary size={:.1} MiB", std::fs::metadata(binary)?.len() as f64 / 1024.0 / 1024.0);
        let seconds = |last: Option<f64>| last.map_or_else(|| "none-deleted".to_owned(), |s| format!("{s:.1}"));
        let (in_group, last) = full_node(&sim, &client, binary, 0).await.context("full node")?;
        println!("full-node pods=110 deleted-in-group={in_group} s={} (one group of 20 s, --api-qps=5 --api-burst=10 as the chart sets, shutdown burst sized from the node)", seconds(last));
        let (in_group, last) = full_node(&sim, &client, binary, 10).await.context("full node, burst 10")?;
        println!("full-node pods=110 deleted-in-group={in_group} s={} (the same with --shutdown-api-burst=10, the chart's limit alone as before: the status patches take every token first)", seconds(last));
        Ok(())
    })
}
