//! A provider that refuses or hangs, for every power call out-of-service-gc makes: the
//! release-shaped binary against moto's EC2 and sushy-tools' Redfish emulator behind the
//! interposer, which refuses (an IAM policy without `ec2:StopInstances`, a BMC account
//! without the role to reset) or holds the call past `--instance-provider-timeout`. Over a
//! window of the backoff's schedule, the calls that reach the provider, the Node's writes and
//! the Events are counted: at most one call per backoff step, one Event with a count.
//!
//! The window is real time: the controller's due times are wall-clock, as on a cluster.

use std::time::Duration;

use anyhow::{Result, ensure};
use k8s_openapi::api::core::v1::Node;
use kube::api::PostParams;
use kube::{Api, Client};
use kube_sim::KubeSim;
use nodegrace_testing::storms::{Storm, spawn_program};
use out_of_service_gc::fencing::PROVIDER_BACKOFF;
use provider_testbed::interposer::Mode;
use provider_testbed::moto::InterposedEc2;
use provider_testbed::sushy::InterposedBmc;
use serde_json::json;
use tokio::process::Child;

use crate::common::*;

const BINARY: &str = env!("CARGO_BIN_EXE_out-of-service-gc");
/// Long enough for the first retry (10 s, plus a tenth) and short of the second (at 30 s).
const OBSERVED: Duration = Duration::from_secs(24);

fn start(sim: &KubeSim, provider: &[String]) -> Result<Child> {
    let flags: Vec<String> = ["--fence-after=1s", "--liveness-guard-window=1s"]
        .into_iter()
        .map(str::to_owned)
        .chain(provider.iter().cloned())
        .collect();
    spawn_program(BINARY, sim.kubeconfig_path(), &flags)
}

/// The story every refusal must tell: the node goes NotReady, the first call fails; from then
/// on, over [`OBSERVED`], the provider gets at most one call per backoff step, the Node few
/// writes (per try at most: a step written and put back, the condition, one more for the
/// Event's count landing on a write of its own), and the failures one Event (`reason`) whose
/// count grows.
async fn on_the_schedule(
    client: &Client,
    calls: &dyn Fn() -> usize,
    what: &str,
    reason: &str,
) -> Result<()> {
    let storm = Storm {
        client,
        node: "hung",
        what,
        reason,
        observed: OBSERVED,
        tries: 2..=PROVIDER_BACKOFF.tries_within(OBSERVED),
        writes_per_try: 4,
    };
    storm.judge(calls, stop_kubelet(client, "hung")).await?;
    Ok(())
}

/// A power-off that never went through: the node is not tainted.
async fn not_tainted(client: &Client) -> Result<()> {
    let node = Api::<Node>::all(client.clone()).get("hung").await?;
    ensure!(!has_taint(&node), "tainted without a power-off");
    Ok(())
}

/// One EC2 machine under the node `hung`, reached through an interposer, and the controller
/// fencing with `flags` more.
struct Ec2 {
    machine: InterposedEc2,
    client: Client,
    _sim: KubeSim,
    _program: Child,
}

impl Ec2 {
    async fn start(mode: Mode, flags: &[&str]) -> Result<Self> {
        let machine = InterposedEc2::start(mode).await?;
        let sim = sim(0, world()).await?;
        let client = sim.client();
        machine_node(&client, "hung", &machine.provider_id(), None).await?;
        all_ready(&client, 1).await?;
        let args: Vec<String> = machine
            .flags()
            .into_iter()
            .chain(flags.iter().map(|flag| (*flag).to_owned()))
            .collect();
        let program = start(&sim, &args)?;
        Ok(Self {
            machine,
            client,
            _sim: sim,
            _program: program,
        })
    }

    fn calls(&self, action: &str) -> usize {
        self.machine.interposer.calls(action)
    }

    async fn state(&self) -> Result<Option<String>> {
        self.machine.state().await
    }
}

async fn ec2_power_off(mode: Mode) -> Result<()> {
    let ec2 = Ec2::start(mode, &[]).await?;
    let stops = || ec2.calls("StopInstances");
    on_the_schedule(&ec2.client, &stops, "StopInstances", "FenceFailed").await?;
    not_tainted(&ec2.client).await?;
    ensure!(ec2.state().await?.as_deref() == Some("running"));
    Ok(())
}

/// The outside check's history: an IAM policy without `ec2:StopInstances` (91 calls in 12 s
/// before).
#[tokio::test]
async fn a_refused_ec2_power_off_is_retried_on_the_backoffs_schedule() -> Result<()> {
    ec2_power_off(Mode::Refuse("StopInstances".to_owned())).await
}

/// EC2 that does not answer a StopInstances within `--instance-provider-timeout`.
#[tokio::test]
async fn an_ec2_power_off_that_hangs_is_retried_on_the_backoffs_schedule() -> Result<()> {
    ec2_power_off(Mode::Hang("StopInstances".to_owned())).await
}

/// EC2 refusing `DescribeInstances` (an IAM policy without it): the fence cannot ask whether
/// the machine is known and is held (`FenceHeldProvider`), asked again on the backoff.
#[tokio::test]
async fn a_refused_ec2_state_read_is_retried_on_the_backoffs_schedule() -> Result<()> {
    ec2_state_read(Mode::Refuse("DescribeInstances".to_owned())).await
}

/// EC2 that does not answer `DescribeInstances` within `--instance-provider-timeout`.
#[tokio::test]
async fn an_ec2_state_read_that_hangs_is_retried_on_the_backoffs_schedule() -> Result<()> {
    ec2_state_read(Mode::Hang("DescribeInstances".to_owned())).await
}

