//! `cargo xtask e2e`: the charts installed with the real helm into a fresh kube-sim, their
//! pods run by kube-sim as processes of the release binaries under their ServiceAccounts'
//! RBAC, then the scenarios. Each run is the demo binary (`nodegrace-demo`) with a choice of
//! charts and acts, so the scenarios are written once, against the cluster's kubeconfig:
//! - each chart alone: installed, its pods Ready;
//! - all four together: every act of the story (shutdown by priority, a Lease blocking
//!   shutdown, out-of-service failover, `kubectl delete node` under budgets with the webhook
//!   reached through its Service, leader failover by deleting the leader pod);
//! - least privilege: the shutdown-inhibitor-agent installed without its ClusterRole's
//!   `nodes/status` rule must fail its act with the API server's 403.
//!
//! `--target kind` runs the scenarios a kind cluster can show instead (see `kind.rs`).

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use clap::{Args, ValueEnum};

use crate::demo::{self, Prepared};
use crate::{kind, project_root};

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
        Target::Sim => sim(),
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

fn sim() -> Result<()> {
    let prepared = demo::prepare()?;
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
    let scenario = "all four charts: every act of the story".to_owned();
    let took = expect_success(
        &prepared,
        &scenario,
        &["--work-dir", &work.join("all").display().to_string()],
    )?;
    outcomes.push(Outcome { scenario, took });
    let scenario =
        "least privilege: shutdown-inhibitor-agent without its nodes/status rule fails with 403"
            .to_owned();
    let took = expect_forbidden(&prepared, &work)?;
    outcomes.push(Outcome { scenario, took });
    println!("\n==> e2e on kube-sim: every scenario passed");
    for outcome in &outcomes {
        println!("{:>7.1}s  {}", outcome.took.as_secs_f64(), outcome.scenario);
    }
    Ok(())
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

/// The agent, its rule for `nodes/status` removed, cannot mark its node: the act fails and the
/// agent's log shows the API server's 403.
fn expect_forbidden(prepared: &Prepared, work: &std::path::Path) -> Result<Duration> {
    println!("\n==> e2e: least privilege (a rule removed must break the scenario)");
    let started = Instant::now();
    let output = demo_command(
        prepared,
        &[
            "--chart",
            "shutdown-inhibitor-agent",
            "--act",
            "lease-blocks-shutdown",
            "--without-rule",
            "shutdown-inhibitor-agent:nodes/status",
            "--work-dir",
            &work.join("least-privilege").display().to_string(),
        ],
    )
    .output()?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    print!("{stdout}");
    // The agent reads its node's status before it patches it: either refusal is the rule's.
    let refused = stdout.lines().any(|line| {
        line.contains("is forbidden: User \"system:serviceaccount:nodegrace:shutdown-inhibitor-agent\" cannot")
            && line.contains("resource \"nodes/status\" in API group \"\" at the cluster scope")
    });
    if output.status.success() {
        bail!(
            "the act passed without the nodes/status rule: the chart's RBAC is not what the agent needs"
        );
    }
    if !stdout.contains("FAILED act 1 (lease-blocks-shutdown)") || !refused {
        bail!(
            "the act failed, but not for the missing rule (no 403 for nodes/status in the agent's log):\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    println!("(expected) the act failed and the agent's log shows the 403");
    Ok(started.elapsed())
}
