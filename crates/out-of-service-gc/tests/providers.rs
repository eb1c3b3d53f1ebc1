//! Fencing and recovery through the real providers' wire protocols: the release-shaped binary
//! with `--instance-provider=aws` against moto's EC2 (StopInstances with Force, then
//! StartInstances) and with `--instance-provider=redfish` against sushy-tools' emulator
//! (ComputerSystem.Reset ForceOff, then On, each landing seconds after the request). The
//! nodes live on kube-sim; the test plays their machines: a kubelet runs only while the
//! provider says its machine is on.

use std::future::Future;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::PostParams;
use kube::{Api, Client};
use kube_sim::KubeSim;
use provider_testbed::interposer::Interposer;
use provider_testbed::moto::Moto;
use provider_testbed::sushy::{Sushy, System};
use serde_json::json;
use tokio::process::{Child, Command};

use crate::common::*;

const BINARY: &str = env!("CARGO_BIN_EXE_out-of-service-gc");
const ZONE: &str = "us-east-1a";
const REGION: &str = "us-east-1";
/// Machines besides the one that hangs: bystanders that must never be touched.
const BYSTANDERS: usize = 4;

fn start(sim: &KubeSim, provider: &[String], env: &[(&str, &str)]) -> Result<Child> {
    let mut command = Command::new(BINARY);
    command
        .arg(format!("--kubeconfig={}", sim.kubeconfig_path().display()))
        .args([
            "--admin-listen=127.0.0.1:0",
            "--leader-elect=false",
            "--fence-after=1s",
            "--liveness-guard-window=1s",
            "--auto-untaint=true",
            "--recover-after-cleanup=true",
            "--log-level=warn",
        ])
        .args(provider)
        .env_remove("AWS_REGION")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    for (key, value) in env {
        command.env(key, value);
    }
    command.spawn().context("start out-of-service-gc")
}