async fn ec2_state_read(mode: Mode) -> Result<()> {
    let ec2 = Ec2::start(mode, &[]).await?;
    let reads = || ec2.calls("DescribeInstances");
    on_the_schedule(
        &ec2.client,
        &reads,
        "DescribeInstances",
        "FenceHeldProvider",
    )
    .await?;
    ensure!(ec2.calls("StopInstances") == 0, "powered off unasked");
    ensure!(ec2.state().await?.as_deref() == Some("running"));
    Ok(())
}

/// The machine fenced and the node clean, EC2 refuses `StartInstances`: the recovery's
/// power-on is tried again on the backoff, not on each of its own writes (the step put back
/// to `fenced` wakes the cleanup).
#[tokio::test]
async fn a_refused_ec2_power_on_is_retried_on_the_backoffs_schedule() -> Result<()> {
    ec2_power_on(Mode::Refuse("StartInstances".to_owned())).await
}

/// EC2 that does not answer `StartInstances` within `--instance-provider-timeout`.
#[tokio::test]
async fn an_ec2_power_on_that_hangs_is_retried_on_the_backoffs_schedule() -> Result<()> {
    ec2_power_on(Mode::Hang("StartInstances".to_owned())).await
}

async fn ec2_power_on(mode: Mode) -> Result<()> {
    let flags = ["--auto-untaint=true", "--recover-after-cleanup=true"];
    let ec2 = Ec2::start(mode, &flags).await?;
    let starts = || ec2.calls("StartInstances");
    on_the_schedule(&ec2.client, &starts, "StartInstances", "PowerOnFailed").await?;
    ensure!(ec2.state().await?.as_deref() == Some("stopped"));
    Ok(())
}

/// What a Redfish storm test counts, and the Event that says each failure.
#[derive(Clone, Copy)]
enum Counted {
    PowerOffs,
    PowerOns,
    Reads,
}

async fn redfish_storm(mode: Mode, counted: Counted) -> Result<()> {
    let bmc = InterposedBmc::start("hung", mode).await?;
    let sim = sim(0, world()).await?;
    let client = sim.client();
    let node = serde_json::from_value(json!({
        "metadata": {"name": "hung", "labels": {"kubernetes.io/hostname": "hung"}},
        "spec": {"providerID": "redfish:///hung"},
    }))?;
    Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node)
        .await?;
    all_ready(&client, 1).await?;
    let mut flags = vec![
        "--instance-provider=redfish".to_owned(),
        format!("--redfish-config={}", bmc.config.display()),
    ];
    if matches!(counted, Counted::PowerOns) {
        flags.extend(["--auto-untaint=true", "--recover-after-cleanup=true"].map(str::to_owned));
    }
    let _program = start(&sim, &flags)?;
    match counted {
        Counted::PowerOffs => {
            let resets = || bmc.resets_of("ForceOff");
            on_the_schedule(&client, &resets, "ForceOff", "FenceFailed").await?;
            not_tainted(&client).await
        }
        Counted::PowerOns => {
            let resets = || bmc.resets_of("On");
            on_the_schedule(&client, &resets, "On", "PowerOnFailed").await
        }
        Counted::Reads => {
            let reads = || bmc.reads();
            on_the_schedule(&client, &reads, "system read", "FenceHeldProvider").await?;
            ensure!(bmc.resets() == 0, "reset without a state");
            not_tainted(&client).await
        }
    }
}

/// A BMC account whose role may read but not reset.
#[tokio::test]
async fn a_refused_redfish_reset_is_retried_on_the_backoffs_schedule() -> Result<()> {
    redfish_storm(
        Mode::Refuse("ComputerSystem.Reset".to_owned()),
        Counted::PowerOffs,
    )
    .await
}

/// A BMC that does not answer the reset within `--instance-provider-timeout`.
#[tokio::test]
async fn a_redfish_reset_that_hangs_is_retried_on_the_backoffs_schedule() -> Result<()> {
    redfish_storm(
        Mode::Hang("ComputerSystem.Reset".to_owned()),
        Counted::PowerOffs,
    )
    .await
}

/// The machine fenced and the node clean, the BMC refuses the power-on (`"On"` in the reset's
/// body): the recovery tries again on the backoff.
#[tokio::test]
async fn a_refused_redfish_power_on_is_retried_on_the_backoffs_schedule() -> Result<()> {
    redfish_storm(Mode::Refuse("\"On\"".to_owned()), Counted::PowerOns).await
}

/// The power-on held unanswered past `--instance-provider-timeout`.
#[tokio::test]
async fn a_redfish_power_on_that_hangs_is_retried_on_the_backoffs_schedule() -> Result<()> {
    redfish_storm(Mode::Hang("\"On\"".to_owned()), Counted::PowerOns).await
}

/// A BMC refusing the system's reads: no state, so no power-off, and the reads held on the
/// backoff.
#[tokio::test]
async fn a_refused_redfish_state_read_is_retried_on_the_backoffs_schedule() -> Result<()> {
    redfish_storm(
        Mode::Refuse("/redfish/v1/Systems/".to_owned()),
        Counted::Reads,
    )
    .await
}

/// A BMC that does not answer the system's reads.
#[tokio::test]
async fn a_redfish_state_read_that_hangs_is_retried_on_the_backoffs_schedule() -> Result<()> {
    redfish_storm(
        Mode::Hang("/redfish/v1/Systems/".to_owned()),
        Counted::Reads,
    )
    .await
}
