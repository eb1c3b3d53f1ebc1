//! `cargo xtask e2e`: the charts installed with the real helm into a fresh kube-sim, their
//! pods run by kube-sim as processes of the built binaries (the tests' dev profile) under
//! their ServiceAccounts' RBAC, then the scenarios. Each run is the demo binary (`nodegrace-demo`) with a choice of
//! charts and acts, so the scenarios are written once, against the cluster's kubeconfig:
//! - each chart alone: installed, its pods Ready;
//! - all four together: every act of the story (shutdown by priority, a Lease blocking
//!   shutdown, out-of-service failover, `kubectl delete node` under budgets with the webhook
//!   reached through its Service, leader failover by deleting the leader pod, a drain through
//!   Kubernetes 1.37's EvictionRequests with a responder);
//! - uninstall: termination-controller's pre-delete hook releases every node;
//! - least privilege: every rule of every chart's Roles and ClusterRoles removed, one at a
//!   time, in a fresh cluster: the chart's scenario must get the API server's 403 for it;
//! - real instance providers: the built termination-controller terminating the machines of
//!   deleted nodes through `aws` (moto), `redfish` (sushy-tools' emulator) and `cluster-api` (a
//!   management kube-sim), one line each.
//!
//! `--target kind` runs the scenarios a kind cluster can show instead (see `kind.rs`).

use std::collections::VecDeque;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, mpsc};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
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

/// How many scenarios run at once. Each waits more than it computes (on its cluster's
/// processes, on their timers), so two cores take three.
const SCENARIOS_AT_ONCE: usize = 3;

/// A scenario to run: its name and the command that plays it.
struct Scenario {
    name: String,
    command: Command,
}

/// How a scenario's run ended.
struct Ran {
    name: String,
    took: Duration,
    passed: bool,
    log: String,
}

/// The scenarios on kube-sim with the binaries the test command's test build left.
pub fn run_after_tests() -> Result<()> {
    sim(Binaries::TestsBuilt)
}

fn sim(binaries: Binaries) -> Result<()> {
    let prepared = demo::prepare(binaries)?;
    let work = crate::target_dir().join("e2e");
    std::fs::create_dir_all(&work)?;
    let scenario = |name: String, run: &str, args: &[&str]| {
        let mut command = demo_command(&prepared, args);
        command
            .arg("--work-dir")
            .arg(work.join(run).display().to_string());
        Scenario { name, command }
    };
    // The longest first: the proofs of the two controllers' charts (most rules), the story,
    // the providers; the short runs fill in behind them.
    let mut scenarios: Vec<Scenario> = CHARTS
        .iter()
        .rev()
        .map(|chart| {
            scenario(
                format!(
                    "least privilege: {chart}'s RBAC rules removed one at a time, each refused in its scenario"
                ),
                &format!("least-privilege-{chart}"),
                &["--least-privilege", "--chart", chart],
            )
        })
        .collect();
    scenarios.insert(
        2,
        scenario(
            "all four charts: every act of the story".to_owned(),
            "all",
            &[],
        ),
    );
    scenarios.insert(
        3,
        Scenario {
            name: PROVIDERS.to_owned(),
            command: instance_providers(),
        },
    );
    scenarios.push(scenario(
        "termination-controller uninstalled: every node released, a later delete completes"
            .to_owned(),
        "uninstall",
        &["--chart", "termination-controller", "--act", "uninstall"],
    ));
    for chart in CHARTS {
        scenarios.push(scenario(
            format!("{chart} alone: helm install, pods Ready"),
            chart,
            &["--chart", chart, "--install-only"],
        ));
    }
    let ran = run_at_once(scenarios, &work)?;
    let failed: Vec<&str> = ran
        .iter()
        .filter(|run| !run.passed)
        .map(|run| run.name.as_str())
        .collect();
    if !failed.is_empty() {
        bail!("e2e scenarios failed: {}", failed.join("; "));
    }
    let providers = provider_lines(&ran)?;
    println!("\n==> e2e on kube-sim: every scenario passed ({SCENARIOS_AT_ONCE} at once)");
    for run in &ran {
        println!("{:>7.1}s  {}", run.took.as_secs_f64(), run.name);
    }
    for line in providers {
        println!("{line}");
    }
    Ok(())
}

/// Runs `scenarios`, [`SCENARIOS_AT_ONCE`] at a time, each one's output to a log of its own
/// in `logs`; prints each log as its scenario ends. Returns the runs in the listed order.
fn run_at_once(scenarios: Vec<Scenario>, logs: &Path) -> Result<Vec<Ran>> {
    let count = scenarios.len();
    let queue = Mutex::new(scenarios.into_iter().enumerate().collect::<VecDeque<_>>());
    let (ended, endings) = mpsc::channel();
    let mut ran: Vec<Option<Ran>> = (0..count).map(|_| None).collect();
    std::thread::scope(|scope| -> Result<()> {
        for _ in 0..SCENARIOS_AT_ONCE {
            let ended = ended.clone();
            let queue = &queue;
            scope.spawn(move || {
                loop {
                    let next = queue.lock().map(|mut queue| queue.pop_front());
                    let Ok(Some((index, mut scenario))) = next else {
                        return;
                    };
                    let log = logs.join(format!("scenario-{index}.log"));
                    let result = run_logged(&mut scenario.command, &log);
                    if ended.send((index, scenario.name, result)).is_err() {
                        return;
                    }
                }
            });
        }
        drop(ended);
        for (index, name, result) in endings {
            let (passed, took, log) = result?;
            println!(
                "\n==> e2e: {name} ({}, {:.1} s)",
                if passed { "passed" } else { "FAILED" },
                took.as_secs_f64()
            );
            print!("{log}");
            ran[index] = Some(Ran {
                name,
                took,
                passed,
                log,
            });
        }
        Ok(())
    })?;
    ran.into_iter()
        .map(|run| run.context("a scenario's runner ended without an answer"))
        .collect()
}

/// Runs `command` with its stdout and stderr in `log`: whether it passed, how long it took,
/// and the log's text.
fn run_logged(command: &mut Command, log: &Path) -> Result<(bool, Duration, String)> {
    let file = File::create(log).with_context(|| format!("creating {}", log.display()))?;
    let started = Instant::now();
    let status = command
        .stdout(file.try_clone()?)
        .stderr(file)
        .status()
        .with_context(|| format!("starting {command:?}"))?;
    let took = started.elapsed();
    let text = String::from_utf8_lossy(&std::fs::read(log)?).into_owned();
    Ok((status.success(), took, text))
}

const PROVIDERS: &str = "termination through each real instance provider (the built binary)";

/// The node-termination scenario per real instance provider against its protocol's server
/// (termination-controller's `providers` tests), with the built binary.
fn instance_providers() -> Command {
    let binary = demo::binary("termination-controller");
    let mut command = cargo();
    command
        .current_dir(project_root())
        // The workspace's feature unification, as the tests' build had it: nothing rebuilt.
        .args([
            "nextest",
            "run",
            "--workspace",
            "-E",
            "package(termination-controller) and test(/^providers::/)",
            "--no-fail-fast",
            "--success-output",
            "immediate",
            "--failure-output",
            "immediate",
        ])
        .env("NODEGRACE_E2E_TERMINATION_CONTROLLER", &binary);
    command
}

/// The providers' scenario's line per provider.
fn provider_lines(ran: &[Ran]) -> Result<Vec<String>> {
    let log = ran
        .iter()
        .find(|run| run.name == PROVIDERS)
        .map(|run| run.log.as_str())
        .unwrap_or_default();
    let lines: Vec<String> = log
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
