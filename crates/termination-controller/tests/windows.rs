//! Maintenance windows through the controller: its clock stands where the test puts it (the
//! cluster's time need not move), and a change to the budget wakes a pass after each move.

use crate::common::*;

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use nodegrace_core::clock::ManualClock;
use serde_json::json;
use termination_controller::api::NodeDisruptionBudget;

const NIGHTLY: &str = "nightly";

/// Moves the controller's clock and touches the budget, so a pass reads the new time.
async fn advance(
    clock: &ManualClock,
    budgets: &Api<NodeDisruptionBudget>,
    by: Duration,
) -> Result<()> {
    clock.advance(by);
    let touch = json!({"metadata": {"annotations": {"test/clock": clock_text(clock)}}});
    budgets
        .patch(NIGHTLY, &PatchParams::default(), &Patch::Merge(&touch))
        .await?;
    Ok(())
}

fn clock_text(clock: &ManualClock) -> String {
    use nodegrace_core::clock::Clock;
    clock.now().to_string()
}

async fn waits_with(client: &kube::Client, node: &str, expected: &str) -> Result<()> {
    terminating_with(client, node, "AwaitingBudget", expected).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_crd_refuses_what_its_rules_can_see_and_the_controller_the_rest() -> Result<()> {
    let sim = sim(2).await?;
    let client = sim.client();
    let all = json!({"matchLabels": {"kubernetes.io/os": "linux"}});
    let refused = [
        (
            json!({"selector": all, "maxUnavailable": 1, "windows": [{"schedule": "0 2 * *", "duration": "1h"}]}),
            "schedule must be a cron expression of five fields",
        ),
        (
            json!({"selector": all, "maxUnavailable": 1, "windows": [{"schedule": "0 2 * * *", "duration": "1 hour"}]}),
            "duration must be a duration such as",
        ),
        (
            json!({"selector": all, "maxUnavailable": 1, "maxPerWindow": 1}),
            "spec.maxPerWindow needs spec.windows",
        ),
    ];
    for (spec, expected) in refused {
        let message = format!(
            "{:#}",
            ndb(&client, "refused", spec.clone())
                .await
                .err()
                .with_context(|| format!("the CRD refuses {spec}"))?
        );
        ensure!(message.contains(expected), "{message}");
    }
    ndb(
        &client,
        "typo",
        json!({"selector": all, "maxUnavailable": 1, "windows": [{"schedule": "0 2 * * *", "duration": "1h", "timeZone": "Europe/Berln"}]}),
    )
    .await?;
    let _controller = controller(&sim, &[]).await?;
    let budgets: Api<NodeDisruptionBudget> = Api::all(client.clone());
    wait_for("the zone typo reported", || async {
        Ok(budgets.get("typo").await?.status.is_some_and(|status| {
            status.conditions.iter().any(|condition| {
                condition.reason == "InvalidSpec"
                    && condition.message.contains(
                        "spec.windows[0].timeZone: \"Europe/Berln\" is not an IANA time zone",
                    )
            })
        }))
    })
    .await
}

/// Monday 2026-11-30 in Berlin, one window a weekday night from 02:00 to 03:00 local time
/// (01:00–02:00 UTC), one disruption per window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disruptions_start_only_inside_a_window_up_to_its_cap_and_a_granted_drain_outlives_it()
-> Result<()> {
    let sim = sim(3).await?;
    let client = sim.client();
    ndb(
        &client,
        NIGHTLY,
        json!({
            "selector": {"matchLabels": {"kubernetes.io/os": "linux"}},
            "maxUnavailable": 2,
            "windows": [{"schedule": "0 2 * * 1-5", "duration": "1h", "timeZone": "Europe/Berlin"}],
            "maxPerWindow": 1,
        }),
    )
    .await?;
    // Holds node-1's drain open until the test lets it go.
    create(&client, json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "batch", "namespace": "default", "labels": {"nodegrace.io/do-not-evict": "true"}},
        "spec": {"nodeName": "node-1", "containers": [{"name": "c", "image": "app"}]}})).await?;
    let start: Timestamp = "2026-11-30T00:30:00Z".parse()?;
    let clock = ManualClock::at(start);
    let _controller =
        controller_with_clock(sim.kubeconfig_path(), &[], Arc::new(clock.clone())).await?;
    finalizer_on_every_node(&client, 3).await?;
    // A finalizer of the test's keeps node-1 visible after the controller releases it.
    let nodes: Api<Node> = Api::all(client.clone());
    let hold = json!({"metadata": {"finalizers": ["test.nodegrace.io/hold"]}});
    nodes
        .patch("node-1", &PatchParams::default(), &Patch::Strategic(&hold))
        .await?;
    let budgets: Api<NodeDisruptionBudget> = Api::all(client.clone());
    wait_for("the budget to say when the window opens", || async {
        Ok(budgets.get(NIGHTLY).await?.status.is_some_and(|status| {
            status.next_window.as_ref().map(|next| next.0)
                == Some("2026-11-30T01:00:00Z".parse().unwrap())
                && status.disruptions_allowed == 0
                && status
                    .conditions
                    .iter()
                    .any(|c| c.reason == "OutsideMaintenanceWindow")
        }))
    })
    .await?;

    // Outside the window: node-1 waits, and says until when.
    delete_node(&client, "node-1").await?;
    waits_with(
        &client,
        "node-1",
        "outside its maintenance windows; the next opens at 2026-11-30T02:00:00+01:00[Europe/Berlin]",
    )
    .await?;
    ensure!(!is_cordoned(&client, "node-1").await?, "nothing started");
    has_condition(
        &client,
        "node-1",
        ("MaintenancePlanned", "True", "MaintenanceWindow"),
    )
    .await?;

    // 02:00 in Berlin: the window opens and node-1 starts (its drain then waits for `batch`).
    advance(&clock, &budgets, Duration::from_secs(30 * 60)).await?;
    wait_for("node-1 cordoned in the window", || {
        is_cordoned(&client, "node-1")
    })
    .await?;
    for lifecycle in [
        ("MaintenancePlanned", "False", "DisruptionGranted"),
        ("DrainInProgress", "True", "NodeDeleted"),
    ] {
        has_condition(&client, "node-1", lifecycle).await?;
    }
    wait_for("the window's count", || async {
        Ok(budgets.get(NIGHTLY).await?.status.is_some_and(|status| {
            status
                .active_window
                .is_some_and(|window| window.disruptions_started == 1)
        }))
    })
    .await?;

    // The window's one disruption is spent: node-2 waits although the numbers allow it.
    delete_node(&client, "node-2").await?;
    waits_with(
        &client,
        "node-2",
        "the 1 disruption(s) its maintenance window allows have started; the next opens at 2026-12-01T02:00:00+01:00[Europe/Berlin]",
    )
    .await?;

    // 03:00: the window closes mid-drain. node-1's drain goes on; node-2 gets nothing.
    advance(&clock, &budgets, Duration::from_secs(60 * 60)).await?;
    waits_with(
        &client,
        "node-2",
        "outside its maintenance windows; the next opens at 2026-12-01T02:00:00+01:00[Europe/Berlin]",
    )
    .await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.delete("batch", &DeleteParams::default()).await?;
    wait_for(
        "node-1's granted drain to finish after the window",
        || async { Ok(!has_finalizer(&client, "node-1").await?) },
    )
    .await?;
    for lifecycle in [
        ("DrainInProgress", "False", "DrainCompleted"),
        ("Drained", "True", "DrainCompleted"),
    ] {
        has_condition(&client, "node-1", lifecycle).await?;
    }
    let release = json!({"metadata": {"finalizers": null}});
    nodes
        .patch("node-1", &PatchParams::default(), &Patch::Merge(&release))
        .await?;
    wait_for("node-1 gone", || node_gone(&client, "node-1")).await?;
    ensure!(
        !is_cordoned(&client, "node-2").await?,
        "no new grant outside the window"
    );

    // Tuesday's window starts its count afresh: node-2 goes.
    advance(&clock, &budgets, Duration::from_secs(23 * 60 * 60)).await?;
    wait_for("node-2 to go in the next window", || {
        node_gone(&client, "node-2")
    })
    .await?;
    ensure!(sim.world().audit().violations().is_empty());
    Ok(())
}

