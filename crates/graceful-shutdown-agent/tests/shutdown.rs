//! The agent end to end: kube-sim for the cluster (with its simulated kubelet) and a real
//! elogind for the shutdown.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, ensure};
use clap::Parser;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use graceful_shutdown_agent::agent::INHIBITOR_WHO;
use graceful_shutdown_agent::app::{self, PROGRAM};
use graceful_shutdown_agent::cli::Args;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::PostParams;
use kube::runtime::watcher;
use kube::{Api, Client};
use kube_sim::{KubeSim, SimOptions};
use logind_harness::{LogindHarness, ScenarioOptions};
use nodegrace_logind::{InhibitMode, Logind, ShutdownEvent};
use nodegrace_testing::{
    Admin, ProgramUnderTest, WithExtraEvents, cluster, command_line, wait_for,
};
use serde_json::json;

const NODE: &str = "node-a";
const METRICS_PREFIX: &str = "nodegrace_graceful_shutdown_agent";

struct Cluster {
    sim: KubeSim,
    client: Client,
}

async fn cluster() -> Result<Cluster> {
    let sim = KubeSim::start(SimOptions::default()).await?;
    let client = sim.client();
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .create(
            &PostParams::default(),
            &serde_json::from_value(kube_sim::populate::node(NODE))?,
        )
        .await?;
    let classes: Api<k8s_openapi::api::scheduling::v1::PriorityClass> = Api::all(client.clone());
    for (name, value) in [("low", 0), ("mid", 1000), ("high", 100_000)] {
        classes
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": name}, "value": value}))?,
            )
            .await?;
    }
    Ok(Cluster { sim, client })
}

/// A pod on the node with a priority class, a termination grace period and a stop time.
async fn pod(
    cluster: &Cluster,
    name: &str,
    class: &str,
    grace: i64,
    stop_seconds: f64,
    finalizer: bool,
) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), "default");
    let mut pod = json!({
        "metadata": {"name": name, "annotations": {"sim.nodegrace.io/stop-seconds": stop_seconds.to_string()}},
        "spec": {"nodeName": NODE, "priorityClassName": class, "terminationGracePeriodSeconds": grace, "containers": [{"name": "c", "image": "i"}]},
    });
    if finalizer {
        pod["metadata"]["finalizers"] = json!(["test.nodegrace.io/hold"]);
    }
    pods.create(&PostParams::default(), &serde_json::from_value(pod)?)
        .await?;
    Ok(())
}

/// What happened to each pod, as a watch saw it.
#[derive(Debug, Clone, Default)]
struct PodFate {
    deletion_seen: Option<Instant>,
    grace: Option<i64>,
    removed: Option<Instant>,
    disruption_target: Option<String>,
}

type Fates = Arc<Mutex<HashMap<String, PodFate>>>;

/// Until the recorder shows `seen` of every pod in `names`: its watch may deliver the last
/// of them a moment after the shutdown hook ran.
async fn until_fates(fates: &Fates, names: &[&str], seen: fn(&PodFate) -> bool) -> Result<()> {
    wait_for(&format!("the watch to see {names:?}"), || async {
        let fates = fates.lock().unwrap();
        Ok(names.iter().all(|name| fates.get(*name).is_some_and(seen)))
    })
    .await
}

fn record_fates(client: &Client) -> Fates {
    let fates: Fates = Arc::default();
    let pods: Api<Pod> = Api::all(client.clone());
    let sink = Arc::clone(&fates);
    tokio::spawn(async move {
        let mut events = watcher(pods, watcher::Config::default()).boxed();
        while let Ok(Some(event)) = events.try_next().await {
            let now = Instant::now();
            let mut fates = sink.lock().unwrap();
            match event {
                watcher::Event::Apply(pod) | watcher::Event::InitApply(pod) => {
                    let fate = fates
                        .entry(pod.metadata.name.clone().unwrap_or_default())
                        .or_default();
                    if pod.metadata.deletion_timestamp.is_some() && fate.deletion_seen.is_none() {
                        fate.deletion_seen = Some(now);
                        fate.grace = pod.metadata.deletion_grace_period_seconds;
                    }
                    let target = pod
                        .status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .and_then(|c| c.iter().find(|c| c.type_ == "DisruptionTarget"))
                        .and_then(|c| c.reason.clone());
                    if target.is_some() {
                        fate.disruption_target = target;
                    }
                }
                watcher::Event::Delete(pod) => {
                    fates
                        .entry(pod.metadata.name.clone().unwrap_or_default())
                        .or_default()
                        .removed = Some(now);
                }
                _ => {}
            }
        }
    });
    fates
}

