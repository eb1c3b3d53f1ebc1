//! The explorer (`cargo xtask explore`): random cluster histories against the real release
//! binaries on kube-sim, with invariants judged from what the API server and the simulated
//! cloud saw. See docs/explore.md.

pub mod actions;
pub mod cloud;
pub mod fences;
pub mod invariants;
pub mod orphans;
pub mod proxy;
pub mod record;
pub mod responders;
pub mod run;
pub mod schedule;
pub mod setup;
pub mod sim;
pub mod storms;

use std::fmt;
use std::time::Duration;

use futures::StreamExt;
use tokio::time::Instant;

/// What a set of runs found.
#[derive(Debug, Default)]
pub struct Summary {
    pub runs: usize,
    pub events: usize,
    pub violations: usize,
    pub seeds_failed: Vec<u64>,
    /// Runs that could not be played (the set-up failed): not a verdict on the programs.
    pub failed_to_run: usize,
    pub took: Duration,
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let failed: Vec<String> = self.seeds_failed.iter().map(u64::to_string).collect();
        write!(
            f,
            "explore runs={} events={} violations={} seeds-failed={} could-not-run={} took={:.0}s",
            self.runs,
            self.events,
            self.violations,
            if failed.is_empty() {
                "none".to_owned()
            } else {
                failed.join(",")
            },
            self.failed_to_run,
            self.took.as_secs_f64(),
        )
    }
}

/// Plays `seeds`, `jobs` at once, starting none after `time_budget`; prints each run's verdict
/// (and its violations, with the events before each) as it ends.
pub async fn many(
    seeds: &[u64],
    options: &run::Options,
    jobs: usize,
    time_budget: Option<Duration>,
) -> anyhow::Result<Summary> {
    let started = Instant::now();
    let mut summary = Summary::default();
    let mut runs = std::pin::pin!(
        futures::stream::iter(seeds.iter().copied())
            .take_while(|_| {
                let within = time_budget.is_none_or(|budget| started.elapsed() < budget);
                async move { within }
            })
            .map(|seed| async move {
                let began = Instant::now();
                (
                    seed,
                    Box::pin(run::explore(seed, options)).await,
                    began.elapsed(),
                )
            })
            .buffer_unordered(jobs)
    );
    while let Some((seed, report, took)) = runs.next().await {
        summary.runs += 1;
        match report {
            Ok(report) => {
                summary.events += report.events;
                summary.violations += report.violations.len();
                println!(
                    "seed {seed}: {} events, {} violations ({:.1} s; {}; at most {} writes of a \
                     Node in {} s){}",
                    report.events,
                    report.violations.len(),
                    took.as_secs_f64(),
                    report.dir.display(),
                    report.busiest_node_writes,
                    storms::WINDOW.as_secs(),
                    report
                        .provider_traffic
                        .as_ref()
                        .map_or_else(String::new, |traffic| format!("; {traffic}"))
                );
                if !report.violations.is_empty() {
                    summary.seeds_failed.push(seed);
                    let text = std::fs::read_to_string(report.dir.join("violations.txt"))
                        .unwrap_or_default();
                    for line in text.lines() {
                        println!("  {line}");
                    }
                }
            }
            Err(error) => {
                summary.failed_to_run += 1;
                println!("seed {seed}: could not run: {error:#}");
            }
        }
    }
    summary.took = started.elapsed();
    Ok(summary)
}