/// Plays the hung machine of `node`: once the provider says it is off, and then on again, its
/// kubelet boots (a hung machine that was power-cycled comes back).
async fn play_machine<F, Fut>(client: Client, node: &'static str, is_on: F) -> Result<()>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<bool>>,
{
    // sushy's fake driver lands each power change 1 to 11 s after the request.
    let within = Duration::from_secs(90);
    nodegrace_testing::wait_for_within("the machine powered off", within, || async {
        Ok(!is_on().await?)
    })
    .await?;
    nodegrace_testing::wait_for_within("the machine powered on again", within, &is_on).await?;
    revive(&client, node).await
}

/// The database on the hung node, whose volume must move.
async fn database(client: &Client, node: &str) -> Result<()> {
    create_claim(client, "data").await?;
    let spec = json!({"spec": {"volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]}});
    Api::<Pod>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &pod("db", node, &spec)?)
        .await?;
    Ok(())
}

/// The flow every provider must carry: fenced (off by the provider's word), tainted, cleaned,
/// powered on, back and untainted; the ghost (a machine the provider does not know) is held
/// with `ghost_held` and never tainted.
async fn fence_and_recover(
    client: &Client,
    hung: &str,
    ghost: &str,
    ghost_held: &str,
) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    wait_for("the database to be force-deleted", || async {
        Ok(pods.get_opt("db").await?.is_none())
    })
    .await?;
    // sushy's fake driver lands each power change 1 to 11 s after the request.
    nodegrace_testing::wait_for_within(
        "the hung node back and untainted",
        Duration::from_secs(90),
        || async {
            let node = nodes.get(hung).await?;
            Ok(is_ready(&node) && !has_taint(&node))
        },
    )
    .await?;
    let story = [
        "Fencing",
        "Fenced",
        "OutOfServiceCleanupDone",
        "PoweringOn",
        "Recovered",
    ];
    wait_for("the fence's Events", || async {
        let seen = event_reasons(client, hung).await?;
        Ok(story.iter().all(|reason| seen.iter().any(|r| r == reason)))
    })
    .await?;
    wait_for("the ghost held for its unknown machine", || async {
        Ok(event_reasons(client, ghost)
            .await?
            .iter()
            .any(|r| r == ghost_held))
    })
    .await?;
    let ghost_node = nodes.get(ghost).await?;
    ensure!(!has_taint(&ghost_node), "the ghost was tainted");
    ensure!(
        ghost_node
            .metadata
            .labels
            .as_ref()
            .is_none_or(|labels| !labels.contains_key("nodegrace.io/fence")),
        "the ghost got a fence step"
    );
    Ok(())
}

#[tokio::test]
async fn aws_stops_a_hung_instance_with_force_and_starts_it_again() -> Result<()> {
    let moto = Moto::start().await?;
    let sim = sim(0, world()).await?;
    let client = sim.client();
    let ids = moto.run_instances(ZONE, 1 + BYSTANDERS).await?;
    let names = ["hung", "by-0", "by-1", "by-2", "by-3"];
    for (name, id) in names.iter().zip(&ids) {
        machine_node(&client, name, &format!("aws:///{ZONE}/{id}"), None).await?;
    }
    machine_node(
        &client,
        "ghost",
        &format!("aws:///{ZONE}/i-00000000000000000"),
        None,
    )
    .await?;
    all_ready(&client, 6).await?;
    database(&client, "hung").await?;
    let _program = start(
        &sim,
        &[
            "--instance-provider=aws".to_owned(),
            format!("--aws-endpoint-url={}", moto.url),
            format!("--aws-region={REGION}"),
        ],
        &[
            ("AWS_ACCESS_KEY_ID", "AKIAPROGRAM"),
            ("AWS_SECRET_ACCESS_KEY", "secret"),
        ],
    )?;
    stop_kubelet(&client, "hung").await?;
    stop_kubelet(&client, "ghost").await?;
    let hung_id = ids[0].clone();
    let machine = {
        let client = client.clone();
        let moto = &moto;
        let hung_id = hung_id.clone();
        play_machine(client, "hung", move || {
            let hung_id = hung_id.clone();
            async move { Ok(moto.state(REGION, &hung_id).await?.as_deref() == Some("running")) }
        })
    };
    let (played, flow) = tokio::join!(
        machine,
        fence_and_recover(&client, "hung", "ghost", "FenceHeldMachineNotFound")
    );
    played?;
    flow?;
    let stops = moto.program_calls("StopInstances").await?;
    ensure!(stops.len() == 1, "StopInstances sent {} times", stops.len());
    ensure!(
        stops[0].instance_ids() == [hung_id.as_str()],
        "{:?}",
        stops[0].form
    );
    ensure!(
        stops[0].field("Force") == Some("true"),
        "not forced: {:?}",
        stops[0].form
    );
    let starts = moto.program_calls("StartInstances").await?;
    ensure!(
        starts.len() == 1 && starts[0].instance_ids() == [hung_id.as_str()],
        "{starts:?}"
    );
    for id in &ids[1..] {
        ensure!(
            moto.state(REGION, id).await?.as_deref() == Some("running"),
            "bystander {id} touched"
        );
    }
    Ok(())
}

#[tokio::test]
async fn redfish_forces_a_hung_system_off_and_powers_it_on_again() -> Result<()> {
    let systems: Vec<System> = (0..=BYSTANDERS).map(|n| System::new(n, true)).collect();
    let sushy = Sushy::start_plain(&systems).await?;
    let bmc = Interposer::start(&sushy.url).await?;
    let sim = sim(0, world()).await?;
    let client = sim.client();
    let names = ["hung", "by-0", "by-1", "by-2", "by-3"];
    // The ghost's system is not on the BMC.
    let ghost = System::new(99, true);
    let machines: Vec<(&str, &System)> = names
        .iter()
        .copied()
        .zip(&systems)
        .chain(std::iter::once(("ghost", &ghost)))
        .collect();
    let file = sushy.write_config(&bmc.url(), &machines)?;
    for name in names.iter().chain(std::iter::once(&"ghost")) {
        machine_node(&client, name, &format!("redfish:///{name}"), None).await?;
    }
    all_ready(&client, 6).await?;
    database(&client, "hung").await?;
    let _program = start(
        &sim,
        &[
            "--instance-provider=redfish".to_owned(),
            format!("--redfish-config={}", file.display()),
        ],
        &[],
    )?;
    // The judge reads the BMC directly, not through the interposer that counts the program's
    // requests.
    let powered_on = |system: &System| {
        let (sushy, uuid) = (&sushy, system.uuid.clone());
        async move { Ok::<_, anyhow::Error>(sushy.power_state(&uuid).await? == "On") }
    };
    stop_kubelet(&client, "hung").await?;
    stop_kubelet(&client, "ghost").await?;
    let machine = play_machine(client.clone(), "hung", || async {
        powered_on(&systems[0]).await
    });
    // A system the BMC does not have is an error of the map, not a machine gone.
    let (played, flow) = tokio::join!(
        machine,
        fence_and_recover(&client, "hung", "ghost", "FenceHeldProvider")
    );
    played?;
    flow?;
    let resets = |system: &System, kind: &str| bmc.redfish_resets(&system.uuid, kind);
    ensure!(
        resets(&systems[0], "ForceOff") == 1,
        "ForceOff not sent once"
    );
    ensure!(resets(&systems[0], "On") == 1, "On not sent once");
    for (name, system) in names.iter().zip(&systems).skip(1) {
        ensure!(
            resets(system, "ForceOff") + resets(system, "On") == 0 && powered_on(system).await?,
            "bystander {name} touched"
        );
    }
    Ok(())
}
