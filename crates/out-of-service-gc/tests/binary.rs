//! The binary as an operator runs it: its help, its environment variables, its errors.

use std::process::Command;

use out_of_service_gc::app::PROGRAM;
use out_of_service_gc::cli::Args;
use out_of_service_gc::metrics::Metrics;

const BINARY: &str = env!("CARGO_BIN_EXE_out-of-service-gc");

#[test]
fn the_api_limits_default_to_one_node_in_one_burst() -> anyhow::Result<()> {
    nodegrace_testing::check_help_states(
        BINARY,
        &[
            "[default: 100]",
            "[default: 300]",
            "[default: true]",
            "[default: none]",
        ],
    )
}

#[test]
fn bad_durations_and_provider_options_name_the_flag() -> anyhow::Result<()> {
    let output = Command::new(BINARY)
        .args(["--auto-taint-after=soon"])
        .output()?;
    let stderr = String::from_utf8(output.stderr)?;
    anyhow::ensure!(output.status.code() == Some(2), "{stderr}");
    anyhow::ensure!(stderr.contains("--auto-taint-after"), "{stderr}");

    let runtime = tokio::runtime::Runtime::new()?;
    let sim = runtime.block_on(kube_sim::KubeSim::start(kube_sim::SimOptions::default()))?;
    let output = Command::new(BINARY)
        .arg(format!("--kubeconfig={}", sim.kubeconfig_path().display()))
        .args(["--admin-listen=127.0.0.1:0", "--instance-provider=exec"])
        .output()?;
    let stderr = String::from_utf8(output.stderr)?;
    anyhow::ensure!(output.status.code() == Some(1), "{stderr}");
    anyhow::ensure!(
        stderr.contains("--instance-provider=exec needs --instance-provider-command"),
        "{stderr}"
    );
    let output = Command::new(BINARY)
        .arg(format!("--kubeconfig={}", sim.kubeconfig_path().display()))
        .args([
            "--admin-listen=127.0.0.1:0",
            "--instance-provider=cluster-api",
        ])
        .output()?;
    let stderr = String::from_utf8(output.stderr)?;
    anyhow::ensure!(output.status.code() == Some(1), "{stderr}");
    anyhow::ensure!(stderr.contains("has no power state"), "{stderr}");
    Ok(())
}

/// Fencing that could not work is refused at start, naming the flag and what to set.
#[test]
fn fencing_without_a_way_to_fence_is_refused_naming_the_fix() -> anyhow::Result<()> {
    let runtime = tokio::runtime::Runtime::new()?;
    let sim = runtime.block_on(kube_sim::KubeSim::start(kube_sim::SimOptions::default()))?;
    let kubeconfig = format!("--kubeconfig={}", sim.kubeconfig_path().display());
    for (flags, says) in [
        (
            &["--fence-after=5m"][..],
            "--fence-after cannot fence: there is no --instance-provider",
        ),
        (
            &[
                "--fence-after=5m",
                "--instance-provider=exec",
                "--instance-provider-command=/bin/true",
            ][..],
            "--instance-provider=exec has verbs for state and terminate only, no power-off",
        ),
        (
            &["--recover-after-cleanup=true"][..],
            "--recover-after-cleanup powers on machines that --fence-after powered off",
        ),
        (
            &[
                "--fence-after=5m",
                "--instance-provider=sim",
                "--recover-after-cleanup=true",
            ][..],
            "--recover-after-cleanup needs --auto-untaint=true",
        ),
        (
            &["--fence-after=500ms", "--instance-provider=sim"][..],
            "--fence-after must be at least 1s",
        ),
        (
            &[
                "--fence-after=5m",
                "--instance-provider=sim",
                "--max-fenced=0",
            ][..],
            "--max-fenced 0 would never fence",
        ),
        (
            &[
                "--fence-after=5m",
                "--instance-provider=sim",
                "--not-ready-max-fraction=2",
            ][..],
            "--not-ready-max-fraction must be a fraction from 0 to 1",
        ),
    ] {
        let output = Command::new(BINARY)
            .args([kubeconfig.as_str(), "--admin-listen=127.0.0.1:0"])
            .args(flags)
            .output()?;
        let stderr = String::from_utf8(output.stderr)?;
        anyhow::ensure!(output.status.code() == Some(1), "{flags:?}: {stderr}");
        anyhow::ensure!(stderr.contains(says), "{flags:?}: {stderr}");
    }
    Ok(())
}

nodegrace_testing::operator_checks! {
    program: PROGRAM,
    binary: BINARY,
    args: Args,
    metrics: Metrics,
    admin_port: nodegrace_core::cli::ports::OUT_OF_SERVICE_GC,
    error_args: &[],
}
