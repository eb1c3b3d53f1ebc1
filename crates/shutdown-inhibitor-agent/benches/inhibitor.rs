//! `cargo xtask bench inhibitor`: how fast a Lease turns into a logind block and back, what
//! other nodes' Lease churn costs the agent (nothing, thanks to the field selector), and its
//! memory. The release binary runs against kube-sim and a real elogind.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube_sim::{KubeSim, SimOptions};
use logind_harness::{LogindHarness, ScenarioOptions};
use nodegrace_testing::Admin;
use serde_json::json;

const NODE: &str = "node-0";
const ROUNDS: usize = 40;
const CHURN: usize = 1_000;

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[(((sorted.len() - 1) as f64) * p).round() as usize]
}

async fn metric(port: u16, name: &str) -> Result<f64> {
    let admin = Admin {
        address: ([127, 0, 0, 1], port).into(),
        prefix: "nodegrace_shutdown_inhibitor_agent",
    };
    admin.value(name).await
}

async fn blocked(logind: &LogindHarness) -> Result<bool> {
    Ok(logind
        .list_inhibitors()
        .await?
        .iter()
        .any(|row| row.3 == "block" && row.1.contains("shutdown-inhibitor-agent")))
}

async fn until(logind: &LogindHarness, wanted: bool) -> Result<Duration> {
    let started = Instant::now();
    while blocked(logind).await? != wanted {
        if started.elapsed() > Duration::from_secs(20) {
            bail!("the block never became {wanted}");
        }
    }
    Ok(started.elapsed())
}

fn lease(name: &str, holder: &str) -> Result<Lease> {
    Ok(serde_json::from_value(
        json!({"metadata": {"name": name}, "spec": {"holderIdentity": holder, "acquireTime": jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()}}),
    )?)
}

fn main() -> Result<()> {
    if let Some(reason) = logind_harness::skip_reason() {
        println!("inhibitor bench skipped: {reason}");
        return Ok(());
    }
    let binary = env!("CARGO_BIN_EXE_shutdown-inhibitor-agent");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let sim = KubeSim::start(SimOptions { nodes: 1, ..SimOptions::default() }).await?;
        let logind = LogindHarness::start(ScenarioOptions::default()).await?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let mut agent = Command::new(binary)
            .args([
                format!("--node-name={NODE}"),
                format!("--kubeconfig={}", sim.kubeconfig_path().display()),
                format!("--dbus-address={}", logind.bus_address()),
                format!("--admin-listen=127.0.0.1:{port}"),
                "--log-level=warn".to_owned(),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let ready = Instant::now();
        while metric(port, "block_inhibitor_held").await.is_err() {
            if ready.elapsed() > Duration::from_secs(20) {
                bail!("the agent never came up");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let leases: Api<Lease> = Api::namespaced(sim.client(), "default");
        let (mut block, mut unblock) = (Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            leases.create(&PostParams::default(), &lease(NODE, "bench")?).await?;
            block.push(until(&logind, true).await?.as_secs_f64() * 1000.0);
            leases.delete(NODE, &DeleteParams::default()).await?;
            unblock.push(until(&logind, false).await?.as_secs_f64() * 1000.0);
        }
        block.sort_by(f64::total_cmp);
        unblock.sort_by(f64::total_cmp);
        let rss_idle = nodegrace_testing::rss_mib(agent.id());

        let before = metric(port, "lease_watch_events_total").await?;
        for index in 0..CHURN {
            let name = format!("other-node-{index}");
            leases.create(&PostParams::default(), &lease(&name, "someone")?).await?;
            leases.patch(&name, &PatchParams::default(), &Patch::Merge(json!({"spec": {"holderIdentity": "someone-else"}}))).await?;
            leases.delete(&name, &DeleteParams::default()).await?;
        }
        // A Lease of this node afterwards: once its block shows, every earlier event was delivered.
        leases.create(&PostParams::default(), &lease(NODE, "marker")?).await?;
        until(&logind, true).await?;
        let unrelated = metric(port, "lease_watch_events_total").await? - before - 1.0;
        let rss_busy = nodegrace_testing::rss_mib(agent.id());
        let _ = agent.kill();
        let _ = agent.wait();

        println!("rounds={ROUNDS} (Lease create → block listed by logind, delete → block gone)");
        println!("block latency p50={:.1} ms p99={:.1} ms", percentile(&block, 0.5), percentile(&block, 0.99));
        println!("unblock latency p50={:.1} ms p99={:.1} ms", percentile(&unblock, 0.5), percentile(&unblock, 0.99));
        println!("unrelated watch events={unrelated} (while {CHURN} other nodes' Leases were created, updated and deleted)");
        println!("rss={rss_idle:.1} MiB (idle), {rss_busy:.1} MiB (after the churn)");
        println!("release binary size={:.1} MiB", std::fs::metadata(binary)?.len() as f64 / 1024.0 / 1024.0);
        Ok(())
    })
}
