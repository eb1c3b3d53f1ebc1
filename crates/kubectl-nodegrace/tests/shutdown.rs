//! The node agents against a real elogind: a shutdown held by a Lease (shutdown-inhibitor-agent)
//! and a shutdown in progress (graceful-shutdown-agent), as the plugin shows them.

use std::time::Duration;

use anyhow::{Result, ensure};
use clap::Parser;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use kube_sim::{KubeSim, SimOptions};
use logind_harness::{LogindHarness, ScenarioOptions};
use nodegrace_testing::{ProgramUnderTest, command_line};
use serde_json::json;

/// Holds the shutdown's pod until the test has looked.
const HOLD: &str = "test.nodegrace.io/hold";

use crate::plugin::{Kubectl, blocked_by, command, status_facts, viewer, wait_for};

async fn create<K>(client: &Client, api: Api<K>, body: serde_json::Value) -> Result<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let _ = client;
    api.create(&PostParams::default(), &serde_json::from_value(body)?)
        .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_held_by_a_lease_names_it_and_releasing_it_lets_the_shutdown_go() -> Result<()> {
    use shutdown_inhibitor_agent::app::{self, PROGRAM};
    use shutdown_inhibitor_agent::cli::Args;
    let Some(logind) = LogindHarness::start_or_skip(ScenarioOptions::default()).await? else {
        return Ok(());
    };
    let sim = KubeSim::start(SimOptions {
        nodes: 1,
        ..SimOptions::default()
    })
    .await?;
    let client = sim.client();
    let kubectl = Kubectl::new(sim.kubeconfig_path())?;
    create(
        &client,
        Api::<Namespace>::all(client.clone()),
        json!({"metadata": {"name": "team-a"}}),
    )
    .await?;
    let defaults = [
        "--node-name=node-0".to_owned(),
        format!("--kubeconfig={}", sim.kubeconfig_path().display()),
        format!("--dbus-address={}", logind.bus_address()),
        "--admin-listen=127.0.0.1:0".to_owned(),
    ];
    let args = Args::try_parse_from(command_line(PROGRAM, &defaults, &[]))?;
    let agent = ProgramUnderTest::start("nodegrace_shutdown_inhibitor_agent", |stop| {
        app::start(args, stop)
    })
    .await?;
    let now = jiff::Timestamp::now().to_string();
    create(
        &client,
        Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(client.clone(), "team-a"),
        json!({"metadata": {"name": "node-0"},
               "spec": {"holderIdentity": "db-backup", "acquireTime": now, "renewTime": now}}),
    )
    .await?;
    let blocked = kubectl
        .row_at("node-0", "shutdown-inhibitor-agent", "ActiveLeases")
        .await?;
    ensure!(blocked["state"] == "shutdown-blocked", "{blocked:#}");
    blocked_by(
        &blocked,
        "Lease team-a/node-0 holds the shutdown: held by db-backup",
        "Lease team-a/node-0",
    )?;
    ensure!(
        command(&blocked)?
            == r#"kubectl patch lease node-0 -n team-a --type=json -p '[{"op":"test","path":"/spec/holderIdentity","value":"db-backup"},{"op":"remove","path":"/spec/holderIdentity"}]'"#,
        "{blocked:#}"
    );
    let story = kubectl.nodegrace(&["explain", "node", "node-0"]).await?;
    println!("{story}");
    ensure!(
        story.contains("shutdown-inhibitor-agent: shutdown blocked (ActiveLeases)"),
        "{story}"
    );
    readers_get_the_same_answers(&sim, &kubectl).await?;

    kubectl.paste(&command(&blocked)?).await?;
    kubectl.paste_fails(&command(&blocked)?).await?;
    wait_for("the shutdown to be let go", || async {
        Ok(kubectl
            .row("node-0", "shutdown-inhibitor-agent")
            .await?
            .is_none())
    })
    .await?;
    agent.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_in_progress_shows_until_its_pods_are_gone() -> Result<()> {
    use graceful_shutdown_agent::app::{self, PROGRAM};
    use graceful_shutdown_agent::cli::Args;
    let Some(logind) = LogindHarness::start_or_skip(ScenarioOptions {
        inhibit_delay_max: Duration::from_secs(1),
        ..ScenarioOptions::default()
    })
    .await?
    else {
        return Ok(());
    };
    let sim = KubeSim::start(SimOptions::default()).await?;
    let client = sim.client();
    let kubectl = Kubectl::new(sim.kubeconfig_path())?;
    create(
        &client,
        Api::<Node>::all(client.clone()),
        kube_sim::populate::node("node-a"),
    )
    .await?;
    // A pod held by a finalizer: the shutdown is in progress until the test lets it go (within
    // the group's 60 s), however slowly a loaded machine runs the plugin meanwhile.
    let pods = Api::<Pod>::namespaced(client.clone(), "default");
    create(
        &client,
        pods.clone(),
        json!({"metadata": {"name": "slow", "finalizers": [HOLD],
                            "annotations": {"sim.nodegrace.io/stop-seconds": "1"}},
               "spec": {"nodeName": "node-a", "terminationGracePeriodSeconds": 30,
                        "containers": [{"name": "c", "image": "i"}]}}),
    )
    .await?;
    let state = tempfile::tempdir()?;
    let boot_id = state.path().join("boot_id");
    std::fs::write(&boot_id, "boot-1\n")?;
    let defaults = [
        "--node-name=node-a".to_owned(),
        format!("--kubeconfig={}", sim.kubeconfig_path().display()),
        format!("--dbus-address={}", logind.bus_address()),
        format!("--state-dir={}", state.path().display()),
        format!("--boot-id-file={}", boot_id.display()),
        format!("--logind-drop-in-dir={}", logind.drop_in_dir().display()),
        "--admin-listen=127.0.0.1:0".to_owned(),
        "--shutdown-grace-period-by-pod-priority=0=60".to_owned(),
        "--logind-reload-timeout=1s".to_owned(),
    ];
    let args = Args::try_parse_from(command_line(PROGRAM, &defaults, &[]))?;
    let agent = ProgramUnderTest::start_unready("nodegrace_graceful_shutdown_agent", |stop| {
        app::start(args, stop)
    })
    .await?;
    wait_for("the slow pod to run", || async {
        Ok(pods
            .get("slow")
            .await?
            .status
            .and_then(|s| s.phase)
            .as_deref()
            == Some("Running"))
    })
    .await?;
    wait_for("the agent's lock with the groups' delay", || async {
        Ok(agent
            .admin()
            .get("/metrics")
            .await?
            .contains("graceful_shutdown_budget_seconds 60.0"))
    })
    .await?;
    logind.power_off().await?;
    let row = kubectl
        .row_at("node-a", "graceful-shutdown-agent", "NodeShutdown")
        .await;
    let row = match row {
        Ok(row) => row,
        Err(error) => {
            let rows = kubectl.rows("node-a").await?;
            anyhow::bail!("{error:#}: {rows:#?}");
        }
    };
    ensure!(row["state"] == "shutting-down", "{row:#}");
    ensure!(
        row["next"]["command"].is_null(),
        "nothing to run while pods stop: {row:#}"
    );
    let table = kubectl.nodegrace(&["status", "node-a"]).await?;
    println!("{table}");
    ensure!(table.contains("shutting down"), "{table}");
    let_go(&pods, "slow").await?;
    wait_for("the slow pod to be gone", || async {
        Ok(pods.get_opt("slow").await?.is_none())
    })
    .await?;
    let pod = kubectl.json(&["explain", "pod", "default/slow"]).await?;
    ensure!(pod["exists"] == false, "{pod:#}");
    ensure!(
        pod["verdict"]["program"] == "graceful-shutdown-agent",
        "{pod:#}"
    );
    ensure!(pod["verdict"]["how"] == "terminated", "{pod:#}");
    agent.stop().await
}

/// Removes the test's finalizer from `pod`: its deletion completes.
async fn let_go(pods: &Api<Pod>, pod: &str) -> Result<()> {
    let released = json!({"metadata": {"finalizers": null}});
    pods.patch(pod, &PatchParams::default(), &Patch::Merge(released))
        .await?;
    Ok(())
}

/// A user with only the docs' read role gets the same answers; without Leases, the rest and one
/// line saying what it could not read; without nodes, an error naming the verb to ask for.
async fn readers_get_the_same_answers(sim: &KubeSim, kubectl: &Kubectl) -> Result<()> {
    let admin = status_facts(kubectl).await?;
    let reader = viewer(sim, "viewer", &[]).await?;
    ensure!(status_facts(&reader).await? == admin, "{admin:#}");
    let blind = viewer(sim, "no-leases", &["leases"]).await?;
    let seen = blind.json(&["status"]).await?;
    let row = &seen["nodes"][0];
    ensure!(
        row["state"] == "shutdown-blocked" && row["step"] == "ActiveLeases",
        "{seen:#}"
    );
    ensure!(
        row["blockedBy"]["text"]
            .as_str()
            .is_some_and(|text| text.starts_with("Leases held by team-a/db-backup")),
        "{seen:#}"
    );
    ensure!(
        seen["unread"]
            == json!([
                "could not list leases.coordination.k8s.io in all namespaces: forbidden (ask for `list` on `leases.coordination.k8s.io`); what it would tell is left out"
            ]),
        "{seen:#}"
    );
    let nodeless = viewer(sim, "no-nodes", &["nodes"]).await?;
    let refused = nodeless.nodegrace_fails(&["status"]).await?;
    ensure!(
        refused.trim()
            == "Error: forbidden to list nodes at the cluster scope: ask for `list` on `nodes` \
                (docs/kubectl-nodegrace.md lists every permission the plugin uses)",
        "{refused}"
    );
    let table = blind.nodegrace(&["status"]).await?;
    ensure!(
        table.lines().filter(|line| line.starts_with("! ")).count() == 1,
        "{table}"
    );
    Ok(())
}