/// Waits for the node's condition `type_` to have `status` and `reason`.
async fn has_condition(
    client: &kube::Client,
    node: &str,
    (type_, status, reason): (&str, &str, &str),
) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    wait_for(&format!("{node}: {type_}={status} {reason}"), || async {
        Ok(nodes
            .get(node)
            .await?
            .status
            .and_then(|status| status.conditions)
            .is_some_and(|conditions| {
                conditions.iter().any(|condition| {
                    condition.type_ == type_
                        && condition.status == status
                        && condition.reason.as_deref() == Some(reason)
                })
            }))
    })
    .await
}

/// The last Sunday of March 2026 in Berlin: 02:00 CET jumps to 03:00 CEST, so a window
/// scheduled for 02:30 opens right after the gap, at 03:00 CEST (01:00 UTC).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_in_the_skipped_spring_hour_opens_after_the_gap() -> Result<()> {
    let sim = sim(2).await?;
    let client = sim.client();
    ndb(
        &client,
        NIGHTLY,
        json!({
            "selector": {"matchLabels": {"kubernetes.io/os": "linux"}},
            "maxUnavailable": 1,
            "windows": [{"schedule": "30 2 * * *", "duration": "1h", "timeZone": "Europe/Berlin"}],
        }),
    )
    .await?;
    let clock = ManualClock::at("2026-03-29T00:59:00Z".parse()?);
    let _controller =
        controller_with_clock(sim.kubeconfig_path(), &[], Arc::new(clock.clone())).await?;
    finalizer_on_every_node(&client, 2).await?;
    delete_node(&client, "node-1").await?;
    waits_with(
        &client,
        "node-1",
        "the next opens at 2026-03-29T03:00:00+02:00[Europe/Berlin]",
    )
    .await?;
    let budgets: Api<NodeDisruptionBudget> = Api::all(client.clone());
    advance(&clock, &budgets, Duration::from_secs(60)).await?;
    wait_for("node-1 to go in the window after the gap", || {
        node_gone(&client, "node-1")
    })
    .await?;
    let status = budgets
        .get(NIGHTLY)
        .await?
        .status
        .context("the budget's status")?;
    let window = status.active_window.context("the open window")?;
    ensure!(
        window.start.0 == "2026-03-29T01:00:00Z".parse::<Timestamp>()?
            && window.end.0 == "2026-03-29T02:00:00Z".parse::<Timestamp>()?,
        "{window:?}"
    );
    Ok(())
}

