//! The agent end to end: kube-sim for the Leases and the node, a real elogind for the block.

use std::time::Duration;

use anyhow::{Result, bail, ensure};
use clap::Parser;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use kube_sim::{KubeSim, SimOptions};
use logind_harness::{LogindHarness, ScenarioOptions};
use nodegrace_testing::cluster::node_condition;
use nodegrace_testing::{ProgramUnderTest, command_line, wait_for};
use serde_json::json;
use shutdown_inhibitor_agent::agent::INHIBITOR_WHO;
use shutdown_inhibitor_agent::app::{self, PROGRAM};
use shutdown_inhibitor_agent::cli::Args;
use shutdown_inhibitor_agent::decide::ROOT_PASSES;

const NODE: &str = "node-0";
const METRICS_PREFIX: &str = "nodegrace_shutdown_inhibitor_agent";

struct Setup {
    sim: KubeSim,
    client: Client,
    logind: LogindHarness,
    agent: ProgramUnderTest,
}

async fn setup() -> Result<Option<Setup>> {
    setup_with(&[]).await
}

/// `flags` are added to the agent's command line.
async fn setup_with(flags: &[&str]) -> Result<Option<Setup>> {
    setup_started(flags, true).await
}

/// [`setup_with`]; `ready`: whether to wait for the agent's readiness.
async fn setup_started(flags: &[&str], ready: bool) -> Result<Option<Setup>> {
    let Some(logind) = LogindHarness::start_or_skip(ScenarioOptions::default()).await? else {
        return Ok(None);
    };
    let sim = KubeSim::start(SimOptions {
        nodes: 1,
        ..SimOptions::default()
    })
    .await?;
    let client = sim.client();
    for namespace in ["team-a", "team-b"] {
        Api::<Namespace>::all(client.clone())
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": namespace}}))?,
            )
            .await?;
    }
    let defaults = [
        format!("--node-name={NODE}"),
        format!("--kubeconfig={}", sim.kubeconfig_path().display()),
        format!("--dbus-address={}", logind.bus_address()),
        "--admin-listen=127.0.0.1:0".to_owned(),
    ];
    let args = Args::try_parse_from(command_line(PROGRAM, &defaults, flags))?;
    let start = |stop| app::start(args, stop);
    let agent = if ready {
        ProgramUnderTest::start(METRICS_PREFIX, start).await?
    } else {
        ProgramUnderTest::start_unready(METRICS_PREFIX, start).await?
    };
    let setup = Setup {
        sim,
        client,
        logind,
        agent,
    };
    Ok(Some(setup))
}

async fn http(setup: &Setup, path: &str) -> Result<String> {
    setup.agent.admin().get(path).await
}

/// A counter or gauge value (they are whole numbers here); -1 when not exported.
async fn metric(setup: &Setup, name: &str) -> Result<i64> {
    setup.agent.gauge(name).await
}

async fn our_blocks(setup: &Setup) -> Result<Vec<String>> {
    Ok(setup
        .logind
        .list_inhibitors()
        .await?
        .into_iter()
        .filter(|row| row.1 == INHIBITOR_WHO && row.3 == "block")
        .map(|row| row.2)
        .collect())
}

async fn condition(setup: &Setup) -> Result<Option<(String, String, String, String)>> {
    Ok(node_condition(&setup.client, NODE, "ShutdownInhibited")
        .await?
        .map(|seen| (seen.status, seen.reason, seen.message, seen.since)))
}

async fn take_lease(setup: &Setup, namespace: &str, name: &str, holder: &str) -> Result<()> {
    take_lease_at(setup, namespace, name, holder, jiff::Timestamp::now()).await
}