/// The agent under test, with the state directory it keeps its shutdown record in.
struct Agent {
    program: ProgramUnderTest,
    _state: tempfile::TempDir,
}

impl Agent {
    fn admin(&self) -> Admin {
        self.program.admin()
    }
}

async fn start_agent(
    cluster: &Cluster,
    logind: &LogindHarness,
    priorities: &str,
    drop_in_dir: Option<&std::path::Path>,
    extra: Option<BoxStream<'static, ShutdownEvent>>,
) -> Result<Agent> {
    let agent =
        start_agent_with_state(cluster, logind, priorities, drop_in_dir, extra, None, &[]).await?;
    wait_for("the agent's delay inhibitor", || async {
        Ok(logind
            .list_inhibitors()
            .await?
            .iter()
            .any(|row| row.1 == INHIBITOR_WHO && row.3 == "delay"))
    })
    .await?;
    Ok(agent)
}

/// `record`: a shutdown record left by an earlier run of the agent; `flags` are added last.
async fn start_agent_with_state(
    cluster: &Cluster,
    logind: &LogindHarness,
    priorities: &str,
    drop_in_dir: Option<&std::path::Path>,
    extra: Option<BoxStream<'static, ShutdownEvent>>,
    record: Option<serde_json::Value>,
    flags: &[&str],
) -> Result<Agent> {
    let state = tempfile::tempdir()?;
    if let Some(record) = record {
        std::fs::write(
            state.path().join("graceful-shutdown-agent.json"),
            record.to_string(),
        )?;
    }
    let boot_id = state.path().join("boot_id");
    std::fs::write(&boot_id, "boot-1\n")?;
    let drop_in = drop_in_dir.map_or_else(|| logind.drop_in_dir(), std::path::Path::to_path_buf);
    let defaults = [
        format!("--node-name={NODE}"),
        format!("--kubeconfig={}", cluster.sim.kubeconfig_path().display()),
        format!("--dbus-address={}", logind.bus_address()),
        format!("--state-dir={}", state.path().display()),
        format!("--boot-id-file={}", boot_id.display()),
        format!("--logind-drop-in-dir={}", drop_in.display()),
        "--admin-listen=127.0.0.1:0".to_owned(),
        format!("--shutdown-grace-period-by-pod-priority={priorities}"),
        "--logind-reload-timeout=1s".to_owned(),
    ];
    let mut args = Args::try_parse_from(command_line(PROGRAM, &defaults, flags))?;
    if let Some(extra) = extra {
        // elogind cannot be made to send some events; they are merged into the real ones.
        args.agent.logind.instead_of_bus = Some(WithExtraEvents::wrap(
            Arc::new(Logind::connect_to(logind.bus_address()).await?),
            extra,
        ));
    }
    Ok(Agent {
        program: ProgramUnderTest::start_unready(METRICS_PREFIX, |stop| app::start(args, stop))
            .await?,
        _state: state,
    })
}

async fn metrics(agent: &Agent) -> Result<String> {
    agent.admin().get("/metrics").await
}

async fn node(cluster: &Cluster) -> Result<Node> {
    Ok(Api::<Node>::all(cluster.client.clone()).get(NODE).await?)
}

fn condition(node: &Node, type_: &str) -> Option<(String, String)> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone().unwrap_or_default()))
}

fn tainted(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| {
            t.iter()
                .any(|t| t.key == "nodegrace.io/shutting-down" && t.effect == "NoSchedule")
        })
}

async fn event_reasons(cluster: &Cluster) -> Result<Vec<String>> {
    cluster::event_reasons(&cluster.client, NODE).await
}

/// The notes of the Events with `reason` about the node, each Event once; an Event folded into
/// a series would hide the notes of its repeats, so a series fails the test.
async fn notes(cluster: &Cluster, reason: &str) -> Result<Vec<String>> {
    let mut notes = Vec::new();
    for event in cluster::events_about(&cluster.client, NODE).await? {
        if event.reason.as_deref() == Some(reason) {
            ensure!(
                event.series.is_none(),
                "{reason} folded into a series: {event:?}"
            );
            notes.push(event.message.unwrap_or_default());
        }
    }
    Ok(notes)
}

async fn readyz(agent: &Agent) -> Result<bool> {
    agent.admin().is_ready().await
}

async fn logind(max_delay_seconds: u64) -> Result<Option<LogindHarness>> {
    Ok(LogindHarness::start_or_skip(ScenarioOptions {
        inhibit_delay_max: Duration::from_secs(max_delay_seconds),
        ..ScenarioOptions::default()
    })
    .await?)
}

