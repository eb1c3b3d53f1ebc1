//! The Kubernetes helpers against kube-sim: conditions, taints, events and leader election.

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::{Node, Taint};
use kube::Api;
use kube::api::{ListParams, PostParams};
use kube_sim::{KubeSim, SimOptions, WorldOptions};
use nodegrace_core::k8s::cached_node::CachedNode;
use nodegrace_core::k8s::conditions::{
    ConditionChange, ConditionSpec, upsert_conditions_of, upsert_node_condition,
    upsert_node_conditions,
};
use nodegrace_core::k8s::events::{EventPublisher, EventReport};
use nodegrace_core::k8s::node_identity::{NodeIdentity, Updated};
use nodegrace_core::k8s::nodes::{node_reference, taint_with_key};
use nodegrace_core::k8s::reporter::{ApiSink, ConditionGuard, Reporter};
use nodegrace_core::k8s::taints::{add_taint, put_taint, remove_taint};
use nodegrace_testing::wait_for;

async fn sim_with_node() -> Result<(KubeSim, Api<Node>)> {
    let sim = KubeSim::start(SimOptions {
        world: WorldOptions::none(),
        ..SimOptions::default()
    })
    .await?;
    let nodes: Api<Node> = Api::all(sim.client());
    register_n1(&nodes).await?;
    Ok((sim, nodes))
}

/// Registers a Node named n1 (after one was deleted: its namesake).
async fn register_n1(nodes: &Api<Node>) -> Result<()> {
    nodes
        .create(
            &PostParams::default(),
            &serde_json::from_value(kube_sim::populate::node("n1"))?,
        )
        .await?;
    Ok(())
}

