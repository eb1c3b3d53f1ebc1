//! `cargo xtask e2e`: the charts installed with the real helm into a fresh kube-sim, their
//! pods run by kube-sim as processes of the built binaries (the tests' dev profile) under
//! their ServiceAccounts' RBAC, then the scenarios. Each run is the demo binary (`nodegrace-demo`) with a choice of
//! charts and acts, so the scenarios are written once, against the cluster's kubeconfig:
//! - each chart alone: installed, its pods Ready;
//! - all four together: every act of the story (shutdown by priority, a Lease blocking
//!   shutdown, out-of-service failover, `kubectl delete node` under budgets with the webhook
//!   reached through its Service, leader failover by deleting the leader pod);
//! - uninstall: termination-controller's pre-delete hook releases every node;
//! - least privilege: every rule of every chart's Roles and ClusterRoles removed, one at a
//!   time, in a fresh cluster: the chart's scenario must get the API server's 403 for it;
//! - real instance providers: the built termination-controller terminating the machines of
//!   deleted nodes through `aws` (moto), `redfish` (sushy-tools' emulator) and `cluster-api` (a
//!   management kube-sim), one line each.
//!
//! `--target kind` runs the scenarios a kind cluster can show instead (see `kind.rs`).

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use clap::{Args, ValueEnum};

use crate::demo::{self, Binaries, Prepared};
use crate::{cargo, kind, project_root};

const CHARTS: [&str; 4] = [
    "shutdown-inhibitor-agent",
    "graceful-shutdown-agent",
    "out-of-service-gc",
    "termination-controller",
];

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Target {
    /// A fresh kube-sim per run, a real elogind per node (needs root).
    #[default]
    Sim,
    /// A kind cluster (needs Docker, kind and the images).
    Kind,
}

#[derive(Debug, Default, Args)]
pub struct E2eArgs {
    #[arg(long, value_enum, default_value_t = Target::Sim)]
    target: Target,
    /// With --target kind: run on this cluster instead of creating one (the images must be
    /// pullable or already loaded on its nodes).
    #[arg(long, requires = "target")]
    kubeconfig: Option<PathBuf>,
    /// With --target kind: leave the cluster this run created.
    #[arg(long)]
    keep: bool,
}

pub fn run(args: &E2eArgs) -> Result<()> {
    match args.target {
        Target::Sim if args.kubeconfig.is_some() || args.keep => {
            bail!("--kubeconfig and --keep go with --target kind")
        }
        Target::Sim => sim(Binaries::Build),
        Target::Kind => kind::run(&kind::KindOptions {
            kubeconfig: args.kubeconfig.clone(),
            keep: args.keep,
        }),
    }
}

/// One run's name, how long it took, and what it showed.
struct Outcome {
    scenario: String,
    took: Duration,
}

/// The scenarios on kube-sim with the binaries the test command's test build left.
pub fn run_after_tests() -> Result<()> {
    sim(Binaries::TestsBuilt)
}

fn sim(binaries: Binaries) -> Result<()> {
    let prepared = demo::prepare(binaries)?;
    let work = crate::target_dir().join("e2e");
    let mut outcomes = Vec::new();
    for chart in CHARTS {
        let scenario = format!("{chart} alone: helm install, pods Ready");
        let took = expect_success(
            &prepared,
            &scenario,
            &[
                "--chart",
                chart,
                "--install-only",
                "--work-dir",
                &work.join(chart).display().to_string(),
            ],
        )?;
        outcomes.push(Outcome { scenario, took });
    }
    let scenario =
        "termination-controller uninstalled: every node released, a later delete completes"
            .to_owned();
    let took = expect_success(
        &prepared,
        &scenario,
        &[
            "--chart",
            "termination-controller",
            "--act",
            "uninstall",
            "--work-dir",
            &work.join("uninstall").display().to_string(),
        ],
    )?;
    outcomes.push(Outcome { scenario, took });
    let scenario = "all four charts: every act of the story".to_owned();
    let took = expect_success(
        &prepared,
        &scenario,
        &["--work-dir", &work.join("all").display().to_string()],
    )?;
    outcomes.push(Outcome { scenario, took });
    let scenario =
        "least privilege: each chart's RBAC rules removed one at a time, each refused in its scenario"
            .to_owned();
    let took = expect_success(
        &prepared,
        &scenario,
        &[
            "--least-privilege",
            "--work-dir",
            &work.join("least-privilege").display().to_string(),
        ],
    )?;
    outcomes.push(Outcome { scenario, took });
    let providers = instance_providers()?;
    println!("\n==> e2e on kube-sim: every scenario passed");
    for outcome in &outcomes {
        println!("{:>7.1}s  {}", outcome.took.as_secs_f64(), outcome.scenario);
    }
    for line in providers {
        println!("{line}");
    }
    Ok(())
}

/// The node-termination scenario per real instance provider against its protocol's server
/// (termination-controller's `providers` tests), with the built binary; their lines.
fn instance_providers() -> Result<Vec<String>> {
    println!("\n==> e2e: termination through each real instance provider (the built binary)");
    let binary = demo::binary("termination-controller");
    let output = cargo()
        .current_dir(project_root())
        // The workspace's feature unification, as the tests' build had it: nothing rebuilt.
        .args([
            "nextest",
            "run",
            "--workspace",
            "-E",
            "package(termination-controller) and binary(providers)",
            "--no-fail-fast",
            "--success-output",
            "immediate",
            "--failure-output",
            "immediate",
        ])
        .env("NODEGRACE_E2E_TERMINATION_CONTROLLER", &binary)
        .output()?;
    // nextest shows a test's output on stderr, its own summary on stdout.
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    print!("{printed}");
    if !output.status.success() {
        bail!("the instance providers' scenario failed");
    }
    let lines: Vec<String> = printed
        .lines()
        .map(str::trim)
        .filter(|line| line.starts_with("provider "))
        .map(str::to_owned)
        .collect();
    if lines.len() != 3 {
        bail!("expected a line per provider (aws, redfish, cluster-api), got {lines:?}");
    }
    Ok(lines)
}

fn demo_command(prepared: &Prepared, args: &[&str]) -> Command {
    let mut command = Command::new(&prepared.demo);
    command
        .current_dir(project_root())
        .arg("--helm")
        .arg(&prepared.helm)
        .args(args);
    command
}

fn expect_success(prepared: &Prepared, scenario: &str, args: &[&str]) -> Result<Duration> {
    println!("\n==> e2e: {scenario}");
    let started = Instant::now();
    let status = demo_command(prepared, args).status()?;
    if !status.success() {
        bail!("e2e scenario `{scenario}` failed ({status})");
    }
    Ok(started.elapsed())
}