/// When the API server took the last delete of pod `name`, by its audit.
fn last_delete(cluster: &Cluster, name: &str) -> Result<SystemTime> {
    let at = cluster
        .sim
        .world()
        .audit()
        .deletions()
        .into_iter()
        .filter(|deletion| deletion.resource == "pods" && deletion.name == name)
        .map(|deletion| deletion.at)
        .next_back()
        .with_context(|| format!("no delete of {name} in the audit"))?;
    let at: jiff::Timestamp = at.parse()?;
    Ok(SystemTime::from(at))
}

fn hook_instant(hook: SystemTime, reference: (Instant, SystemTime)) -> Instant {
    let (instant, wall) = reference;
    match hook.duration_since(wall) {
        Ok(after) => instant + after,
        Err(before) => instant.checked_sub(before.duration()).unwrap_or(instant),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_stop_by_priority_group_then_shutdown_proceeds() -> Result<()> {
    // logind allows 1 s; the agent must raise it to the groups' 9 s through the drop-in.
    let Some(logind) = logind(1).await? else {
        return Ok(());
    };
    let cluster = cluster().await?;
    pod(&cluster, "low-a", "low", 30, 0.3, false).await?;
    pod(&cluster, "low-b", "low", 2, 0.5, false).await?;
    pod(&cluster, "mid-a", "mid", 30, 0.4, false).await?;
    pod(&cluster, "high-a", "high", 30, 0.2, false).await?;
    let fates = record_fates(&cluster.client);
    let agent = start_agent(&cluster, &logind, "0=3,1000=3,100000=3", None, None).await?;
    // The lock comes first, with logind's 1 s; the budget rises once logind applies the drop-in.
    wait_for("the 9 s budget", || async {
        Ok(metrics(&agent)
            .await?
            .contains("graceful_shutdown_budget_seconds 9.0"))
    })
    .await?;
    let drop_in = std::fs::read_to_string(logind.drop_in_dir().join("99-nodegrace.conf"))?;
    ensure!(drop_in.contains("InhibitDelayMaxSec=9"), "{drop_in}");

    let powered_off = (Instant::now(), SystemTime::now());
    logind.power_off().await?;
    let hook = hook_instant(
        logind
            .wait_for_shutdown_hook(Duration::from_secs(30))
            .await?,
        powered_off,
    );

    until_fates(&fates, &["low-a", "low-b", "mid-a", "high-a"], |fate| {
        fate.removed.is_some()
    })
    .await?;
    let fates = fates.lock().unwrap().clone();
    let fate = |name: &str| {
        fates
            .get(name)
            .cloned()
            .with_context(|| format!("no record of {name}"))
    };
    let (low_a, low_b, mid, high) = (
        fate("low-a")?,
        fate("low-b")?,
        fate("mid-a")?,
        fate("high-a")?,
    );
    for (name, f) in [
        ("low-a", &low_a),
        ("low-b", &low_b),
        ("mid-a", &mid),
        ("high-a", &high),
    ] {
        ensure!(f.removed.is_some(), "{name} was not removed: {f:?}");
        ensure!(
            f.disruption_target.as_deref() == Some("TerminationByNodeShutdown"),
            "{name}: {f:?}"
        );
    }
    // Grace = min(the pod's own, its group's period).
    ensure!(
        low_a.grace == Some(3)
            && low_b.grace == Some(2)
            && mid.grace == Some(3)
            && high.grace == Some(3),
        "{fates:?}"
    );
    // Group order: a group starts only once the previous one's pods are gone.
    let last_low = low_a.removed.max(low_b.removed).unwrap();
    ensure!(
        mid.deletion_seen.unwrap() >= last_low,
        "mid started before low finished: {fates:?}"
    );
    ensure!(
        high.deletion_seen.unwrap() >= mid.removed.unwrap(),
        "high started before mid finished: {fates:?}"
    );
    // Shutdown proceeds right after the last pod, not at the end of the 9 s budget. The pod's
    // end is the API server's (its last delete, in kube-sim's audit), not when the judge's
    // watch got to it.
    let last_pod = hook_instant(last_delete(&cluster, "high-a")?, powered_off);
    ensure!(
        hook + Duration::from_millis(50) >= last_pod,
        "shutdown proceeded before the last pod stopped"
    );
    ensure!(
        hook.duration_since(powered_off.0) < Duration::from_secs(6),
        "the inhibitor was held to the budget's end"
    );

    let node = node(&cluster).await?;
    ensure!(
        condition(&node, "GracefulNodeShutdownInProgress")
            == Some(("True".into(), "NodeShutdown".into())),
        "KEP-5683's condition: {:?}",
        node.status
    );
    ensure!(
        condition(&node, "GracefulShutdown") == Some(("True".into(), "NodeShuttingDown".into())),
        "the old name, kept one release: {:?}",
        node.status
    );
    ensure!(tainted(&node));
    // Every group's start and end is an Event of its own, and the completion says all is done.
    wait_for("the shutdown Events", || async {
        Ok(notes(&cluster, "NodeShutdownCompleted").await?.len() == 1)
    })
    .await?;
    ensure!(notes(&cluster, "NodeShutdown").await?.len() == 1);
    let mut started = notes(&cluster, "ShutdownGroupStarted").await?;
    started.sort();
    ensure!(
        started
            == [
                "Terminating 1 pod(s) of priority group >= 1000 within 3s",
                "Terminating 1 pod(s) of priority group >= 100000 within 3s",
                "Terminating 2 pod(s) of priority group >= 0 within 3s",
            ],
        "{started:?}"
    );
    let mut finished = notes(&cluster, "ShutdownGroupFinished").await?;
    finished.sort();
    ensure!(
        finished
            == [
                "Priority group >= 0: all 2 pod(s) stopped",
                "Priority group >= 100000: all 1 pod(s) stopped",
                "Priority group >= 1000: all 1 pod(s) stopped",
            ],
        "{finished:?}"
    );
    ensure!(
        notes(&cluster, "NodeShutdownCompleted").await?
            == ["All 3 priority group(s) done; the shutdown inhibitor was released"]
    );
    let text = metrics(&agent).await?;
    ensure!(
        text.contains("nodegrace_graceful_shutdown_agent_inhibitor_held 0"),
        "{text}"
    );
    ensure!(
        text.contains(
            "graceful_shutdown_pods_terminated_total{group_priority=\"0\",outcome=\"stopped\"} 2"
        ),
        "{text}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_outliving_its_group_period_does_not_hold_the_next_group() -> Result<()> {
    let Some(logind) = logind(30).await? else {
        return Ok(());
    };
    let cluster = cluster().await?;
    // The finalizer keeps the stopped pod in the API: its group must end at its period (1 s).
    pod(&cluster, "stuck", "low", 30, 0.0, true).await?;
    pod(&cluster, "next", "high", 30, 0.0, false).await?;
    let fates = record_fates(&cluster.client);
    let _agent = start_agent(&cluster, &logind, "0=1,100000=2", None, None).await?;
    let powered_off = Instant::now();
    logind.power_off().await?;
    logind
        .wait_for_shutdown_hook(Duration::from_secs(30))
        .await?;
    until_fates(&fates, &["next"], |fate| fate.deletion_seen.is_some()).await?;
    let fates = fates.lock().unwrap().clone();
    let next = fates.get("next").cloned().context("no record of next")?;
    let started = next
        .deletion_seen
        .context("next was never deleted")?
        .duration_since(powered_off);
    ensure!(
        started >= Duration::from_millis(900) && started < Duration::from_secs(3),
        "next group started after {started:?}"
    );
    ensure!(fates.get("stuck").is_some_and(|f| f.removed.is_none()));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_outage_still_releases_the_inhibitor_at_the_budget_end() -> Result<()> {
    let Some(logind) = logind(30).await? else {
        return Ok(());
    };
    let cluster = cluster().await?;
    pod(&cluster, "web", "low", 30, 0.0, false).await?;
    let _agent = start_agent(&cluster, &logind, "0=2,100000=1", None, None).await?;
    cluster.sim.faults().outage(Duration::from_secs(60));
    let powered_off = Instant::now();
    logind.power_off().await?;
    logind
        .wait_for_shutdown_hook(Duration::from_secs(40))
        .await?;
    let held = powered_off.elapsed();
    // The pod's group ran its full 2 s (nothing could be deleted), the empty group after it was
    // skipped, and the agent let go long before logind's own 30 s.
    ensure!(
        held >= Duration::from_millis(1900) && held < Duration::from_secs(10),
        "held {held:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logind_restart_gets_the_inhibitor_back() -> Result<()> {
    let Some(mut logind) = logind(30).await? else {
        return Ok(());
    };
    let cluster = cluster().await?;
    let agent = start_agent(&cluster, &logind, "0=5", None, None).await?;
    // elogind restores the lock from /run/systemd/inhibit while the agent's fd is open; the
    // agent takes a fresh one and closes the old.
    logind.restart().await?;
    wait_for("the inhibitor taken again after the restart", || async {
        Ok(metrics(&agent)
            .await?
            .contains("nodegrace_graceful_shutdown_agent_inhibitor_held 1")
            && logind
                .list_inhibitors()
                .await?
                .iter()
                .filter(|row| row.1 == INHIBITOR_WHO)
                .count()
                == 1)
    })
    .await?;
    // With no pods the agent lets go at once; a leftover restored lock would hold the shutdown
    // for logind's whole 30 s.
    let powered_off = Instant::now();
    logind.power_off().await?;
    logind
        .wait_for_shutdown_hook(Duration::from_secs(20))
        .await?;
    ensure!(
        powered_off.elapsed() < Duration::from_secs(10),
        "held {:?}",
        powered_off.elapsed()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_logind_will_not_grant_is_reported_not_fatal() -> Result<()> {
    let Some(logind) = logind(2).await? else {
        return Ok(());
    };
    let cluster = cluster().await?;
    let ignored = tempfile::tempdir()?;
    let agent = start_agent(&cluster, &logind, "0=10", Some(ignored.path()), None).await?;
    let text = metrics(&agent).await?;
    ensure!(
        text.contains("graceful_shutdown_budget_seconds 2.0"),
        "{text}"
    );
    ensure!(
        text.contains("graceful_shutdown_budget_reduced 1"),
        "{text}"
    );
    wait_for("the ShutdownBudgetReduced event", || async {
        Ok(event_reasons(&cluster)
            .await?
            .iter()
            .any(|r| r == "ShutdownBudgetReduced"))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_shutdown_unmarks_the_node_and_retakes_the_inhibitor() -> Result<()> {
    let Some(logind) = logind(30).await? else {
        return Ok(());
    };
    let cluster = cluster().await?;
    pod(&cluster, "stuck", "low", 30, 0.0, true).await?;
    // elogind never sends PrepareForShutdown(false) after a power-off it ran, so the
    // cancellation is injected; the inhibitor is still taken from the real elogind.
    let (cancel, cancellations) = futures::channel::mpsc::unbounded::<ShutdownEvent>();
    let _agent = start_agent(&cluster, &logind, "0=20", None, Some(cancellations.boxed())).await?;
    logind.power_off().await?;
    wait_for("the node to be marked", || async {
        Ok(tainted(&node(&cluster).await?))
    })
    .await?;
    cancel.unbounded_send(ShutdownEvent::PrepareForShutdown(false))?;
    wait_for("the node to be unmarked", || async {
        let node = node(&cluster).await?;
        Ok(!tainted(&node)
            && condition(&node, "GracefulShutdown")
                == Some(("False".into(), "ShutdownCancelled".into()))
            && condition(&node, "GracefulNodeShutdownInProgress")
                == Some(("False".into(), "ShutdownCancelled".into())))
    })
    .await?;
    // The Event is written after the conditions (the reporter keeps their order), so it may
    // land a moment after the node looks unmarked.
    wait_for("the ShutdownCancelled Event", || async {
        Ok(event_reasons(&cluster)
            .await?
            .iter()
            .any(|r| r == "ShutdownCancelled"))
    })
    .await?;
    ensure!(
        logind
            .list_inhibitors()
            .await?
            .iter()
            .any(|row| row.1 == INHIBITOR_WHO && row.3 == "delay")
    );
    Ok(())
}

async fn mark_node_as_shutting_down(cluster: &Cluster) -> Result<()> {
    let nodes: Api<Node> = Api::all(cluster.client.clone());
    let patch = json!({"spec": {"taints": [{"key": "nodegrace.io/shutting-down", "effect": "NoSchedule"}]}});
    nodes
        .patch(
            NODE,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(patch),
        )
        .await?;
    let status = json!({"status": {"conditions": [{"type": "GracefulShutdown", "status": "True", "reason": "NodeShuttingDown", "message": "", "lastHeartbeatTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}});
    nodes
        .patch_status(
            NODE,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Strategic(status),
        )
        .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_reboot_stale_markings_go_and_the_last_shutdown_is_published() -> Result<()> {
    let Some(logind) = logind(30).await? else {
        return Ok(());
    };
    let cluster = cluster().await?;
    mark_node_as_shutting_down(&cluster).await?;
    let record = json!({"bootId": "boot-0", "startedAt": "2026-11-20T10:00:00Z", "endedAt": "2026-11-20T10:00:07Z"});
    let agent =
        start_agent_with_state(&cluster, &logind, "0=5", None, None, Some(record), &[]).await?;
    wait_for("the stale markings to go", || async {
        let node = node(&cluster).await?;
        Ok(!tainted(&node)
            && condition(&node, "GracefulShutdown").is_some_and(|(status, _)| status == "False"))
    })
    .await?;
    let text = metrics(&agent).await?;
    ensure!(
        text.contains("graceful_shutdown_start_time_seconds 1795168800.0"),
        "{text}"
    );
    ensure!(
        text.contains("graceful_shutdown_end_time_seconds 1795168807.0"),
        "{text}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_markings_go_even_when_the_first_reads_of_the_node_fail() -> Result<()> {
    let Some(logind) = logind(30).await? else {
        return Ok(());
    };
    let cluster = cluster().await?;
    mark_node_as_shutting_down(&cluster).await?;
    // Every read of the node fails while the agent starts: before, one failed GET counted as
    // "not marked" and the taint stayed for good.
    cluster.sim.faults().add_rule(kube_sim::faults::ErrorRule {
        verb: "get".into(),
        resource: "nodes".into(),
        rate: 1.0,
        failure: kube_sim::faults::FailureKind::InternalError,
    });
    let agent = start_agent(&cluster, &logind, "0=5", None, None).await?;
    wait_for("a failed write of the markings", || readyz(&agent)).await?;
    // The test reads by listing: its own GETs fail too.
    let listed = Api::<Node>::all(cluster.client.clone())
        .list(&kube::api::ListParams::default())
        .await?;
    ensure!(
        listed.items.iter().any(tainted),
        "nothing can be written yet"
    );
    cluster.sim.faults().clear();
    wait_for("the stale markings to go", || async {
        let node = node(&cluster).await?;
        Ok(!tainted(&node)
            && condition(&node, "GracefulShutdown").is_some_and(|(status, _)| status == "False"))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_mid_shutdown_resumes_it_and_never_undoes_it() -> Result<()> {
    let Some(logind) = logind(30).await? else {
        return Ok(());
    };
    let cluster = cluster().await?;
    pod(&cluster, "web", "low", 30, 0.0, false).await?;
    mark_node_as_shutting_down(&cluster).await?;
    // Same boot, started, never ended: the agent died mid-shutdown.
    let started = jiff::Timestamp::now().to_string();
    let record = json!({"bootId": "boot-1", "startedAt": started});
    let fates = record_fates(&cluster.client);
    let _agent =
        start_agent_with_state(&cluster, &logind, "0=5", None, None, Some(record), &[]).await?;
    wait_for("the pod to be terminated", || async {
        Ok(fates
            .lock()
            .unwrap()
            .get("web")
            .is_some_and(|f| f.removed.is_some()))
    })
    .await?;
    let node = node(&cluster).await?;
    ensure!(tainted(&node), "the resumed shutdown must keep the taint");
    ensure!(condition(&node, "GracefulShutdown").is_some_and(|(status, _)| status == "True"));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_nothing_configured_the_agent_is_ready_and_holds_nothing() -> Result<()> {
    let Some(logind) = logind(30).await? else {
        return Ok(());
    };
    let cluster = cluster().await?;
    let state = tempfile::tempdir()?;
    let args = Args::try_parse_from([
        "graceful-shutdown-agent".to_owned(),
        format!("--node-name={NODE}"),
        format!("--kubeconfig={}", cluster.sim.kubeconfig_path().display()),
        format!("--dbus-address={}", logind.bus_address()),
        format!("--state-dir={}", state.path().display()),
        "--admin-listen=127.0.0.1:0".to_owned(),
    ])?;
    let _agent = Agent {
        program: ProgramUnderTest::start(METRICS_PREFIX, |stop| app::start(args, stop)).await?,
        _state: state,
    };
    ensure!(
        !logind
            .list_inhibitors()
            .await?
            .iter()
            .any(|row| row.1 == INHIBITOR_WHO)
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_mid_shutdown_finishes_the_termination_before_letting_go() -> Result<()> {
    let Some(logind) = logind(30).await? else {
        return Ok(());
    };
    let cluster = cluster().await?;
    pod(&cluster, "low", "low", 30, 1.0, false).await?;
    pod(&cluster, "high", "high", 30, 1.5, false).await?;
    let fates = record_fates(&cluster.client);
    let agent = start_agent(&cluster, &logind, "0=10,100000=10", None, None).await?;
    let powered_off = (Instant::now(), SystemTime::now());
    logind.power_off().await?;
    wait_for("the first group to start", || async {
        Ok(fates
            .lock()
            .unwrap()
            .get("low")
            .is_some_and(|f| f.deletion_seen.is_some()))
    })
    .await?;
    // The kubelet's SIGTERM, while the first group is still stopping.
    agent.program.sigterm();
    let hook = hook_instant(
        logind
            .wait_for_shutdown_hook(Duration::from_secs(30))
            .await?,
        powered_off,
    );
    // The watch reports the removal late, and late by more than 50 ms on a loaded machine
    // (the test command runs four tests at once beside the images' build): wait for it, and
    // allow it half a second. An inhibitor let go at the SIGTERM would come 1.5 s (the pod's
    // stop) or more before the removal, so the order is still proven.
    wait_for("the last group's pod to be removed", || async {
        Ok(fates
            .lock()
            .unwrap()
            .get("high")
            .is_some_and(|fate| fate.removed.is_some()))
    })
    .await
    .context("the last group was never finished")?;
    let removed = fates
        .lock()
        .unwrap()
        .get("high")
        .and_then(|fate| fate.removed)
        .context("the last group was never finished")?;
    ensure!(
        hook + Duration::from_millis(500) >= removed,
        "the inhibitor went before the last pod stopped"
    );
    agent.program.wait().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_while_logind_shuts_down_is_ready_without_retrying_the_lock() -> Result<()> {
    let Some(logind) = logind(30).await? else {
        return Ok(());
    };
    let cluster = cluster().await?;
    pod(&cluster, "web", "low", 30, 0.0, false).await?;
    // Another delay lock keeps logind in its shutdown while the agent starts.
    let other = nodegrace_logind::Logind::connect_to(logind.bus_address()).await?;
    let held = other
        .inhibit(
            "shutdown",
            "test",
            "keeps the shutdown pending",
            nodegrace_logind::InhibitMode::Delay,
        )
        .await?;
    logind.power_off().await?;
    wait_for("logind to shut down", || async {
        Ok(other.preparing_for_shutdown().await?)
    })
    .await?;
    let fates = record_fates(&cluster.client);
    let agent = start_agent_with_state(&cluster, &logind, "0=5", None, None, None, &[]).await?;
    wait_for("readiness", || readyz(&agent)).await?;
    wait_for("the pod's termination", || async {
        Ok(fates
            .lock()
            .unwrap()
            .get("web")
            .is_some_and(|f| f.removed.is_some()))
    })
    .await?;
    let text = metrics(&agent).await?;
    ensure!(
        text.contains("graceful_shutdown_resumed_without_inhibitor 1"),
        "{text}"
    );
    ensure!(text.contains("inhibit_failures_total 0"), "{text}");
    wait_for("the Warning Event", || async {
        Ok(!notes(&cluster, "ShutdownResumedWithoutInhibitor")
            .await?
            .is_empty())
    })
    .await?;
    drop(held);
    logind
        .wait_for_shutdown_hook(Duration::from_secs(30))
        .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mirror_pods_are_left_to_the_kubelet_and_not_waited_for() -> Result<()> {
    let Some(logind) = logind(60).await? else {
        return Ok(());
    };
    let cluster = cluster().await?;
    pod(&cluster, "web", "low", 30, 0.0, false).await?;
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), "default");
    let mirror = json!({
        "metadata": {"name": "etcd-node-a", "annotations": {"kubernetes.io/config.mirror": "abc", "kubernetes.io/config.source": "file"}},
        "spec": {"nodeName": NODE, "priorityClassName": "high", "containers": [{"name": "c", "image": "i"}]},
    });
    pods.create(&PostParams::default(), &serde_json::from_value(mirror)?)
        .await?;
    let fates = record_fates(&cluster.client);
    let _agent = start_agent(&cluster, &logind, "0=5,100000=30", None, None).await?;
    let powered_off = Instant::now();
    logind.power_off().await?;
    logind
        .wait_for_shutdown_hook(Duration::from_secs(60))
        .await?;
    // Waiting for the mirror pod would have held the last group its whole 30 s.
    ensure!(
        powered_off.elapsed() < Duration::from_secs(15),
        "held {:?}",
        powered_off.elapsed()
    );
    until_fates(&fates, &["web"], |fate| fate.removed.is_some()).await?;
    let fates = fates.lock().unwrap().clone();
    ensure!(
        fates
            .get("etcd-node-a")
            .is_some_and(|f| f.deletion_seen.is_none()),
        "{fates:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lock_is_held_while_logind_applies_the_budget_and_a_cut_is_reported() -> Result<()> {
    let Some(logind) = logind(2).await? else {
        return Ok(());
    };
    let cluster = cluster().await?;
    // The finalizer keeps "stuck" in the API: its group lasts until the 2 s budget ends.
    pod(&cluster, "stuck", "low", 30, 0.0, true).await?;
    pod(&cluster, "late", "high", 30, 0.0, false).await?;
    let ignored = tempfile::tempdir()?;
    // logind never applies the drop-in; the agent must not wait the reload timeout unlocked.
    let agent = start_agent_with_state(
        &cluster,
        &logind,
        "0=3,100000=1",
        Some(ignored.path()),
        None,
        None,
        &["--logind-reload-timeout=5m"],
    )
    .await?;
    wait_for("the inhibitor", || async {
        Ok(logind
            .list_inhibitors()
            .await?
            .iter()
            .any(|row| row.1 == INHIBITOR_WHO && row.3 == "delay"))
    })
    .await?;
    ensure!(readyz(&agent).await?);
    let text = metrics(&agent).await?;
    ensure!(
        text.contains("graceful_shutdown_budget_seconds 2.0"),
        "{text}"
    );
    logind.power_off().await?;
    logind
        .wait_for_shutdown_hook(Duration::from_secs(30))
        .await?;
    wait_for("the completion Event", || async {
        Ok(notes(&cluster, "NodeShutdownCompleted").await?.len() == 1)
    })
    .await?;
    let completed = notes(&cluster, "NodeShutdownCompleted").await?;
    ensure!(
        completed
            == [
                "The shutdown budget ran out: 0 of 2 priority group(s) done; \
                 group >= 0 cut short with 1 pod(s) still running; \
                 group >= 100000 not started (1 pod(s)); the shutdown inhibitor was released"
            ],
        "{completed:?}"
    );
    let text = metrics(&agent).await?;
    ensure!(
        text.contains(
            "graceful_shutdown_pods_terminated_total{group_priority=\"100000\",outcome=\"not_started\"} 1"
        ),
        "{text}"
    );
    Ok(())
}

/// The kubelet's own graceful shutdown (its delay lock, or its logind drop-in) is reported as a
/// conflict: a node condition and a Warning naming what was seen and the fix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubelets_own_graceful_shutdown_is_reported_as_a_conflict() -> Result<()> {
    let Some(logind) = logind(30).await? else {
        return Ok(());
    };
    let cluster = cluster().await?;
    let kubelet = Logind::connect_to(logind.bus_address()).await?;
    let kubelet_lock = kubelet
        .inhibit(
            "shutdown",
            "kubelet",
            "Kubelet needs time to handle node shutdown",
            InhibitMode::Delay,
        )
        .await?;
    let drop_ins = tempfile::tempdir()?;
    std::fs::write(
        drop_ins.path().join("99-kubelet.conf"),
        "# Kubelet logind override\n[Login]\nInhibitDelayMaxSec=30\n",
    )?;
    let _agent = start_agent(&cluster, &logind, "0=5", Some(drop_ins.path()), None).await?;
    wait_for("the conflict condition", || async {
        Ok(
            condition(&node(&cluster).await?, "GracefulShutdownConflict")
                == Some(("True".to_owned(), "KubeletGracefulShutdown".to_owned())),
        )
    })
    .await?;
    wait_for("the conflict Warning", || async {
        Ok(notes(&cluster, "KubeletGracefulShutdownConflict")
            .await?
            .iter()
            .any(|note| {
                note.contains("the kubelet holds a delay lock on shutdown")
                    && note.contains("99-kubelet.conf exists")
                    && note.contains("shutdownGracePeriod")
            }))
    })
    .await?;
    drop(kubelet_lock);
    Ok(())
}

/// A shutdown API limit that cannot send a full node's writes within the shortest group is a
/// Warning at start, with the numbers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_api_limit_too_low_for_a_full_node_is_a_warning_with_its_numbers() -> Result<()>
{
    let Some(logind) = logind(30).await? else {
        return Ok(());
    };
    let cluster = cluster().await?;
    let flags = ["--api-qps=5", "--api-burst=10", "--shutdown-api-burst=10"];
    let _agent =
        start_agent_with_state(&cluster, &logind, "0=20", None, None, None, &flags).await?;
    wait_for("the ShutdownApiLimitTooLow Warning", || async {
        Ok(notes(&cluster, "ShutdownApiLimitTooLow")
            .await?
            .iter()
            .any(|note| {
                note.contains("at 5 writes/s with a burst of 10")
                    && note.contains("220 writes of a full node (110 pods) take 42s")
                    && note.contains("20s of the group from priority 0")
            }))
    })
    .await
}
