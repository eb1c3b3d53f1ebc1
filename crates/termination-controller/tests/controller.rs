//! The controller end to end against kube-sim, whose kubelets, scheduler, workloads, disruption
//! controller, Eviction API, attach/detach and cloud follow the real ones: `kubectl delete
//! node` under PodDisruptionBudgets and NodeDisruptionBudgets, do-not-evict, a restart
//! mid-drain, and injected API errors.

use crate::common::*;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result, ensure};
use futures::StreamExt;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::DeleteParams;
use kube::runtime::{WatchStreamExt, watcher};
use kube_sim::faults::{ErrorRule, FailureKind};
use serde_json::json;
use termination_controller::api::NodeDisruptionBudget;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_node_is_drained_in_tiers_within_its_budgets_then_terminated_and_released()
-> Result<()> {
    let sim = sim(3).await?;
    let client = sim.client();
    web(6).create(&client).await?;
    app("api", 3)
        .budget(json!({"minAvailable": 2}))
        .create(&client)
        .await?;
    app("loose", 3).create(&client).await?;
    app("dns", 3)
        .pod(&json!({"spec": {"priorityClassName": "system-cluster-critical"}}))
        .budget(json!({"maxUnavailable": 1}))
        .create(&client)
        .await?;
    log_daemonset(&client).await?;
    // A bare pod with a claim on the node: its volume must detach before the machine goes.
    create(
        &client,
        json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "data", "namespace": "default"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}),
    )
    .await?;
    create(
        &client,
        json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "worker", "namespace": "default", "labels": {"app": "worker"}},
        "spec": {"nodeName": "node-1", "containers": [{"name": "c", "image": "app"}],
                 "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]}}),
    )
    .await?;
    for (app, count) in [
        ("web", 6),
        ("api", 3),
        ("loose", 3),
        ("dns", 3),
        ("logs", 3),
        ("worker", 1),
    ] {
        wait_ready(&client, app, count).await?;
    }
    wait_for("the worker's volume attached to node-1", || {
        has_attachment(&client, "node-1")
    })
    .await?;
    let controller = managing(&sim, &[]).await?;
    let on_node: BTreeMap<String, String> = pods_on(&client, "node-1")
        .await?
        .into_iter()
        .map(|pod| {
            let app = pod
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("app"))
                .cloned()
                .unwrap_or_default();
            (pod.metadata.name.unwrap_or_default(), app)
        })
        .collect();
    let seen = record(&client);
    let requested_at = terminate_stamp(&client, "node-1");
    delete_node(&client, "node-1").await?;
    wait_for("node-1 to be gone", || node_gone(&client, "node-1")).await?;

    let log = seen.log.lock().expect("log").clone();
    let revisions = seen.revisions.lock().expect("revisions").clone();
    let tier = |app: &str| match app {
        "logs" => 1,
        "dns" => 2,
        _ => 0,
    };
    let mut last_gone = [None::<Timestamp>; 3];
    let mut first_leaving = [None::<Timestamp>; 3];
    for (at, event) in &log {
        match event {
            Seen::Leaving(pod) if on_node.contains_key(pod) => {
                let slot = &mut first_leaving[tier(&on_node[pod])];
                slot.get_or_insert(*at);
            }
            Seen::Gone(pod) if on_node.contains_key(pod) => {
                last_gone[tier(&on_node[pod])] = Some(*at);
            }
            _ => {}
        }
    }
    for (earlier, later) in [(0, 1), (1, 2)] {
        if let (Some(gone), Some(leaving)) = (last_gone[earlier], first_leaving[later]) {
            ensure!(
                gone <= leaving,
                "tier {later} started at {leaving} before tier {earlier} was gone at {gone}: {log:?}"
            );
        }
    }
    ensure!(
        first_leaving[1].is_some(),
        "the DaemonSet pod was drained: {log:?}"
    );
    let gone: Vec<&String> = on_node.keys().collect();
    for pod in &gone {
        ensure!(
            log.iter().any(|(_, e)| e == &Seen::Gone((*pod).clone())),
            "{pod} left node-1"
        );
    }
    let violations = sim.world().audit().violations();
    ensure!(violations.is_empty(), "PDB violations: {violations:?}");
    ensure!(
        terminate_calls(&sim, "node-1") == 1,
        "terminated exactly once"
    );
    let detached = revisions
        .iter()
        .find_map(|(seen, revision)| {
            matches!(seen, Seen::AttachmentGone(name) if name.ends_with("-node-1"))
                .then_some(*revision)
        })
        .context("the worker's VolumeAttachment was deleted")?;

    // Ordered by the store's revisions: the node and pod watches deliver independently.
    let cordoned = revisions
        .get(&Seen::Cordoned("node-1".into()))
        .context("node-1 cordoned")?;
    let first_eviction = on_node
        .keys()
        .filter_map(|pod| revisions.get(&Seen::Leaving(pod.clone())))
        .min()
        .context("a pod of node-1 evicted")?;
    ensure!(
        cordoned < first_eviction,
        "cordoned (revision {cordoned}) before the first eviction (revision {first_eviction})"
    );
    // The machine went after the volume: the terminate request is stamped on the node by a
    // later write.
    let requested = requested_at
        .lock()
        .expect("stamp")
        .context("the terminate request was stamped")?;
    ensure!(
        detached < requested,
        "volume detached at revision {detached}, machine terminated at revision {requested}"
    );
    ensure!(controller.counter("instances_terminated").await? == 1);
    ensure!(controller.counter("nodes_drained").await? == 1);
    for app in ["web", "api", "dns"] {
        wait_ready(&client, app, 3).await?;
    }
    controller.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_do_not_evict_pod_holds_the_cordoned_node_until_it_is_gone() -> Result<()> {
    let sim = sim(2).await?;
    let client = sim.client();
    web(2).create(&client).await?;
    create(&client, json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "batch", "namespace": "default", "labels": {"nodegrace.io/do-not-evict": "true"}},
        "spec": {"nodeName": "node-1", "containers": [{"name": "c", "image": "app"}]}})).await?;
    wait_ready(&client, "web", 2).await?;
    let _controller = managing(&sim, &[]).await?;
    delete_node(&client, "node-1").await?;
    wait_for("node-1 to wait for its do-not-evict pod", || async {
        Ok(condition(&client, "node-1", "Terminating")
            .await?
            .is_some_and(|(reason, message)| {
                reason == "BlockedByDoNotEvict"
                    && message.contains("Pod batch: nodegrace.io/do-not-evict")
            }))
    })
    .await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let node = nodes.get("node-1").await?;
    ensure!(
        node.spec.and_then(|spec| spec.unschedulable) == Some(true),
        "cordoned while it waits"
    );
    let web_left = pods_on(&client, "node-1")
        .await?
        .iter()
        .filter(|pod| pod.metadata.deletion_timestamp.is_some())
        .count();
    ensure!(
        web_left == 0,
        "nothing is evicted while a do-not-evict pod holds the node"
    );
    ensure!(terminate_calls(&sim, "node-1") == 0);
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.delete("batch", &DeleteParams::default()).await?;
    wait_for("node-1 to be gone", || node_gone(&client, "node-1")).await?;
    ensure!(terminate_calls(&sim, "node-1") == 1);
    ensure!(sim.world().audit().violations().is_empty());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_max_unavailable_one_three_deleted_nodes_go_one_at_a_time() -> Result<()> {
    let sim = sim(5).await?;
    let client = sim.client();
    ndb(
        &client,
        "all",
        json!({"selector": {"matchLabels": {"kubernetes.io/os": "linux"}}, "maxUnavailable": 1}),
    )
    .await?;
    // Pods that take a while to stop keep each drain open long enough to overlap.
    app("web", 5)
        .pod(&json!({"metadata": {"annotations": {"sim.nodegrace.io/stop-seconds": "0.5"}}}))
        .create(&client)
        .await?;
    wait_ready(&client, "web", 5).await?;
    let _controller = managing(&sim, &[]).await?;
    // Watch the grants: never two at once.
    let budgets: Api<NodeDisruptionBudget> = Api::all(client.clone());
    let most = Arc::new(Mutex::new(0usize));
    let watched = Arc::clone(&most);
    let watch_budgets = budgets.clone();
    tokio::spawn(async move {
        let mut events =
            std::pin::pin!(watcher(watch_budgets, watcher::Config::default()).default_backoff());
        while let Some(event) = events.next().await {
            if let Ok(watcher::Event::Apply(budget)) = event {
                let grants = budget.grants().map_or(0, BTreeMap::len);
                let mut most = watched.lock().expect("most");
                *most = (*most).max(grants);
            }
        }
    });
    for node in ["node-1", "node-2", "node-3"] {
        delete_node(&client, node).await?;
    }
    wait_for("one node waiting for the budget", || async {
        Ok(condition(&client, "node-2", "Terminating")
            .await?
            .is_some_and(|(reason, message)| {
                reason == "AwaitingBudget" && message.contains("NodeDisruptionBudget all")
            })
            || condition(&client, "node-3", "Terminating")
                .await?
                .is_some_and(|(reason, _)| reason == "AwaitingBudget"))
    })
    .await?;
    for node in ["node-1", "node-2", "node-3"] {
        wait_for(&format!("{node} to be gone"), || node_gone(&client, node)).await?;
    }
    let most = *most.lock().expect("most");
    ensure!(most == 1, "at most one grant at a time, saw {most}");
    wait_for(
        "grants of gone nodes dropped and the numbers recounted",
        || async {
            let status = budgets.get("all").await?.status.unwrap_or_default();
            Ok(status.disrupted_nodes.is_empty()
                && (status.expected_nodes, status.disruptions_allowed) == (2, 1))
        },
    )
    .await?;
    for node in ["node-1", "node-2", "node-3"] {
        ensure!(terminate_calls(&sim, node) == 1, "{node} terminated once");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_budget_fails_closed_and_says_why() -> Result<()> {
    let sim = sim(2).await?;
    let client = sim.client();
    // The CRD's CEL rule refuses both limits at once…
    let refused = ndb(&client, "both", json!({"selector": {"matchLabels": {"kubernetes.io/os": "linux"}}, "minAvailable": 1, "maxUnavailable": 1})).await;
    let message = format!(
        "{:#}",
        refused
            .err()
            .context("the CRD's rule refuses both limits")?
    );
    ensure!(
        message.contains("set exactly one of spec.minAvailable and spec.maxUnavailable"),
        "{message}"
    );
    // …and the controller refuses what the schema cannot see: a percentage above 100.
    ndb(&client, "broken", json!({"selector": {"matchLabels": {"kubernetes.io/hostname": "node-1"}}, "maxUnavailable": "150%"})).await?;
    let _controller = managing(&sim, &[]).await?;
    let budgets: Api<NodeDisruptionBudget> = Api::all(client.clone());
    wait_for("the budget marked invalid", || async {
        Ok(budgets.get("broken").await?.status.is_some_and(|status| {
            status.conditions.iter().any(|c| {
                c.reason == "InvalidSpec" && c.message.contains("spec.maxUnavailable: \"150%\"")
            })
        }))
    })
    .await?;
    delete_node(&client, "node-1").await?;
    wait_for("node-1 held by the invalid budget", || async {
        Ok(condition(&client, "node-1", "Terminating")
            .await?
            .is_some_and(|(reason, message)| {
                reason == "AwaitingBudget" && message.contains("broken: the budget is invalid")
            }))
    })
    .await?;
    ensure!(!node_gone(&client, "node-1").await?);
    wait_for(
        "KEP-5683's MaintenancePlanned on the waiting node",
        || async {
            Ok(condition(&client, "node-1", "MaintenancePlanned")
                .await?
                .is_some_and(|(reason, message)| {
                    reason == "AwaitingBudget" && message.contains("broken: the budget is invalid")
                }))
        },
    )
    .await?;
    ensure!(
        terminate_calls(&sim, "node-1") == 0,
        "fails closed: nothing terminated"
    );
    let fixed = json!({"spec": {"maxUnavailable": "50%"}});
    budgets
        .patch(
            "broken",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&fixed),
        )
        .await?;
    wait_for("node-1 to go once the budget is fixed", || {
        node_gone(&client, "node-1")
    })
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_restarted_mid_drain_finishes_without_a_second_terminate() -> Result<()> {
    let slow_start =
        json!({"metadata": {"annotations": {"sim.nodegrace.io/ready-after-seconds": "0.5"}}});
    let web = app("web", 6)
        .pod(&slow_start)
        .budget(json!({"maxUnavailable": 1}));
    let sim = cluster(3).with(web).start().await?;
    let client = sim.client();
    let first = managing(&sim, &[]).await?;
    let before = pods_on(&client, "node-1").await?.len();
    delete_node(&client, "node-1").await?;
    wait_for("the drain under way", || async {
        Ok(pods_on(&client, "node-1")
            .await?
            .iter()
            .any(|pod| pod.metadata.deletion_timestamp.is_some()))
    })
    .await?;
    first.stop().await?;
    let second = controller(&sim, &[]).await?;
    wait_for("node-1 to be gone", || node_gone(&client, "node-1")).await?;
    ensure!(before >= 2, "node-1 had pods to drain ({before})");
    ensure!(
        terminate_calls(&sim, "node-1") == 1,
        "one terminate across the restart"
    );
    ensure!(sim.world().audit().violations().is_empty());
    // A restart after the request but before the machine is seen gone does not send another.
    second.stop().await?;
    let third = controller(&sim, &[]).await?;
    ensure!(terminate_calls(&sim, "node-1") == 1);
    third.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_errors_are_retried_and_nothing_is_lost() -> Result<()> {
    let sim = cluster(3).with(web(6)).start().await?;
    let client = sim.client();
    ndb(
        &client,
        "all",
        json!({"selector": {"matchLabels": {"kubernetes.io/os": "linux"}}, "maxUnavailable": 1}),
    )
    .await?;
    let _controller = managing(&sim, &[]).await?;
    for (verb, resource) in [
        ("create", "pods"),
        ("update", "nodes"),
        ("update", "nodedisruptionbudgets"),
        ("patch", "nodes"),
    ] {
        sim.faults().add_rule(ErrorRule {
            verb: verb.to_owned(),
            resource: resource.to_owned(),
            rate: 0.3,
            failure: FailureKind::InternalError,
        });
    }
    delete_node(&client, "node-1").await?;
    wait_for("node-1 to be gone despite errors", || {
        node_gone(&client, "node-1")
    })
    .await?;
    sim.faults().clear();
    ensure!(terminate_calls(&sim, "node-1") == 1);
    ensure!(sim.world().audit().violations().is_empty());
    wait_ready(&client, "web", 6).await?;
    Ok(())
}
