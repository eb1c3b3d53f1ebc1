//! The release-shaped binary with `--instance-provider=aws` against moto's EC2: Nodes on
//! kube-sim carry the providerIDs of instances launched through the real EC2 API; deleting
//! them terminates each instance exactly once, and every way of being wrong (an unknown id, a
//! region the endpoint does not serve, a protected instance, a restart mid-termination) ends
//! as the contract says. TerminateInstances calls are counted by moto's own recorder.

use std::process::Stdio;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube_sim::KubeSim;
use provider_testbed::interposer::{Interposer, Mode};
use provider_testbed::moto::Moto;
use tokio::process::{Child, Command};

use crate::common::{
    delete_node, event_notes, has_finalizer, machine_node, node_gone, sim, wait_for,
};

const BINARY: &str = env!("CARGO_BIN_EXE_termination-controller");
const ZONE: &str = "us-east-1a";
const REGION: &str = "us-east-1";

fn start(sim: &KubeSim, endpoint: &str) -> Result<Child> {
    Command::new(BINARY)
        .arg(format!("--kubeconfig={}", sim.kubeconfig_path().display()))
        .args([
            "--admin-listen=127.0.0.1:0",
            "--leader-elect=false",
            "--instance-provider=aws",
            "--instance-not-found-confirm=2s",
            "--log-level=warn",
        ])
        .arg(format!("--aws-endpoint-url={endpoint}"))
        .arg(format!("--aws-region={REGION}"))
        .env("AWS_ACCESS_KEY_ID", "AKIAPROGRAM")
        .env("AWS_SECRET_ACCESS_KEY", "secret")
        .env_remove("AWS_REGION")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .context("start termination-controller")
}

/// How often `id` was in a TerminateInstances the program sent that EC2 could carry out: one
/// naming a `protected` machine fails whole (EC2 terminates none of its machines) and is then
/// retried machine by machine.
async fn terminations(moto: &Moto, id: &str, protected: &[&str]) -> Result<usize> {
    Ok(moto
        .program_calls("TerminateInstances")
        .await?
        .iter()
        .filter(|call| call.instance_ids().contains(&id))
        .filter(|call| !protected.iter().any(|p| call.instance_ids().contains(p)))
        .count())
}

