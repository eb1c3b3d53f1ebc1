//! Leader election against kube-sim's Leases, and the sim provider against its cloud.

use std::time::Duration;

use anyhow::{Result, ensure};
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::PostParams;
use kube_sim::{KubeSim, SimOptions, WorldOptions};
use nodegrace_controller::leader::{LeaderConfig, Leadership};
use nodegrace_testing::wait_for;
use tokio_util::sync::CancellationToken;

async fn sim_with_node() -> Result<KubeSim> {
    let sim = KubeSim::start(SimOptions {
        world: WorldOptions::none(),
        ..SimOptions::default()
    })
    .await?;
    Api::<Node>::all(sim.client())
        .create(
            &PostParams::default(),
            &serde_json::from_value(kube_sim::populate::node("n1"))?,
        )
        .await?;
    Ok(sim)
}

#[tokio::test]
async fn one_leader_at_a_time_and_resigning_hands_over() -> Result<()> {
    let sim = sim_with_node().await?;
    let config = |identity: &str| LeaderConfig {
        namespace: "default".into(),
        lease_name: "nodegrace-test".into(),
        identity: identity.into(),
        lease_duration_seconds: 3,
        renew_margin_seconds: 1,
    };
    let a = Leadership::start(sim.client(), &config("a")).await?;
    wait_for("a to lead", || async { Ok(a.is_leader()) }).await?;
    let mut b = Leadership::start(sim.client(), &config("b")).await?;
    ensure!(!b.is_leader(), "two leaders at once");
    a.resign().await;
    let stop = CancellationToken::new();
    let acted = std::sync::atomic::AtomicBool::new(false);
    let led = tokio::time::timeout(
        Duration::from_secs(15),
        b.run_while_leader(&stop, |acting| {
            acted.store(true, std::sync::atomic::Ordering::SeqCst);
            let stop = stop.clone();
            async move {
                stop.cancel();
                acting.cancelled().await;
            }
        }),
    )
    .await;
    // Only work that ran proves b led: a dead lease task also ends `run_while_leader`.
    ensure!(
        matches!(led, Ok(Ok(()))),
        "b's candidacy ended badly: {led:?}"
    );
    ensure!(
        acted.load(std::sync::atomic::Ordering::SeqCst),
        "b never acted"
    );
    let lease =
        Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(sim.client(), "default")
            .get("nodegrace-test")
            .await?;
    let holder = lease.spec.and_then(|spec| spec.holder_identity);
    ensure!(holder.as_deref() == Some("b"), "the Lease names {holder:?}");
    Ok(())
}

#[tokio::test]
async fn the_sim_instance_provider_reads_and_terminates_machines() -> Result<()> {
    use nodegrace_controller::instances::{
        InstanceProvider, InstanceState, ProviderId, SimInstances,
    };
    let sim = KubeSim::start(SimOptions {
        nodes: 1,
        ..SimOptions::default()
    })
    .await?;
    let provider = SimInstances::new(sim.client());
    let node = Api::<Node>::all(sim.client()).get("node-0").await?;
    let id = ProviderId::of(&node)?;
    ensure!(provider.state(&id).await? == InstanceState::Running);
    sim.world().cloud().set_power("node-0", false);
    ensure!(provider.state(&id).await? == InstanceState::Stopped);
    provider.terminate(&id).await?;
    provider.terminate(&id).await?;
    ensure!(provider.state(&id).await? == InstanceState::Terminated);
    let calls = sim
        .world()
        .cloud()
        .instances()
        .into_iter()
        .find(|instance| instance.id == "node-0")
        .map(|instance| instance.terminate_calls);
    ensure!(calls == Some(2), "{calls:?}");
    let unknown = ProviderId::new("sim:///no-such-node");
    ensure!(provider.state(&unknown).await? == InstanceState::NotFound);
    let other = provider.state(&ProviderId::new("aws:///i-1")).await;
    ensure!(other.is_err_and(|error| error.to_string().contains("unknown scheme")));
    Ok(())
}

/// A replica starting while the API server fails every Lease request waits for it instead of
/// exiting (the explorer's seed 31 saw a restarted replica end on an injected 500).
#[tokio::test]
async fn joining_the_election_waits_out_a_failing_api_server() -> Result<()> {
    use kube_sim::faults::{ErrorRule, FailureKind};

    let sim = sim_with_node().await?;
    let config = LeaderConfig {
        namespace: "default".into(),
        lease_name: "nodegrace-test".into(),
        identity: "a".into(),
        lease_duration_seconds: 3,
        renew_margin_seconds: 1,
    };
    sim.faults().add_rule(ErrorRule {
        verb: String::new(),
        resource: "leases".into(),
        rate: 1.0,
        failure: FailureKind::InternalError,
    });
    let client = sim.client_without_retries().await?;
    let joining = tokio::spawn(async move { Leadership::start(client, &config).await });
    // Failing fast would end the task at the first 500; it keeps trying instead.
    wait_for("a failed attempt", || async {
        Ok(sim.faults().failed() > 0)
    })
    .await?;
    ensure!(!joining.is_finished(), "the start gave up on a 500");
    sim.faults().clear();
    let joined = tokio::time::timeout(Duration::from_secs(15), joining).await??;
    ensure!(joined.is_ok(), "{:?}", joined.err());
    Ok(())
}
