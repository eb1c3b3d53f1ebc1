//! `cargo xtask bench plugin`: `kubectl nodegrace status` through the real kubectl on 5,000
//! nodes, 1,200 of them in a program's work (1,000 deleting and waiting for their budget, 100
//! cleaned out of service, 100 with a shutdown held by a Lease). Prints
//! `plugin status nodes=5000 rows=1200 s=…` (the median of 5 runs; the bound is 2 s).

// A benchmark is one measured run, top to bottom, as a test is.
#![allow(clippy::too_many_lines)]

use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Node};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, CustomResourceExt};
use kube_sim::WorldOptions;
use kube_sim::cluster::Cluster;
use serde_json::json;
use termination_controller::api::{NodeDisruptionBudget, NodeDrainRule};

const NODES: usize = 5_000;
const DELETING: usize = 1_000;
const CLEANED: usize = 100;
const INHIBITED: usize = 100;
const RUNS: usize = 5;
const CONCURRENT: usize = 32;

fn condition(type_: &str, status: &str, reason: &str, message: &str) -> serde_json::Value {
    json!({"type": type_, "status": status, "reason": reason, "message": message,
           "lastHeartbeatTime": "2026-11-30T10:00:00Z", "lastTransitionTime": "2026-11-30T10:00:00Z"})
}

fn main() -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let sim = Cluster::new(NODES)
            .world(WorldOptions::none())
            .crd(NodeDisruptionBudget::crd())
            .crd(NodeDrainRule::crd())
            .start()
            .await?;
        let client = sim.client();
        let nodes: Api<Node> = Api::all(client.clone());
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "team-a"}}))?)
            .await?;
        let ready = condition("Ready", "True", "KubeletReady", "kubelet is posting ready status");
        let shaped = Instant::now();
        stream::iter(0..NODES)
            .map(|index| {
                let (nodes, client, ready) = (nodes.clone(), client.clone(), ready.clone());
                async move {
                    let name = format!("node-{index}");
                    let params = PatchParams::default();
                    nodes
                        .patch(&name, &params, &Patch::Merge(json!({"metadata": {"finalizers": ["nodegrace.io/termination"]}})))
                        .await?;
                    if index < DELETING {
                        let status = json!({"status": {"conditions": [ready,
                            condition("Terminating", "True", "AwaitingBudget", "NodeDisruptionBudget rollout: too few of its nodes are available now"),
                            condition("MaintenancePlanned", "True", "AwaitingBudget", "NodeDisruptionBudget rollout: too few of its nodes are available now")]}});
                        nodes.patch_status(&name, &params, &Patch::Merge(status)).await?;
                        nodes.delete(&name, &DeleteParams::default()).await?;
                    } else if index < DELETING + CLEANED {
                        let spec = json!({"spec": {"taints": [{"key": "node.kubernetes.io/out-of-service", "value": "nodeshutdown", "effect": "NoExecute"}]}});
                        nodes.patch(&name, &params, &Patch::Merge(spec)).await?;
                        let status = json!({"status": {"conditions": [
                            condition("Ready", "Unknown", "NodeStatusUnknown", "Kubelet stopped posting node status."),
                            condition("OutOfServiceCleanup", "True", "Done", "No pod that does not tolerate the out-of-service taint and no volume attachment is left on this node; remove the taint once the node is back")]}});
                        nodes.patch_status(&name, &params, &Patch::Merge(status)).await?;
                    } else if index < DELETING + CLEANED + INHIBITED {
                        let status = json!({"status": {"conditions": [ready,
                            condition("ShutdownInhibited", "True", "ActiveLeases", "team-a/db-backup")]}});
                        nodes.patch_status(&name, &params, &Patch::Merge(status)).await?;
                        let now = jiff::Timestamp::now().to_string();
                        Api::<Lease>::namespaced(client, "team-a")
                            .create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": name},
                                "spec": {"holderIdentity": "db-backup", "acquireTime": now, "renewTime": now}}))?)
                            .await?;
                    }
                    anyhow::Ok(())
                }
            })
            .buffer_unordered(CONCURRENT)
            .try_collect::<Vec<()>>()
            .await?;
        println!("shaped {NODES} nodes in {:.1} s", shaped.elapsed().as_secs_f64());

        let bin = tempfile::tempdir()?;
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_kubectl-nodegrace"), bin.path().join("kubectl-nodegrace"))?;
        let path = std::env::join_paths(
            std::iter::once(bin.path().to_owned())
                .chain(std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())),
        )?;
        let mut times = Vec::new();
        let mut rows = 0;
        for _ in 0..RUNS {
            let started = Instant::now();
            let output = tokio::process::Command::new("kubectl")
                .args(["nodegrace", "status", "-o", "json"])
                .env("PATH", &path)
                .env("KUBECONFIG", sim.kubeconfig_path())
                .output()
                .await?;
            times.push(started.elapsed());
            ensure!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
            let status: serde_json::Value = serde_json::from_slice(&output.stdout)?;
            rows = status["nodes"].as_array().map_or(0, Vec::len);
        }
        ensure!(rows == DELETING + CLEANED + INHIBITED, "rows={rows}");
        times.sort();
        let median: Duration = times[RUNS / 2];
        println!(
            "plugin status nodes={NODES} rows={rows} s={:.2} (median of {RUNS}; min {:.2}, max {:.2})",
            median.as_secs_f64(),
            times[0].as_secs_f64(),
            times[RUNS - 1].as_secs_f64()
        );
        Ok(())
    })
}
