//! `cargo xtask bench sim`: the simulator at cluster scale. Loads 5,000 nodes and 150,000
//! pods, then measures memory, a full paginated pod list over HTTP, and watch delivery latency
//! at 1,000 writes/s with 100 watchers.

// A benchmark is one measured run, top to bottom, as a test is.
#![allow(clippy::too_many_lines)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Result;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod};
use kube::api::{Api, ListParams, PostParams, WatchEvent, WatchParams};
use kube_sim::{KubeSim, SimOptions, WorldOptions};
use serde_json::json;

const NODES: usize = 5_000;
const PODS_PER_NODE: usize = 30;
const WATCHERS: usize = 100;
const WRITES_PER_SECOND: u64 = 1_000;
const WRITE_SECONDS: u64 = 3;

fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[(((sorted.len() - 1) as f64) * p).round() as usize]
}

fn main() -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let started = Instant::now();
        let sim = KubeSim::start(SimOptions { nodes: NODES, pods_per_node: PODS_PER_NODE, world: WorldOptions::none(), ..SimOptions::default() }).await?;
        println!("load {NODES} nodes + {} pods: {:.1} s", NODES * PODS_PER_NODE, started.elapsed().as_secs_f64());
        println!("rss after load: {:.0} MiB", rss_mib());

        let pods: Api<Pod> = Api::all(sim.client());
        let listing = Instant::now();
        let (mut count, mut pages) = (0usize, 0usize);
        let mut params = ListParams::default().limit(500);
        loop {
            let page = pods.list(&params).await?;
            count += page.items.len();
            pages += 1;
            match page.metadata.continue_ {
                Some(token) if !token.is_empty() => params = params.continue_token(&token),
                _ => break,
            }
        }
        println!("full pod list (limit 500): {count} pods in {pages} pages, {:.2} s", listing.elapsed().as_secs_f64());

        let client = sim.client();
        Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "bench"}}))?).await?;
        let maps: Api<ConfigMap> = Api::namespaced(client.clone(), "bench");
        let version = maps.list(&ListParams::default()).await?.metadata.resource_version.unwrap_or_default();
        let origin = Instant::now();
        let latencies: Arc<Mutex<Vec<f64>>> = Arc::default();
        let total = WRITES_PER_SECOND * WRITE_SECONDS;
        let mut watchers = Vec::new();
        for _ in 0..WATCHERS {
            let maps = maps.clone();
            let version = version.clone();
            let latencies = Arc::clone(&latencies);
            watchers.push(tokio::spawn(async move {
                let mut stream = maps.watch(&WatchParams::default().timeout(60), &version).await?.boxed();
                let mut seen = 0;
                while let Some(event) = stream.try_next().await? {
                    if let WatchEvent::Added(map) = event {
                        let sent: f64 = map.data.as_ref().and_then(|d| d.get("sent")).and_then(|s| s.parse().ok()).unwrap_or(0.0);
                        let latency = origin.elapsed().as_secs_f64() * 1000.0 - sent;
                        latencies.lock().unwrap().push(latency);
                        seen += 1;
                        if seen == total {
                            break;
                        }
                    }
                }
                anyhow::Ok(())
            }));
        }
        let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / WRITES_PER_SECOND));
        let writing = Instant::now();
        for index in 0..total {
            tick.tick().await;
            let sent = origin.elapsed().as_secs_f64() * 1000.0;
            let map: ConfigMap = serde_json::from_value(json!({"metadata": {"name": format!("m{index}")}, "data": {"sent": sent.to_string()}}))?;
            maps.create(&PostParams::default(), &map).await?;
        }
        let write_rate = total as f64 / writing.elapsed().as_secs_f64();
        for watcher in watchers {
            watcher.await??;
        }
        let mut latencies = latencies.lock().unwrap().clone();
        latencies.sort_by(f64::total_cmp);
        println!("writes: {total} at {write_rate:.0}/s, {WATCHERS} watchers, {} events delivered", latencies.len());
        println!("watch event latency p50={:.1} ms p99={:.1} ms", percentile(&latencies, 0.5), percentile(&latencies, 0.99));
        println!("rss at the end: {:.0} MiB", rss_mib());
        soak(&sim).await
    })
}

