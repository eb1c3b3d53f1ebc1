//! `nodegrace-explore`: what `cargo xtask explore` runs once the binaries are built.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Parser;
use nodegrace_e2e::explore::run::Options;
use nodegrace_e2e::explore::schedule::Programs;
use nodegrace_e2e::explore::schedule::Provider;

#[derive(Debug, Parser)]
#[command(
    name = "nodegrace-explore",
    about = "Plays random cluster histories against the built binaries on kube-sim and checks invariants from what the API server and the simulated cloud saw; exits non-zero if any run broke one"
)]
struct Args {
    /// The first seed; run K plays seed+K.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// How many runs (seeds seed, seed+1, …).
    #[arg(long, default_value_t = 1)]
    runs: u64,
    /// These seeds instead of --seed/--runs (comma-separated).
    #[arg(long, value_delimiter = ',', conflicts_with_all = ["seed", "runs"])]
    seeds: Vec<u64>,
    /// How long each schedule lasts (then the faults are cleared and the cluster must settle).
    #[arg(long, default_value = "20s", value_parser = seconds)]
    duration: Duration,
    /// Stop starting runs after this long (the runs in flight finish).
    #[arg(long, value_parser = seconds)]
    time_budget: Option<Duration>,
    /// Which programs run.
    #[arg(long, value_enum, default_value_t = Programs::All)]
    program: Programs,
    /// Whose machines the nodes run on: kube-sim's cloud, or EC2 (moto's server, installed by
    /// `cargo xtask test`, behind an interposer that adds throttling, 500s, lost answers and
    /// EC2's eventual consistency to the schedule).
    #[arg(long, value_enum, default_value_t = Provider::Sim)]
    provider: Provider,
    /// Drain through Kubernetes 1.37's EvictionRequests: kube-sim serves the API (its
    /// responder heartbeat deadline 3 s), termination-controller runs with
    /// --eviction-api=eviction-request, and the workloads' pods name responders the explorer
    /// plays, slow, silent or refusing.
    #[arg(long)]
    eviction_requests: bool,
    /// Runs at once (each is a kube-sim and four program processes, mostly idle).
    #[arg(long, default_value_t = 2)]
    jobs: usize,
    /// Where kube-sim and the programs are [default: this binary's directory].
    #[arg(long)]
    bin_dir: Option<PathBuf>,
    /// Where the NodeDisruptionBudget CRD is read from (`termination-controller/crds/`): the
    /// charts of the commit the binaries were built from [default: this repository's charts].
    #[arg(long)]
    charts_dir: Option<PathBuf>,
    /// Each run's history, logs and violations go to DIR/<seed> [default: target/explore].
    #[arg(long)]
    work_dir: Option<PathBuf>,
}

fn seconds(text: &str) -> Result<Duration, String> {
    let number = text
        .strip_suffix('s')
        .ok_or_else(|| format!("{text:?}: a number of seconds like 20s"))?;
    number
        .parse::<u64>()
        .ok()
        .filter(|n| *n > 0)
        .map(Duration::from_secs)
        .ok_or_else(|| format!("{text:?}: a whole number of seconds above zero, like 20s"))
}

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(error) => {
            eprintln!("Error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<bool> {
    let args = Args::parse();
    if args.jobs == 0 {
        bail!("--jobs must be at least 1");
    }
    let repo = std::fs::canonicalize(nodegrace_e2e::REPO)
        .context("find the repository this binary was built from")?;
    let bin_dir = match args.bin_dir {
        Some(dir) => dir,
        None => std::env::current_exe()?
            .parent()
            .context("this binary has a directory")?
            .to_path_buf(),
    };
    let options = Options {
        bin_dir,
        charts_dir: args.charts_dir.unwrap_or_else(|| repo.join("charts")),
        work_root: args.work_dir.unwrap_or_else(|| repo.join("target/explore")),
        duration: args.duration,
        programs: args.program,
        provider: args.provider,
        eviction_requests: args.eviction_requests,
    };
    let seeds: Vec<u64> = if args.seeds.is_empty() {
        (args.seed..args.seed.saturating_add(args.runs)).collect()
    } else {
        args.seeds
    };
    // One thread: the death signal that ties every child to this process follows the thread
    // that started it (see processes.rs).
    let summary = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(nodegrace_e2e::explore::many(
            &seeds,
            &options,
            args.jobs,
            args.time_budget,
        ))?;
    println!("{summary}");
    Ok(summary.violations == 0 && summary.failed_to_run == 0)
}
