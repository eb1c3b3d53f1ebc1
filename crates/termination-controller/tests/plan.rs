//! `termination-controller plan`, run as an operator runs it (the binary, a kubeconfig), checked
//! against what the drain then does: the same tiers in the same order, the same blocker.

use std::collections::BTreeMap;

use crate::common::*;
use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::{Value, json};

/// The pods of each tier, in order, as the plan lists them.
fn tiers(plan: &Value) -> Vec<(String, Vec<String>)> {
    plan["tiers"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|tier| {
            let pods = tier["pods"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|pod| pod["pod"].as_str())
                .map(|pod| pod.trim_start_matches("default/").to_owned())
                .collect();
            (tier["tier"].as_str().unwrap_or_default().to_owned(), pods)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plan_names_the_tiers_and_blockers_the_drain_then_follows() -> Result<()> {
    let sim = sim(3).await?;
    let client = sim.client();
    let controller = controller(&sim, &[]).await?;
    workers_budget(&client).await?;
    web(6).create(&client).await?;
    // Six of each on three nodes (the scheduler spreads by pod count): node-1 has some of all.
    app("frozen", 6)
        .budget(json!({"maxUnavailable": 0}))
        .create(&client)
        .await?;
    app("dns", 6)
        .pod(&json!({"spec": {"priorityClassName": "system-cluster-critical"}}))
        .budget(json!({"maxUnavailable": 1}))
        .create(&client)
        .await?;
    log_daemonset(&client).await?;
    create(
        &client,
        json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "batch", "namespace": "default", "labels": {"nodegrace.io/do-not-evict": "true"}},
        "spec": {"nodeName": "node-1", "containers": [{"name": "c", "image": "app"}]}}),
    )
    .await?;
    for (app, count) in [("web", 6), ("frozen", 6), ("dns", 6), ("logs", 3)] {
        wait_ready(&client, app, count).await?;
    }
    finalizer_on_every_node(&client, 3).await?;

    // The first plan: a blocker, a pod no budget lets go, and so no estimate.
    let first: Value = serde_json::from_str(&plan(&sim, "node-1", true)?)?;
    ensure!(first["heldByFinalizer"] == true, "{first}");
    ensure!(
        first["blockers"] == json!([{"pod": "default/batch", "until": null}]),
        "{first}"
    );
    let never = first["neverEvictable"].to_string();
    ensure!(
        never.contains("default/frozen-") && never.contains("maxUnavailable is 0"),
        "{first:#}"
    );
    ensure!(first["estimate"]["minDrainSeconds"].is_null(), "{first}");
    ensure!(first["nodeDisruptionBudgets"]["granted"] == true, "{first}");
    ensure!(
        first["machine"]["provider"] == "none" && first["machine"]["providerID"] == "sim:///node-1",
        "{first}"
    );
    let table = plan(&sim, "node-1", false)?;
    println!("{table}");
    for expected in [
        "TIER",
        "QUEUE (PDB)",
        "1 workloads",
        "default/web",
        "Never evictable:",
        "Do-not-evict blockers:",
        "Estimated minimum drain time: never",
        "Machine:                 sim:///node-1 (instance provider none): none: only the Node goes",
    ] {
        ensure!(table.contains(expected), "{expected:?} in:\n{table}");
    }

    // Let frozen go; the second plan is what the drain is checked against.
    Api::<PodDisruptionBudget>::namespaced(client.clone(), "default")
        .patch(
            "frozen",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"maxUnavailable": 1}})),
        )
        .await?;
    wait_for("the frozen budget to allow", || {
        let client = client.clone();
        async move {
            let pdb = Api::<PodDisruptionBudget>::namespaced(client, "default")
                .get("frozen")
                .await?;
            Ok(pdb.status.and_then(|status| status.disruptions_allowed) > Some(0))
        }
    })
    .await?;
    let planned: Value = serde_json::from_str(&plan(&sim, "node-1", true)?)?;
    ensure!(planned["neverEvictable"] == json!([]), "{planned}");
    ensure!(
        planned["estimate"]["minDrainSeconds"].is_number(),
        "{planned}"
    );
    let planned_tiers = tiers(&planned);
    let labels: Vec<&str> = planned_tiers
        .iter()
        .map(|(tier, _)| tier.as_str())
        .collect();
    ensure!(
        labels == ["workloads", "DaemonSet pods", "critical workloads"],
        "{labels:?}"
    );

    let seen = record(&client);
    delete_node(&client, "node-1").await?;
    // The blocker the plan named is the one the drain waits on.
    wait_for("node-1 to wait for batch", || {
        let client = client.clone();
        async move {
            Ok(condition(&client, "node-1", "Terminating")
                .await?
                .is_some_and(|(reason, message)| {
                    reason == "BlockedByDoNotEvict" && message.contains("batch")
                }))
        }
    })
    .await?;
    Api::<Pod>::namespaced(client.clone(), "default")
        .delete("batch", &DeleteParams::default())
        .await?;
    wait_for("node-1 to go", || node_gone(&client, "node-1")).await?;

    // Every pod of a tier was gone before any pod of a later tier started to leave.
    let seen = seen.log.lock().expect("log").clone();
    let mut left_at = BTreeMap::new();
    let mut gone_at = BTreeMap::new();
    for (at, event) in &seen {
        match event {
            Seen::Leaving(pod) => {
                left_at.entry(pod.clone()).or_insert(*at);
            }
            Seen::Gone(pod) => {
                gone_at.insert(pod.clone(), *at);
            }
            _ => {}
        }
    }
    for (index, (tier, pods)) in planned_tiers.iter().enumerate() {
        let last_gone = pods
            .iter()
            .map(|pod| {
                gone_at
                    .get(pod)
                    .with_context(|| format!("{pod} never went"))
            })
            .collect::<Result<Vec<_>>>()?
            .into_iter()
            .max();
        for (later_tier, later_pods) in &planned_tiers[index + 1..] {
            for pod in later_pods {
                let left = left_at
                    .get(pod)
                    .with_context(|| format!("{pod} never left"))?;
                ensure!(
                    last_gone.is_none_or(|gone| gone <= left),
                    "{pod} ({later_tier}) left before the {tier} were gone"
                );
            }
        }
    }
    ensure!(sim.world().audit().violations().is_empty());
    controller.stop().await
}