/// The window's count lives in the budget's status, not in the controller: a controller
/// restarted inside the window does not start a second disruption the cap has spent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_controller_keeps_the_windows_count() -> Result<()> {
    let sim = sim(3).await?;
    let client = sim.client();
    ndb(
        &client,
        NIGHTLY,
        json!({
            "selector": {"matchLabels": {"kubernetes.io/os": "linux"}},
            "maxUnavailable": 2,
            "windows": [{"schedule": "0 2 * * *", "duration": "1h"}],
            "maxPerWindow": 1,
        }),
    )
    .await?;
    // Holds node-1's drain open, so its grant is still in use across the restart.
    create(&client, json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "batch", "namespace": "default", "labels": {"nodegrace.io/do-not-evict": "true"}},
        "spec": {"nodeName": "node-1", "containers": [{"name": "c", "image": "app"}]}})).await?;
    let clock = ManualClock::at("2026-11-30T02:10:00Z".parse()?);
    let first = controller_with_clock(sim.kubeconfig_path(), &[], Arc::new(clock.clone())).await?;
    finalizer_on_every_node(&client, 3).await?;
    delete_node(&client, "node-1").await?;
    wait_for("node-1 cordoned in the window", || {
        is_cordoned(&client, "node-1")
    })
    .await?;
    first.stop().await?;

    let _second =
        controller_with_clock(sim.kubeconfig_path(), &[], Arc::new(clock.clone())).await?;
    delete_node(&client, "node-2").await?;
    waits_with(
        &client,
        "node-2",
        "the 1 disruption(s) its maintenance window allows have started",
    )
    .await?;
    ensure!(
        !is_cordoned(&client, "node-2").await?,
        "the restarted controller started no second disruption"
    );
    Ok(())
}