const SOAK: Duration = Duration::from_secs(120);

/// A reflector and a Controller run for two minutes while watches are cut every 10 s and the
/// history expires every 30 s (forcing 410 and a re-list); at the end the cache must match.
async fn soak(sim: &KubeSim) -> Result<()> {
    use kube::runtime::{Controller, WatchStreamExt, controller::Action, reflector, watcher};
    use std::sync::atomic::{AtomicU64, Ordering};

    let client = sim.client();
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "soak"}}))?,
        )
        .await?;
    let maps: Api<ConfigMap> = Api::namespaced(client, "soak");
    let relists = Arc::new(AtomicU64::new(0));
    let reconciles = Arc::new(AtomicU64::new(0));
    let (cache, writer) = reflector::store();
    let counted = Arc::clone(&relists);
    let reflect = tokio::spawn(
        reflector::reflector(writer, watcher(maps.clone(), watcher::Config::default()))
            .default_backoff()
            .for_each(move |event| {
                if matches!(event, Ok(watcher::Event::Init)) {
                    counted.fetch_add(1, Ordering::Relaxed);
                }
                async {}
            }),
    );
    let context = Arc::clone(&reconciles);
    let controller = tokio::spawn(
        Controller::new(maps.clone(), watcher::Config::default())
            .run(
                |_map: Arc<ConfigMap>, seen: Arc<AtomicU64>| async move {
                    seen.fetch_add(1, Ordering::Relaxed);
                    Ok::<_, kube::Error>(Action::await_change())
                },
                |_, _, _| Action::requeue(Duration::from_secs(1)),
                context,
            )
            .for_each(|_| async {}),
    );
    let started = Instant::now();
    let mut writes = 0u64;
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    while started.elapsed() < SOAK {
        tick.tick().await;
        let name = format!("m{}", writes % 200);
        let map: ConfigMap = serde_json::from_value(
            json!({"metadata": {"name": name}, "data": {"n": writes.to_string()}}),
        )?;
        let _ = maps
            .patch(
                &name,
                &kube::api::PatchParams::apply("soak").force(),
                &kube::api::Patch::Apply(&map),
            )
            .await?;
        writes += 1;
        if writes.is_multiple_of(500) {
            sim.faults().close_watches();
        }
        if writes.is_multiple_of(1500) {
            sim.store().compact();
            sim.faults().close_watches();
        }
    }
    let expected: Vec<(String, String)> = {
        let mut items: Vec<_> = maps
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .map(|m| {
                (
                    m.metadata.name.unwrap_or_default(),
                    m.metadata.resource_version.unwrap_or_default(),
                )
            })
            .collect();
        items.sort();
        items
    };
    let deadline = Instant::now() + Duration::from_secs(15);
    let consistent = loop {
        let mut cached: Vec<_> = cache
            .state()
            .iter()
            .map(|m| {
                (
                    m.metadata.name.clone().unwrap_or_default(),
                    m.metadata.resource_version.clone().unwrap_or_default(),
                )
            })
            .collect();
        cached.sort();
        if cached == expected {
            break true;
        }
        if Instant::now() > deadline {
            break false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    reflect.abort();
    controller.abort();
    println!(
        "soak {} s: {writes} writes, watches cut every 10 s and history expired every 30 s, {} re-lists, {} reconciles, cache consistent: {}",
        SOAK.as_secs(),
        relists.load(Ordering::Relaxed),
        reconciles.load(Ordering::Relaxed),
        if consistent { "yes" } else { "NO" }
    );
    anyhow::ensure!(consistent, "the reflector cache diverged from the server");
    Ok(())
}
