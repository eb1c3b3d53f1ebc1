//! The Kubernetes helpers against kube-sim: conditions, taints, events and leader election.

use std::time::Duration;

use anyhow::{Result, ensure};
use k8s_openapi::api::core::v1::{Node, ObjectReference, Taint};
use kube::Api;
use kube::api::{ListParams, PostParams};
use kube_sim::{KubeSim, SimOptions, WorldOptions};
use nodegrace_core::k8s::conditions::{ConditionChange, ConditionSpec, upsert_node_condition};
use nodegrace_core::k8s::events::{EventPublisher, EventType};
use nodegrace_core::k8s::taints::{add_taint, remove_taint};
use nodegrace_core::leader::{LeaderConfig, Leadership};
use tokio_util::sync::CancellationToken;

async fn sim_with_node() -> Result<(KubeSim, Api<Node>)> {
    let sim = KubeSim::start(SimOptions {
        world: WorldOptions::none(),
        ..SimOptions::default()
    })
    .await?;
    let nodes: Api<Node> = Api::all(sim.client());
    nodes
        .create(
            &PostParams::default(),
            &serde_json::from_value(kube_sim::populate::node("n1"))?,
        )
        .await?;
    Ok((sim, nodes))
}

fn transition_time(node: &Node, type_: &str) -> Option<String> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)?
        .last_transition_time
        .as_ref()
        .map(|t| t.0.to_string())
}

#[tokio::test]
async fn conditions_keep_their_transition_time_unless_the_status_changes() -> Result<()> {
    let (_sim, nodes) = sim_with_node().await?;
    let spec = |status, message| ConditionSpec {
        type_: "Example",
        status,
        reason: "Because",
        message,
    };
    ensure!(
        upsert_node_condition(&nodes, "n1", &spec("True", "one")).await?
            == ConditionChange::Transitioned
    );
    let first = transition_time(&nodes.get("n1").await?, "Example");
    ensure!(
        upsert_node_condition(&nodes, "n1", &spec("True", "one")).await?
            == ConditionChange::Unchanged
    );
    ensure!(
        upsert_node_condition(&nodes, "n1", &spec("True", "two")).await?
            == ConditionChange::Updated
    );
    ensure!(transition_time(&nodes.get("n1").await?, "Example") == first);
    ensure!(
        upsert_node_condition(&nodes, "n1", &spec("False", "two")).await?
            == ConditionChange::Transitioned
    );
    // Other conditions are left alone (the patch merges by type).
    ensure!(transition_time(&nodes.get("n1").await?, "Ready").is_some());
    Ok(())
}

#[tokio::test]
async fn taints_are_added_and_removed_once() -> Result<()> {
    let (_sim, nodes) = sim_with_node().await?;
    let taint = Taint {
        key: "nodegrace.io/test".into(),
        effect: "NoExecute".into(),
        value: None,
        time_added: None,
    };
    ensure!(add_taint(&nodes, "n1", &taint).await?);
    ensure!(!add_taint(&nodes, "n1", &taint).await?, "already present");
    let taints = nodes
        .get("n1")
        .await?
        .spec
        .and_then(|s| s.taints)
        .unwrap_or_default();
    ensure!(
        taints.len() == 1 && taints[0].time_added.is_some(),
        "NoExecute taints get timeAdded: {taints:?}"
    );
    ensure!(remove_taint(&nodes, "n1", &taint).await?);
    ensure!(!remove_taint(&nodes, "n1", &taint).await?, "already absent");
    Ok(())
}

#[tokio::test]
async fn events_carry_the_programs_reporting_controller() -> Result<()> {
    let (sim, _nodes) = sim_with_node().await?;
    let publisher = EventPublisher::new(sim.client(), "graceful-shutdown-agent", "n1");
    let node = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some("n1".into()),
        uid: Some("n1".into()),
        ..ObjectReference::default()
    };
    publisher
        .publish(
            &node,
            EventType::Normal,
            "Tested",
            "Test",
            Some("it works".into()),
        )
        .await;
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::all(sim.client());
    let listed = events.list(&ListParams::default()).await?.items;
    ensure!(
        listed.iter().any(|e| e.reason.as_deref() == Some("Tested")
            && e.reporting_controller.as_deref() == Some("nodegrace-graceful-shutdown-agent")),
        "{listed:?}"
    );
    Ok(())
}

#[tokio::test]
async fn one_leader_at_a_time_and_resigning_hands_over() -> Result<()> {
    let (sim, _nodes) = sim_with_node().await?;
    let config = |identity: &str| LeaderConfig {
        namespace: "default".into(),
        lease_name: "nodegrace-test".into(),
        identity: identity.into(),
        lease_duration_seconds: 3,
        renew_margin_seconds: 1,
    };
    let a = Leadership::start(sim.client(), &config("a")).await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while !a.is_leader() {
        ensure!(tokio::time::Instant::now() < deadline, "a never led");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut b = Leadership::start(sim.client(), &config("b")).await?;
    ensure!(!b.is_leader(), "two leaders at once");
    a.resign().await;
    let stop = CancellationToken::new();
    let led = tokio::time::timeout(
        Duration::from_secs(15),
        b.run_while_leader(&stop, |acting| {
            let stop = stop.clone();
            async move {
                stop.cancel();
                acting.cancelled().await;
            }
        }),
    )
    .await;
    ensure!(led.is_ok(), "b never took over");
    Ok(())
}
