//! The binary as an operator runs it: its help, its environment variables, its errors.

use std::path::Path;
use std::process::Command;

use termination_controller::app::PROGRAM;
use termination_controller::cli::Args;
use termination_controller::metrics::Metrics;

const BINARY: &str = env!("CARGO_BIN_EXE_termination-controller");

#[test]
fn help_states_the_defaults_the_docs_promise() -> anyhow::Result<()> {
    nodegrace_testing::check_help_states(
        BINARY,
        &[
            "--eviction-qps <EVICTION_QPS>",
            "[default: 50]",
            "[default: 100]",
            "[default: 16]",
            "[default: 100ms]",
            "[default: 10s]",
            "[default: 5m]",
            "[default: none]",
            "--drain-timeout",
            "--not-ready-timeout",
            "--node-selector",
        ],
    )
}

#[test]
fn bad_flags_name_the_flag_and_the_fix() -> anyhow::Result<()> {
    for (flag, expected) in [
        ("--drain-timeout=soon", "--drain-timeout"),
        ("--node-selector=zone in x", "key in (a,b)"),
    ] {
        let output = Command::new(BINARY).arg(flag).output()?;
        let stderr = String::from_utf8(output.stderr)?;
        anyhow::ensure!(output.status.code() == Some(2), "{flag}: {stderr}");
        anyhow::ensure!(stderr.contains(expected), "{flag}: {stderr}");
    }
    let runtime = tokio::runtime::Runtime::new()?;
    let sim = runtime.block_on(kube_sim::KubeSim::start(kube_sim::SimOptions::default()))?;
    for (flags, expected) in [
        (
            &["--eviction-qps=0"][..],
            "--eviction-qps must be a positive number",
        ),
        (
            &["--eviction-burst=0"][..],
            "--eviction-burst must be at least 1",
        ),
        (
            &["--eviction-backoff-min=20s", "--eviction-backoff-max=10s"][..],
            "--eviction-backoff-min must be more than 0 and at most --eviction-backoff-max",
        ),
        (
            &["--instance-provider=exec"][..],
            "--instance-provider=exec needs --instance-provider-command",
        ),
        (
            &["--instance-provider=aws"][..],
            "no AWS credentials: set AWS_ACCESS_KEY_ID",
        ),
        (
            &[
                "--instance-provider=aws",
                "--aws-endpoint-url=http://127.0.0.1:1",
            ][..],
            "--aws-endpoint-url needs the region it serves: set --aws-region",
        ),
        (
            &[
                "--instance-provider=sim",
                "--aws-endpoint-url=http://127.0.0.1:1",
            ][..],
            "--aws-endpoint-url is only used with --instance-provider=aws",
        ),
        (
            &["--instance-provider=redfish"][..],
            "--instance-provider=redfish needs --redfish-config",
        ),
        (
            &[
                "--instance-provider=redfish",
                "--redfish-config=/no/such/map.yaml",
            ][..],
            "cannot read the config file /no/such/map.yaml",
        ),
        (
            &[
                "--instance-provider=cluster-api",
                "--cluster-api-kubeconfig=/no/such/kubeconfig",
            ][..],
            "--cluster-api-kubeconfig",
        ),
    ] {
        let output = Command::new(BINARY)
            .arg(format!("--kubeconfig={}", sim.kubeconfig_path().display()))
            .arg("--admin-listen=127.0.0.1:0")
            .args(flags)
            .env_remove("AWS_ACCESS_KEY_ID")
            .env_remove("AWS_WEB_IDENTITY_TOKEN_FILE")
            .env_remove("AWS_CONTAINER_CREDENTIALS_FULL_URI")
            .env_remove("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI")
            .env_remove("AWS_REGION")
            .output()?;
        let stderr = String::from_utf8(output.stderr)?;
        anyhow::ensure!(output.status.code() == Some(1), "{flags:?}: {stderr}");
        anyhow::ensure!(stderr.contains(expected), "{flags:?}: {stderr}");
    }
    Ok(())
}

#[test]
fn the_charts_crds_are_the_ones_the_types_generate() -> anyhow::Result<()> {
    let directory =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../charts/termination-controller/crds");
    for (file, generated) in termination_controller::api::crds_yaml() {
        let path = directory.join(file);
        let shipped = std::fs::read_to_string(&path)?;
        anyhow::ensure!(
            shipped == generated,
            "{} is stale: run `cargo xtask crd`",
            path.display()
        );
    }
    Ok(())
}

nodegrace_testing::operator_checks! {
    program: PROGRAM,
    binary: BINARY,
    args: Args,
    metrics: Metrics,
    admin_port: nodegrace_core::cli::ports::TERMINATION_CONTROLLER,
    error_args: &[],
}