async fn identity_of_n1(nodes: &Api<Node>) -> Result<NodeIdentity> {
    NodeIdentity::of(&nodes.get("n1").await?).context("a stored node has a UID")
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
    let spec = |status, message| ConditionSpec::new("Example", status, "Because", message);
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
async fn a_nodes_conditions_are_written_together_each_under_its_own_guard() -> Result<()> {
    let (_sim, nodes) = sim_with_node().await?;
    let spec = |type_, status| ConditionSpec::new(type_, status, "Because", "m");
    let changes = upsert_node_conditions(
        &nodes,
        "n1",
        &[
            (spec("First", "True"), ConditionGuard::Always),
            // Nothing to clear: the guard refuses, nothing is added.
            (
                spec("Second", "False"),
                ConditionGuard::OnlyReplacing("True"),
            ),
            (spec("Third", "True"), ConditionGuard::Always),
        ],
    )
    .await?;
    ensure!(
        changes
            == [
                ConditionChange::Transitioned,
                ConditionChange::Unchanged,
                ConditionChange::Transitioned
            ],
        "{changes:?}"
    );
    let node = nodes.get("n1").await?;
    for (type_, present) in [
        ("First", true),
        ("Second", false),
        ("Third", true),
        ("Ready", true),
    ] {
        ensure!(
            transition_time(&node, type_).is_some() == present,
            "{type_}: {:?}",
            node.status
        );
    }
    Ok(())
}

/// A controller's condition is for one Node object: once a namesake holds the name, neither
/// the read (the UID differs) nor the patch (it names the UID, which the server will not
/// change) can put it there.
#[tokio::test]
async fn a_condition_of_one_node_object_never_lands_on_its_namesake() -> Result<()> {
    let (_sim, nodes) = sim_with_node().await?;
    let spec = ConditionSpec::new("Terminating", "True", "Because", "m");
    let first = identity_of_n1(&nodes).await?;
    let (reporter, flushed) =
        Reporter::start(ApiSink::new(nodes.clone().into_client(), "test", "t"));
    reporter.condition_of(&first, spec.clone(), ConditionGuard::Always);
    wait_for("the condition on n1", || async {
        Ok(transition_time(&nodes.get("n1").await?, "Terminating").is_some())
    })
    .await?;

    nodes
        .delete("n1", &kube::api::DeleteParams::default())
        .await?;
    register_n1(&nodes).await?;
    let changes = upsert_conditions_of(
        &nodes,
        "n1",
        Some(first.uid()),
        &[(spec, ConditionGuard::Always)],
    )
    .await?;
    ensure!(changes == [ConditionChange::Unchanged], "{changes:?}");
    // The window between the read and the patch: the server refuses the UID it was not given.
    let patch = serde_json::json!({"metadata": {"uid": first.uid()},
        "status": {"conditions": [{"type": "Terminating", "status": "True"}]}});
    let refused = nodes
        .patch_status(
            "n1",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Strategic(patch),
        )
        .await;
    ensure!(
        matches!(&refused, Err(kube::Error::Api(status)) if status.code == 422),
        "{refused:?}"
    );
    drop(reporter);
    flushed.wait().await;
    let namesake = nodes.get("n1").await?;
    ensure!(
        transition_time(&namesake, "Terminating").is_none(),
        "{:?}",
        namesake.status
    );
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
async fn the_reporter_writes_events_conditions_and_taints_through_the_api() -> Result<()> {
    let (sim, nodes) = sim_with_node().await?;
    let (reporter, writer) = Reporter::start(ApiSink {
        nodes: nodes.clone(),
        events: EventPublisher::new(sim.client(), "graceful-shutdown-agent", "n1"),
    });
    // A guarded clear where there is no condition writes nothing.
    reporter.condition(
        "n1",
        ConditionSpec::new("Example", "False", "Cleared", "x"),
        ConditionGuard::OnlyReplacing("True"),
    );
    reporter.event(EventReport::normal(
        node_reference("n1"),
        "Tested",
        "Test",
        "it works",
    ));
    let taint = Taint {
        key: "example.com/t".into(),
        effect: "NoSchedule".into(),
        ..Taint::default()
    };
    reporter.taint("n1", taint, true).wait().await;
    drop(reporter);
    writer.wait().await;
    let node = nodes.get("n1").await?;
    ensure!(taint_with_key(&node, "example.com/t").is_some(), "{node:?}");
    ensure!(
        nodegrace_core::k8s::conditions::node_condition(&node, "Example").is_none(),
        "{node:?}"
    );
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::all(sim.client());
    let listed = events.list(&ListParams::default()).await?.items;
    ensure!(
        listed.iter().any(|e| e.reason.as_deref() == Some("Tested")
            && e.reporting_controller.as_deref() == Some("nodegrace-graceful-shutdown-agent")
            && e.regarding.as_ref().and_then(|r| r.uid.as_deref()) == Some("n1")),
        "{listed:?}"
    );
    Ok(())
}

/// A failure reported again and again is one Event whose series counts the repeats, as
/// client-go's event broadcaster keeps it; a report of its own stays an Event of its own.
#[tokio::test]
async fn repeats_of_a_series_are_one_event_with_a_count() -> Result<()> {
    let (sim, _nodes) = sim_with_node().await?;
    let publisher = EventPublisher::new(sim.client(), "out-of-service-gc", "gc-0");
    let failed = |attempt: u32| {
        EventReport::warning(
            node_reference("n1"),
            "FenceFailed",
            "Fence",
            format!("the power-off request failed (attempt {attempt})"),
        )
        .in_series("n1/FenceFailed")
    };
    for attempt in 1..=3 {
        publisher.publish(&failed(attempt)).await?;
    }
    publisher
        .publish(&EventReport::normal(
            node_reference("n1"),
            "Fenced",
            "Fence",
            "off",
        ))
        .await?;
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(sim.client(), "default");
    let listed = events.list(&ListParams::default()).await?.items;
    let failures: Vec<_> = listed
        .iter()
        .filter(|event| event.reason.as_deref() == Some("FenceFailed"))
        .collect();
    ensure!(failures.len() == 1, "{failures:?}");
    let series = failures[0].series.as_ref();
    ensure!(series.map(|series| series.count) == Some(3), "{series:?}");
    ensure!(
        failures[0].note.as_deref() == Some("the power-off request failed (attempt 1)"),
        "the first note stays: {:?}",
        failures[0].note
    );
    ensure!(listed.len() == 2, "{listed:?}");
    Ok(())
}

/// The finalizer and the annotation written by UID, without a read: the Node object they
/// began on takes them, and once a namesake holds the name, neither lands on it.
#[tokio::test]
async fn a_patch_by_uid_lands_on_its_node_and_never_on_a_namesake() -> Result<()> {
    const FINALIZER: &str = "nodegrace.io/test";
    let (_sim, nodes) = sim_with_node().await?;
    let client = nodes.clone().into_client();
    let first = identity_of_n1(&nodes).await?;
    let with = first
        .patch_finalizer::<Node>(&client, FINALIZER, true)
        .await?
        .expect("n1 is this node");
    ensure!(
        with.metadata.finalizers == Some(vec![FINALIZER.to_owned()]),
        "{:?}",
        with.metadata
    );
    nodes
        .delete("n1", &kube::api::DeleteParams::default())
        .await?;
    ensure!(
        first
            .patch_finalizer::<Node>(&client, FINALIZER, false)
            .await?
            .is_some(),
        "the release lands on the deleting node itself"
    );
    wait_for("n1 gone", || async {
        Ok(nodes.get_opt("n1").await?.is_none())
    })
    .await?;
    register_n1(&nodes).await?;
    let added = first
        .patch_finalizer::<Node>(&client, FINALIZER, true)
        .await?;
    ensure!(added.is_none(), "a namesake took the finalizer: {added:?}");
    let marked = first
        .annotate::<Node>(&client, "nodegrace.io/mark", "x")
        .await?;
    ensure!(
        marked.is_none(),
        "a namesake took the annotation: {marked:?}"
    );
    let namesake = nodes.get("n1").await?;
    ensure!(
        namesake.metadata.finalizers.is_none()
            && !namesake
                .metadata
                .annotations
                .as_ref()
                .is_some_and(|annotations| annotations.contains_key("nodegrace.io/mark")),
        "the namesake was written: {:?}",
        namesake.metadata
    );
    Ok(())
}

/// A conflict on the very Node object is not a namesake: the patch is read after and tried
/// again, and while the conflicts last it fails (to be retried by the caller) instead of
/// taking the node for gone.
#[tokio::test]
async fn a_conflict_on_the_node_itself_is_retried_not_taken_for_a_namesake() -> Result<()> {
    let (sim, nodes) = sim_with_node().await?;
    let client = nodes.clone().into_client();
    let node = identity_of_n1(&nodes).await?;
    sim.faults().add_rule(kube_sim::faults::ErrorRule {
        verb: "patch".to_owned(),
        resource: "nodes".to_owned(),
        rate: 1.0,
        failure: kube_sim::faults::FailureKind::Conflict,
    });
    let refused = node
        .annotate::<Node>(&client, "nodegrace.io/mark", "x")
        .await;
    ensure!(
        matches!(&refused, Err(kube::Error::Api(status)) if status.code == 409),
        "{refused:?}"
    );
    let patches = sim.faults().failed();
    ensure!(
        patches > 1,
        "a conflict is tried again: {patches} patch(es)"
    );
    sim.faults().clear();
    let marked = node
        .annotate::<Node>(&client, "nodegrace.io/mark", "x")
        .await?;
    ensure!(
        marked.is_some_and(|node| node
            .metadata
            .annotations
            .unwrap_or_default()
            .contains_key("nodegrace.io/mark")),
        "the mark lands once the conflicts end"
    );
    Ok(())
}

/// A caller that marks the changes so far seen is woken by the next change, and not again
/// for the listing it is about to read.
#[tokio::test]
async fn a_watch_marked_seen_wakes_only_for_later_changes() -> Result<()> {
    use futures::FutureExt;
    use nodegrace_core::k8s::watched::{WatchCounters, Watched};
    let (_sim, nodes) = sim_with_node().await?;
    let watched = Watched::start(
        nodes.clone(),
        kube::runtime::watcher::Config::default(),
        WatchCounters::default(),
    );
    watched.synced().await?;
    let mut unmarked = watched.clone();
    let mut seen = watched;
    seen.mark_seen();
    ensure!(
        unmarked.changed().now_or_never().is_some(),
        "the first listing counts as a change until it is seen"
    );
    ensure!(
        seen.changed().now_or_never().is_none(),
        "nothing changed since it was marked seen"
    );
    nodes
        .create(
            &PostParams::default(),
            &serde_json::from_value(kube_sim::populate::node("n2"))?,
        )
        .await?;
    tokio::time::timeout(nodegrace_testing::WAIT, seen.changed()).await??;
    Ok(())
}

/// A node held as a `CachedNode` (its metadata, providerID, taints, cordon and conditions) is
/// written back as a patch of what it changed: what it does not hold (the node's info, its
/// capacity) stays as the API server had it.
#[tokio::test]
async fn a_cached_node_written_back_keeps_what_it_does_not_hold() -> Result<()> {
    let (_sim, nodes) = sim_with_node().await?;
    let client = nodes.clone().into_client();
    let before = nodes.get("n1").await?;
    let status = before
        .status
        .clone()
        .context("a registered node has a status")?;
    ensure!(status.node_info.is_some() && status.capacity.is_some());
    let taint = Taint {
        key: "nodegrace.io/test".to_owned(),
        effect: "NoSchedule".to_owned(),
        ..Taint::default()
    };
    let updated = identity_of_n1(&nodes)
        .await?
        .update(&client, |node: &mut CachedNode| {
            node.spec.get_or_insert_with(Default::default).unschedulable = Some(true);
            put_taint(node, &taint)
        })
        .await?;
    ensure!(matches!(updated, Updated::Written(_)), "{updated:?}");
    let after = nodes.get("n1").await?;
    let mut expected_spec = before.spec.clone().unwrap_or_default();
    expected_spec.unschedulable = Some(true);
    expected_spec
        .taints
        .get_or_insert_with(Vec::new)
        .push(taint.clone());
    ensure!(after.spec == Some(expected_spec), "spec: {:?}", after.spec);
    ensure!(after.status == before.status, "status: {:?}", after.status);
    ensure!(after.metadata.labels == before.metadata.labels);
    Ok(())
}