#[tokio::test]
async fn deleted_nodes_terminate_their_instances_once_and_wrong_ones_are_held() -> Result<()> {
    let moto = Moto::start().await?;
    let sim = sim(0).await?;
    let client = sim.client();
    let ids = moto.run_instances(ZONE, 3).await?;
    for (n, id) in ids.iter().enumerate() {
        machine_node(
            &client,
            &format!("worker-{n}"),
            &format!("aws:///{ZONE}/{id}"),
            None,
        )
        .await?;
    }
    machine_node(
        &client,
        "unknown",
        &format!("aws:///{ZONE}/i-00000000000000000"),
        None,
    )
    .await?;
    let elsewhere = moto.run_instances("eu-west-1a", 1).await?.remove(0);
    machine_node(
        &client,
        "elsewhere",
        &format!("aws:///eu-west-1a/{elsewhere}"),
        None,
    )
    .await?;
    let protected = moto.run_instances(ZONE, 1).await?.remove(0);
    moto.protect(REGION, &protected).await?;
    machine_node(
        &client,
        "protected",
        &format!("aws:///{ZONE}/{protected}"),
        None,
    )
    .await?;
    machine_node(&client, "not-ec2", "gce://project/us-central1-a/vm-1", None).await?;

    let _controller = start(&sim, &moto.url)?;
    let names = [
        "worker-0",
        "worker-1",
        "worker-2",
        "unknown",
        "elsewhere",
        "protected",
        "not-ec2",
    ];
    for name in names {
        wait_for(&format!("the finalizer on {name}"), || {
            has_finalizer(&client, name)
        })
        .await?;
    }
    for name in names {
        delete_node(&client, name).await?;
    }

    for (n, id) in ids.iter().enumerate() {
        let name = format!("worker-{n}");
        wait_for(&format!("{name} released"), || node_gone(&client, &name)).await?;
        ensure!(moto.state(REGION, id).await?.as_deref() == Some("terminated"));
        let sent = terminations(&moto, id, &[&protected]).await?;
        ensure!(
            sent == 1,
            "{id} was in {sent} TerminateInstances EC2 could carry out"
        );
    }
    // Seven deletions at once: one batch, failed by the protected machine, then one call per
    // machine, never more.
    let calls = moto.program_calls("TerminateInstances").await?;
    ensure!(calls.len() <= 8, "{} TerminateInstances calls", calls.len());

    // Unknown to EC2: released as gone once that held for the confirmation, with an Event.
    wait_for("the unknown machine's node released", || {
        node_gone(&client, "unknown")
    })
    .await?;
    // Events are sent behind the finalizer's removal, so the Event may come a moment later.
    wait_for("the InstanceNotFound Event on unknown", || async {
        let said = event_notes(&client, "unknown", "InstanceNotFound").await?;
        Ok(said.iter().any(|note| note.contains("released as gone")))
    })
    .await?;

    // Held with a Warning that says why; their machines untouched.
    let held = [
        ("elsewhere", "serves region us-east-1"),
        ("protected", "OperationNotPermitted"),
        ("not-ec2", "is not an EC2 machine"),
    ];
    for (name, why) in held {
        wait_for(&format!("a Warning on {name}"), || async {
            let warned = event_notes(&client, name, "InstanceTerminationFailed").await?;
            Ok(warned.iter().any(|note| note.contains(why)))
        })
        .await?;
    }
    // The unknown machine's confirmation has passed meanwhile; these are still held.
    for (name, _) in held {
        ensure!(!node_gone(&client, name).await?, "{name} was released");
    }
    ensure!(moto.state("eu-west-1", &elsewhere).await?.as_deref() == Some("running"));
    ensure!(moto.state(REGION, &protected).await?.as_deref() == Some("running"));
    Ok(())
}

#[tokio::test]
async fn a_restart_between_the_request_and_its_confirmation_sends_no_second_request() -> Result<()>
{
    let moto = Moto::start().await?;
    let cloud = Interposer::start(&moto.url).await?;
    let sim = sim(0).await?;
    let client = sim.client();
    let id = moto.run_instances(ZONE, 1).await?.remove(0);
    machine_node(&client, "worker", &format!("aws:///{ZONE}/{id}"), None).await?;

    let mut first = start(&sim, &cloud.url())?;
    wait_for("the finalizer", || has_finalizer(&client, "worker")).await?;
    // EC2 accepts the TerminateInstances, then cannot be reached: the machine's end is not
    // confirmed while this replica lives.
    cloud.set(Mode::FailAfter("TerminateInstances".to_owned()));
    delete_node(&client, "worker").await?;
    wait_for("the terminate request stamped", || async {
        let node = Api::<Node>::all(client.clone()).get_opt("worker").await?;
        Ok(node.is_some_and(|node| {
            node.metadata
                .annotations
                .is_some_and(|notes| notes.contains_key("nodegrace.io/terminate-requested-at"))
        }))
    })
    .await?;
    let failed = cloud.failed();
    wait_for("a failed confirmation", || async {
        Ok(cloud.failed() > failed)
    })
    .await?;
    first.kill().await?;

    let _second = start(&sim, &cloud.url())?;
    let failed = cloud.failed();
    wait_for("the new replica asking EC2", || async {
        Ok(cloud.failed() > failed)
    })
    .await?;
    ensure!(
        !node_gone(&client, "worker").await?,
        "released without a confirmation"
    );
    cloud.set(Mode::Forward);
    wait_for("the node released", || node_gone(&client, "worker")).await?;
    ensure!(
        terminations(&moto, &id, &[]).await? == 1,
        "a second TerminateInstances was sent"
    );
    ensure!(moto.state(REGION, &id).await?.as_deref() == Some("terminated"));
    Ok(())
}
