//! `cargo xtask explore`: builds the binaries the explorer runs (kube-sim, the two
//! controllers, `nodegrace-explore`), then runs it: random cluster histories, invariants judged
//! from outside (see docs/explore.md).

use std::path::PathBuf;
use std::process::Command;

use anyhow::Result;
use clap::Args;

use crate::{project_root, run_command};

/// Seeds the test command always plays: every seed that once found a violation (after its
/// fix), so a regression there fails the suite.
const SEEDS_FILE: &str = "e2e/explore/seeds.txt";

#[derive(Debug, Args)]
pub struct ExploreArgs {
    /// Passed to nodegrace-explore: --seed N, --runs K, --seeds A,B, --duration 20s,
    /// --program all|termination|oos, --provider sim|aws|redfish|cluster-api, --jobs J, --time-budget 600s (see
    /// its --help).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    args: Vec<String>,
}

const PACKAGES: [&str; 4] = [
    "kube-sim",
    "termination-controller",
    "out-of-service-gc",
    "nodegrace-e2e",
];

fn build() -> Result<PathBuf> {
    crate::demo::build(&PACKAGES)?;
    Ok(crate::demo::binary("nodegrace-explore"))
}

pub fn run(args: &ExploreArgs) -> Result<()> {
    let explorer = build()?;
    if on_python_servers(&args.args) {
        crate::setup::ensure_python_packages()?;
    }
    run_command(
        Command::new(explorer)
            .current_dir(project_root())
            .args(&args.args),
    )
}

/// Whether the explorer's arguments put the nodes on EC2 or bare metal (moto's server and
/// sushy-tools' emulator, from PyPI).
fn on_python_servers(args: &[String]) -> bool {
    args.iter()
        .zip(args.iter().skip(1).map(Some).chain([None]))
        .any(|(arg, next)| {
            let provider = arg
                .strip_prefix("--provider=")
                .or_else(|| (arg == "--provider").then_some(next.map_or("", String::as_str)));
            matches!(provider, Some("aws" | "redfish"))
        })
}

/// Histories the test command plays at once: at two, the step kept two cores 25 % busy (a
/// history mostly waits on its programs' timers and kube-sim's).
const TEST_JOBS: usize = 4;

/// Seeds the test command plays on each provider with a server of its own: EC2 (moto),
/// bare metal (sushy-tools' Redfish emulator) and Cluster API, each behind its interposer of
/// faults.
const PROVIDER_SEEDS: [(&str, &str); 3] = [
    ("aws", "1,2,3,4"),
    ("redfish", "1,2,3,4"),
    ("cluster-api", "1,2,3,4"),
];

/// Seeds the test command plays with `--eviction-requests` (on kube-sim's cloud).
const EVICTION_REQUEST_SEEDS: &str = "1,2,3,4";

/// The test command's share: the seeds of `e2e/explore/seeds.txt` and [`PROVIDER_SEEDS`],
/// [`TEST_JOBS`] at once, with the binaries the test command's test build
/// left (see [`crate::demo::Binaries`]).
pub fn fixed_seeds_after_tests() -> Result<()> {
    let explorer = crate::demo::binary("nodegrace-explore");
    if !explorer.is_file() {
        anyhow::bail!(
            "{} is not built: the test build builds it",
            explorer.display()
        );
    }
    let listed = std::fs::read_to_string(project_root().join(SEEDS_FILE))?;
    let seeds: Vec<&str> = listed
        .lines()
        .map(|line| line.split('#').next().unwrap_or_default().trim())
        .filter(|seed| !seed.is_empty())
        .collect();
    run_command(
        Command::new(&explorer)
            .current_dir(project_root())
            .arg(format!("--seeds={}", seeds.join(",")))
            .arg(format!("--jobs={TEST_JOBS}")),
    )?;
    // Drains through Kubernetes 1.37's EvictionRequests, responders slow, silent or refusing.
    run_command(
        Command::new(&explorer)
            .current_dir(project_root())
            .arg("--eviction-requests")
            .arg(format!("--seeds={EVICTION_REQUEST_SEEDS}"))
            .arg(format!("--jobs={TEST_JOBS}")),
    )?;
    for (provider, seeds) in PROVIDER_SEEDS {
        run_command(
            Command::new(&explorer)
                .current_dir(project_root())
                .arg(format!("--provider={provider}"))
                .arg(format!("--seeds={seeds}"))
                .arg(format!("--jobs={TEST_JOBS}")),
        )?;
    }
    Ok(())
}

/// `cargo xtask bench explore`: as many runs as fit in `seconds`, from a seed of the clock.
pub fn bench(seconds: u64, first_seed: Option<u64>) -> Result<()> {
    let explorer = build()?;
    let seed = first_seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |since| since.as_secs())
    });
    run_command(
        Command::new(explorer)
            .current_dir(project_root())
            .arg(format!("--seed={seed}"))
            .arg("--runs=100000")
            .arg(format!("--time-budget={seconds}s"))
            .arg("--jobs=2"),
    )
}