async fn take_lease_at(
    setup: &Setup,
    namespace: &str,
    name: &str,
    holder: &str,
    acquired: jiff::Timestamp,
) -> Result<()> {
    let lease: Lease = serde_json::from_value(
        json!({"metadata": {"name": name}, "spec": {"holderIdentity": holder, "acquireTime": acquired.strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()}}),
    )?;
    Api::<Lease>::namespaced(setup.client.clone(), namespace)
        .create(&PostParams::default(), &lease)
        .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_stack_into_one_block_and_the_condition_follows() -> Result<()> {
    let Some(setup) = setup().await? else {
        return Ok(());
    };
    wait_for("the condition False", || async {
        Ok(condition(&setup)
            .await?
            .is_some_and(|c| c.0 == "False" && c.1 == "NoActiveLeases"))
    })
    .await?;

    take_lease(&setup, "team-a", NODE, "backup").await?;
    wait_for("the block", || async {
        Ok(our_blocks(&setup).await?.len() == 1)
    })
    .await?;
    wait_for("the condition True", || async {
        Ok(condition(&setup).await?.is_some_and(|c| {
            c.0 == "True" && c.1 == "ActiveLeases" && c.2 == format!("team-a/backup{ROOT_PASSES}")
        }))
    })
    .await?;
    let since = condition(&setup).await?.unwrap().3;

    take_lease(&setup, "team-b", NODE, "upgrade").await?;
    wait_for("both holders listed", || async {
        Ok(condition(&setup)
            .await?
            .is_some_and(|c| c.2 == format!("team-a/backup, team-b/upgrade{ROOT_PASSES}")))
    })
    .await?;
    wait_for("still exactly one block", || async {
        Ok(our_blocks(&setup).await? == ["Active Leases: team-a/backup, team-b/upgrade"])
    })
    .await?;
    ensure!(
        condition(&setup).await?.unwrap().3 == since,
        "lastTransitionTime moved without a transition"
    );

    let a: Api<Lease> = Api::namespaced(setup.client.clone(), "team-a");
    a.patch(
        NODE,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"holderIdentity": null}})),
    )
    .await?;
    wait_for("only team-b listed", || async {
        Ok(condition(&setup)
            .await?
            .is_some_and(|c| c.2 == format!("team-b/upgrade{ROOT_PASSES}")))
    })
    .await?;
    ensure!(
        our_blocks(&setup).await?.len() == 1,
        "still blocked by team-b"
    );

    Api::<Lease>::namespaced(setup.client.clone(), "team-b")
        .delete(NODE, &DeleteParams::default())
        .await?;
    wait_for("the block to go", || async {
        Ok(our_blocks(&setup).await?.is_empty())
    })
    .await?;
    wait_for("the condition False", || async {
        Ok(condition(&setup).await?.is_some_and(|c| c.0 == "False"))
    })
    .await?;
    ensure!(metric(&setup, "transitions_total").await? == 2);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_nodes_leases_never_reach_the_agent() -> Result<()> {
    let Some(setup) = setup().await? else {
        return Ok(());
    };
    let before = metric(&setup, "lease_watch_events_total").await?;
    for index in 0..20 {
        take_lease(&setup, "team-a", &format!("other-{index}"), "someone").await?;
    }
    // A Lease for this node afterwards proves the watch is live and in order.
    take_lease(&setup, "team-b", NODE, "marker").await?;
    wait_for("the marker", || async {
        Ok(our_blocks(&setup).await?.len() == 1)
    })
    .await?;
    ensure!(
        metric(&setup, "lease_watch_events_total").await? == before + 1,
        "other nodes' leases were delivered"
    );
    ensure!(our_blocks(&setup).await?.len() == 1);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_outage_keeps_the_block() -> Result<()> {
    let Some(setup) = setup().await? else {
        return Ok(());
    };
    take_lease(&setup, "team-a", NODE, "backup").await?;
    wait_for("the block", || async {
        Ok(our_blocks(&setup).await?.len() == 1)
    })
    .await?;
    let restarts = metric(&setup, "watch_restarts_total").await?;
    setup.sim.faults().outage(Duration::from_secs(30));
    wait_for("the watch to notice the outage", || async {
        Ok(metric(&setup, "watch_restarts_total").await? > restarts)
    })
    .await?;
    ensure!(
        our_blocks(&setup).await?.len() == 1,
        "the block must survive the outage"
    );
    setup.sim.faults().end_outage();
    Api::<Lease>::namespaced(setup.client.clone(), "team-a")
        .delete(NODE, &DeleteParams::default())
        .await?;
    wait_for("the resync to release", || async {
        Ok(our_blocks(&setup).await?.is_empty())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_logind_restart_gets_the_block_back() -> Result<()> {
    let Some(mut setup) = setup().await? else {
        return Ok(());
    };
    take_lease(&setup, "team-a", NODE, "backup").await?;
    wait_for("the block", || async {
        Ok(our_blocks(&setup).await?.len() == 1)
    })
    .await?;
    let transitions = metric(&setup, "transitions_total").await?;
    // elogind restores the block from /run/systemd/inhibit while the agent's fd is open; the
    // agent takes a fresh one and closes the old: one block, and none left once released.
    setup.logind.restart().await?;
    wait_for("the block taken again after the restart", || async {
        Ok(metric(&setup, "transitions_total").await? > transitions
            && metric(&setup, "block_inhibitor_held").await? == 1)
    })
    .await?;
    let one_block = wait_for("exactly one block", || async {
        Ok(our_blocks(&setup).await?.len() == 1)
    })
    .await;
    if let Err(error) = one_block {
        // Seen once in CI: say which side kept or lost a block, for the next look.
        bail!(
            "{error}; logind lists {:?}; the agent reports block_inhibitor_held={}",
            setup.logind.list_inhibitors().await?,
            metric(&setup, "block_inhibitor_held").await?
        );
    }
    Api::<Lease>::namespaced(setup.client.clone(), "team-a")
        .delete(NODE, &DeleteParams::default())
        .await?;
    wait_for("no block once the Lease is gone", || async {
        Ok(our_blocks(&setup).await?.is_empty())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_shutdown_starts_lease_changes_are_ignored() -> Result<()> {
    let Some(setup) = setup().await? else {
        return Ok(());
    };
    take_lease(&setup, "team-a", NODE, "backup").await?;
    wait_for("the block", || async {
        Ok(our_blocks(&setup).await?.len() == 1)
    })
    .await?;
    // Root's PowerOff overrides block inhibitors; logind announces the shutdown.
    setup.logind.power_off().await?;
    setup
        .logind
        .wait_for_shutdown_hook(Duration::from_secs(20))
        .await?;
    let events = metric(&setup, "lease_watch_events_total").await?;
    Api::<Lease>::namespaced(setup.client.clone(), "team-a")
        .delete(NODE, &DeleteParams::default())
        .await?;
    wait_for("the deletion to reach the agent", || async {
        Ok(metric(&setup, "lease_watch_events_total").await? > events)
    })
    .await?;
    // Ignored: the block stays and the condition still says True.
    wait_for("the condition to stay True", || async {
        Ok(condition(&setup).await?.is_some_and(|c| c.0 == "True"))
    })
    .await?;
    ensure!(our_blocks(&setup).await?.len() == 1);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disabled_it_holds_nothing_reports_not_ready_and_says_why() -> Result<()> {
    let Some(setup) = setup_started(&["--enabled=false"], false).await? else {
        return Ok(());
    };
    take_lease(&setup, "default", NODE, "backup").await?;
    wait_for("the disabled Event", || async {
        let events: Api<k8s_openapi::api::events::v1::Event> = Api::all(setup.client.clone());
        Ok(events
            .list(&kube::api::ListParams::default())
            .await?
            .items
            .iter()
            .any(|e| e.reason.as_deref() == Some("ShutdownInhibitorDisabled")))
    })
    .await?;
    ensure!(http(&setup, "/readyz").await?.starts_with("HTTP/1.1 503"));
    ensure!(our_blocks(&setup).await?.is_empty());
    Ok(())
}

/// The Events with `reason`, as (kind of the object they regard, note). Each must be an Event
/// of its own: a series would hide the notes of its repeats.
async fn events(setup: &Setup, reason: &str) -> Result<Vec<(String, String)>> {
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::all(setup.client.clone());
    let mut found = Vec::new();
    for event in events.list(&kube::api::ListParams::default()).await?.items {
        if event.reason.as_deref() == Some(reason) {
            ensure!(
                event.series.is_none(),
                "{reason} folded into a series: {event:?}"
            );
            let kind = event.regarding.and_then(|r| r.kind).unwrap_or_default();
            found.push((kind, event.note.unwrap_or_default()));
        }
    }
    found.sort();
    Ok(found)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_time_in_the_future_is_age_zero_and_warned_once() -> Result<()> {
    let Some(setup) = setup_with(&["--alert-timeout=1s"]).await? else {
        return Ok(());
    };
    let ahead = jiff::Timestamp::now() + jiff::SignedDuration::from_hours(1);
    take_lease_at(&setup, "team-a", NODE, "skewed", ahead).await?;
    wait_for("the block", || async {
        Ok(our_blocks(&setup).await?.len() == 1)
    })
    .await?;
    wait_for("the clock-skew Warning", || async {
        Ok(!events(&setup, "LeaseAcquireTimeInFuture").await?.is_empty())
    })
    .await?;
    ensure!(metric(&setup, "oldest_active_lease_age_seconds").await? == 0);
    ensure!(metric(&setup, "alerts_total").await? == 0);
    let warned = events(&setup, "LeaseAcquireTimeInFuture").await?;
    ensure!(warned.len() == 1 && warned[0].0 == "Lease", "{warned:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_shutdown_starts_no_lease_is_reported_as_blocking() -> Result<()> {
    let Some(setup) = setup_with(&["--alert-timeout=1s"]).await? else {
        return Ok(());
    };
    setup.logind.power_off().await?;
    wait_for("the agent to see the shutdown", || async {
        Ok(metric(&setup, "shutdown_in_progress").await? == 1)
    })
    .await?;
    let an_hour_ago = jiff::Timestamp::now() - jiff::SignedDuration::from_hours(1);
    take_lease_at(&setup, "team-a", NODE, "backup", an_hour_ago).await?;
    // Two ticks that saw the Lease: the alerts of the first were decided before the second.
    let first_age = std::sync::atomic::AtomicI64::new(0);
    wait_for("a tick that saw the Lease", || async {
        let age = metric(&setup, "oldest_active_lease_age_seconds").await?;
        first_age.store(age, std::sync::atomic::Ordering::Relaxed);
        Ok(age >= 3000)
    })
    .await?;
    let first_age = first_age.into_inner();
    wait_for("the next tick", || async {
        Ok(metric(&setup, "oldest_active_lease_age_seconds").await? > first_age)
    })
    .await?;
    ensure!(metric(&setup, "alerts_total").await? == 0);
    ensure!(events(&setup, "ShutdownInhibitedTooLong").await?.is_empty());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_alert_due_during_an_api_outage_is_published_once_after_it() -> Result<()> {
    let Some(setup) = setup_with(&["--alert-timeout=5s"]).await? else {
        return Ok(());
    };
    take_lease(&setup, "team-a", NODE, "backup").await?;
    wait_for("the block", || async {
        Ok(our_blocks(&setup).await?.len() == 1)
    })
    .await?;
    setup.sim.faults().outage(Duration::from_secs(120));
    wait_for("the alert to fall due", || async {
        Ok(metric(&setup, "alerts_total").await? == 1)
    })
    .await?;
    ensure!(
        setup.sim.faults().in_outage(),
        "the alert fell due after the outage"
    );
    setup.sim.faults().end_outage();
    wait_for("the alert Events", || async {
        Ok(events(&setup, "ShutdownInhibitedTooLong").await?.len() >= 2)
    })
    .await?;
    let alerts = events(&setup, "ShutdownInhibitedTooLong").await?;
    let kinds: Vec<&str> = alerts.iter().map(|(kind, _)| kind.as_str()).collect();
    ensure!(kinds == ["Lease", "Node"], "{alerts:?}");
    Ok(())
}

/// Readiness has one meaning: the agent can do its job now. Driven through a logind stand-in,
/// so it runs without root; the real-elogind tests above prove the locks themselves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_ready_while_logind_is_gone_or_refuses_a_needed_block() -> Result<()> {
    use nodegrace_logind::ShutdownEvent;
    use nodegrace_testing::FakeLogind;

    let sim = KubeSim::start(SimOptions {
        nodes: 1,
        ..SimOptions::default()
    })
    .await?;
    let client = sim.client();
    let mut args = Args::try_parse_from([
        "shutdown-inhibitor-agent".to_owned(),
        format!("--node-name={NODE}"),
        format!("--kubeconfig={}", sim.kubeconfig_path().display()),
        "--admin-listen=127.0.0.1:0".to_owned(),
    ])?;
    let logind = FakeLogind::new(Duration::from_secs(5));
    args.agent.logind.instead_of_bus = Some(logind.shared());
    let agent =
        ProgramUnderTest::start_unready(METRICS_PREFIX, |stop| app::start(args, stop)).await?;
    let admin = agent.admin();
    let wait = |what: &'static str, ready: bool| {
        wait_for(
            what,
            move || async move { Ok(admin.is_ready().await? == ready) },
        )
    };
    wait("ready with no Lease and no lock", true).await?;

    logind.refuse_inhibit(true);
    let lease: Lease = serde_json::from_value(json!({
        "metadata": {"name": NODE, "namespace": "default"},
        "spec": {"holderIdentity": "backup", "acquireTime": "2026-01-01T00:00:00.000000Z"},
    }))?;
    Api::<Lease>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &lease)
        .await?;
    wait("not ready: a Lease asks for a block logind refuses", false).await?;
    logind.refuse_inhibit(false);
    wait("ready once the retried block is held", true).await?;
    ensure!(logind.held().len() == 1, "{:?}", logind.held());

    logind.send(ShutdownEvent::LogindStopped);
    wait("not ready while logind is gone", false).await?;
    logind.send(ShutdownEvent::LogindStarted);
    wait("ready when logind is back and the block taken again", true).await?;
    ensure!(
        logind.held().len() == 1,
        "one block after the restart: {:?}",
        logind.held()
    );
    Ok(())
}

/// `--lease-namespaces` and `--lease-selector` are the security boundary: a Lease outside
/// them never blocks, whoever created it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_leases_in_the_allowed_namespaces_with_the_selected_labels_block() -> Result<()> {
    let Some(setup) = setup_with(&[
        "--lease-namespaces=team-a",
        "--lease-selector=nodegrace.io/inhibit=true",
    ])
    .await?
    else {
        return Ok(());
    };
    // Labelled, in a namespace off the list: delivered by the watch, ignored.
    take_lease(&setup, "team-b", NODE, "intruder").await?;
    label_lease(&setup, "team-b").await?;
    // In the listed namespace, unlabelled: not even delivered.
    take_lease(&setup, "team-a", NODE, "backup").await?;
    ensure!(our_blocks(&setup).await?.is_empty());
    // Labelled now: it blocks, and only it.
    label_lease(&setup, "team-a").await?;
    wait_for("the listed, labelled Lease's block", || async {
        Ok(our_blocks(&setup).await? == ["Active Leases: team-a/backup"])
    })
    .await?;
    wait_for("the condition naming it alone", || async {
        Ok(condition(&setup)
            .await?
            .is_some_and(|c| c.0 == "True" && c.2 == format!("team-a/backup{ROOT_PASSES}")))
    })
    .await?;
    Ok(())
}

async fn label_lease(setup: &Setup, namespace: &str) -> Result<()> {
    Api::<Lease>::namespaced(setup.client.clone(), namespace)
        .patch(
            NODE,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"nodegrace.io/inhibit": "true"}}})),
        )
        .await?;
    Ok(())
}

#[test]
fn a_bad_lease_selector_names_the_flag() {
    let args = Args::try_parse_from([
        "shutdown-inhibitor-agent",
        "--node-name=n",
        "--lease-selector=a in b",
    ])
    .unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let error = runtime
        .block_on(app::start(args, tokio_util::sync::CancellationToken::new()))
        .err()
        .map(|error| format!("{error:#}"))
        .unwrap_or_default();
    assert!(error.starts_with("--lease-selector: "), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn where_root_passes_a_block_the_agent_says_so_once_and_in_the_condition() -> Result<()> {
    let Some(setup) = setup().await? else {
        return Ok(());
    };
    // The test command's elogind is 246: root's PowerOff goes through a block lock
    // (tests/block_semantics.rs shows it).
    ensure!(metric(&setup, "root_passes_block").await? == 1);
    wait_for("the BlockBypassableByRoot Warning", || async {
        Ok(events(&setup, "BlockBypassableByRoot")
            .await?
            .iter()
            .any(|(kind, note)| kind == "Node" && note.contains("--check-inhibitors=yes")))
    })
    .await?;
    take_lease(&setup, "team-a", NODE, "backup").await?;
    wait_for("the condition to say root passes", || async {
        Ok(condition(&setup)
            .await?
            .is_some_and(|c| c.0 == "True" && c.2.contains("root can still shut down")))
    })
    .await?;
    ensure!(
        events(&setup, "BlockBypassableByRoot").await?.len() == 1,
        "said once"
    );
    Ok(())
}
