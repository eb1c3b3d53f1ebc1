//! The `redfish` instance provider against sushy-tools' Redfish emulator (fake driver: power
//! changes land 1 to 11 s after the request), over TLS with basic auth; Debian's
//! `fence_redfish` reads the same power states as ours.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use nodegrace_controller::instances::redfish::{MachineConfig, RedfishConfig};
use nodegrace_controller::instances::{
    InstanceError, InstanceProvider, InstanceState, Power, ProviderId, RedfishInstances,
};
use nodegrace_testing::wait_for;
use provider_testbed::sushy::{PASSWORD, Sushy, System, USERNAME};

fn entry(sushy: &Sushy, system: &System) -> MachineConfig {
    MachineConfig {
        node: Some(system.name.clone()),
        provider_id: None,
        endpoint: sushy.url.clone(),
        system: system.path(),
        credentials: sushy.credentials(),
        ca_bundle: Some(sushy.ca_bundle()),
        insecure_skip_verify: false,
    }
}

fn provider(machines: Vec<MachineConfig>) -> Result<RedfishInstances> {
    Ok(RedfishInstances::new(
        RedfishConfig { machines },
        "test",
        Duration::from_secs(10),
    )?)
}

fn node(system: &System) -> ProviderId {
    ProviderId::new(format!("redfish:///{}", system.name)).read_from(&system.name)
}

/// What `fence_redfish -o status` says of the system: ON or OFF.
async fn fence_agent_status(sushy: &Sushy, system: &System) -> Result<String> {
    let port = sushy
        .url
        .rsplit(':')
        .next()
        .context("the emulator's port")?;
    let output = tokio::process::Command::new("fence_redfish")
        .args([
            "--ip=127.0.0.1",
            &format!("--ipport={port}"),
            "--ssl-insecure",
        ])
        .args([
            &format!("--username={USERNAME}"),
            &format!("--password={PASSWORD}"),
        ])
        .arg(format!("--systems-uri={}", system.path()))
        .arg("--action=status")
        .output()
        .await
        .context("run fence_redfish (Debian's fence-agents; cargo xtask test installs it)")?;
    let said = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    said.strip_prefix("Status: ")
        .map(str::to_owned)
        .with_context(|| {
            format!(
                "fence_redfish said {said:?} {}",
                String::from_utf8_lossy(&output.stderr)
            )
        })
}

#[tokio::test]
async fn power_is_read_and_forced_off_and_on_as_the_fence_agent_sees_it() -> Result<()> {
    let systems = [System::new(1, true), System::new(2, true)];
    let sushy = Sushy::start(&systems, false).await?;
    let redfish = provider(systems.iter().map(|s| entry(&sushy, s)).collect())?;
    let (first, second) = (node(&systems[0]), node(&systems[1]));
    ensure!(redfish.state(&first).await? == InstanceState::Running);
    ensure!(fence_agent_status(&sushy, &systems[0]).await? == "ON");

    // Terminating bare metal is ForceOff; the end is read from PowerState, which changes only
    // after the emulator's delay.
    redfish.terminate(&first).await?;
    ensure!(redfish.terminated_as() == InstanceState::Stopped);
    wait_for("the machine off", || async {
        Ok(redfish.state(&first).await? == InstanceState::Stopped)
    })
    .await?;
    ensure!(fence_agent_status(&sushy, &systems[0]).await? == "OFF");
    ensure!(
        redfish.state(&second).await? == InstanceState::Running,
        "the other machine was touched"
    );

    redfish.power(&first, Power::On).await?;
    wait_for("the machine on", || async {
        Ok(redfish.state(&first).await? == InstanceState::Running)
    })
    .await?;
    ensure!(fence_agent_status(&sushy, &systems[0]).await? == "ON");
    Ok(())
}

#[tokio::test]
async fn a_refused_power_off_wrong_credentials_or_an_unknown_ca_hold_the_node() -> Result<()> {
    let system = System::new(1, true);
    let sushy = Sushy::start(std::slice::from_ref(&system), true).await?;
    let id = node(&system);

    let refused = provider(vec![entry(&sushy, &system)])?;
    let error = refused.terminate(&id).await.unwrap_err();
    ensure!(matches!(error, InstanceError::Refused(_)), "{error}");
    ensure!(error.to_string().contains("DISABLE_POWER_OFF"), "{error}");

    let wrong = tempfile::tempdir()?;
    std::fs::write(wrong.path().join("username"), USERNAME)?;
    std::fs::write(wrong.path().join("password"), "not-the-password")?;
    let unauthorized = provider(vec![MachineConfig {
        credentials: wrong.path().to_owned(),
        ..entry(&sushy, &system)
    }])?;
    let error = unauthorized.state(&id).await.unwrap_err();
    ensure!(matches!(error, InstanceError::Refused(_)), "{error}");
    ensure!(
        error.to_string().contains("refused the credentials"),
        "{error}"
    );

    // The emulator's certificate does not chain to the public roots.
    let untrusted = provider(vec![MachineConfig {
        ca_bundle: None,
        ..entry(&sushy, &system)
    }])?;
    let error = untrusted.state(&id).await.unwrap_err();
    ensure!(matches!(error, InstanceError::Transient(_)), "{error}");
    ensure!(error.to_string().contains("cannot be reached"), "{error}");
    // Skipping verification is an explicit opt-in, and then it works.
    let skipping = provider(vec![MachineConfig {
        ca_bundle: None,
        insecure_skip_verify: true,
        ..entry(&sushy, &system)
    }])?;
    ensure!(skipping.state(&id).await? == InstanceState::Running);

    let missing = provider(vec![MachineConfig {
        system: "/redfish/v1/Systems/no-such-system".to_owned(),
        ..entry(&sushy, &system)
    }])?;
    let error = missing.state(&id).await.unwrap_err();
    ensure!(matches!(error, InstanceError::Refused(_)), "{error}");
    ensure!(error.to_string().contains("no such system"), "{error}");

    let closed = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let unreachable = provider(vec![MachineConfig {
        endpoint: format!("https://{closed}"),
        ..entry(&sushy, &system)
    }])?;
    let error = unreachable.state(&id).await.unwrap_err();
    ensure!(matches!(error, InstanceError::Transient(_)), "{error}");
    ensure!(
        error.to_string().contains(&format!("BMC https://{closed}")),
        "{error}"
    );
    Ok(())
}

#[tokio::test]
async fn the_map_file_is_read_with_its_errors_naming_the_entry() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let map = dir.path().join("redfish.yaml");
    std::fs::write(
        &map,
        "machines:\n- node: bm-1\n  endpoint: https://bmc-1.example\n  system: /redfish/v1/Systems/1\n  credentials: /no/such/secret\n",
    )?;
    let error = RedfishInstances::from_file(&map, Duration::from_secs(1))
        .unwrap_err()
        .to_string();
    ensure!(
        error.contains("machines[0].credentials: cannot read /no/such/secret/username"),
        "{error}"
    );
    std::fs::write(&map, "machines:\n- nodes: bm-1\n")?;
    let error = RedfishInstances::from_file(&map, Duration::from_secs(1))
        .unwrap_err()
        .to_string();
    ensure!(error.contains("unknown field `nodes`"), "{error}");
    ensure!(!Path::new("/no/such/secret").exists());
    Ok(())
}
