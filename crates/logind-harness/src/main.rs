//! `logind-harness provision|up|down`: the real-logind harness for people.

use std::fs;

use anyhow::{Context, Result};
use clap::Parser;
use logind_harness::{Detached, LogindHarness, ScenarioOptions, provision, work_dir};

#[derive(Debug, Parser)]
#[command(about = "Runs a real elogind on a private bus, for tests and demos")]
enum Command {
    /// Downloads and unpacks elogind under target/ (tests do this on first use).
    Provision,
    /// Starts elogind on a private bus in the background and prints the bus address.
    Up {
        /// InhibitDelayMaxSec in the scenario's logind.conf.
        #[arg(long, default_value_t = 5)]
        inhibit_delay_max_sec: u64,
    },
    /// Stops what `up` started.
    Down,
}

fn state_file() -> std::path::PathBuf {
    work_dir().join("logind-scenarios/up.state")
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    match Command::parse() {
        Command::Provision => {
            let elogind = provision(&work_dir().join("elogind"))?;
            println!("elogind ready: {}", elogind.daemon().display());
        }
        Command::Up {
            inhibit_delay_max_sec,
        } => {
            if let Some(reason) = logind_harness::skip_reason() {
                anyhow::bail!("cannot start logind here: {reason}");
            }
            stop_previous()?;
            let harness = LogindHarness::start(ScenarioOptions {
                inhibit_delay_max: std::time::Duration::from_secs(inhibit_delay_max_sec),
                detached: true,
                ..ScenarioOptions::default()
            })
            .await?;
            let detached = harness.detach();
            let pids: Vec<String> = detached.pids.iter().map(u32::to_string).collect();
            fs::write(
                state_file(),
                format!("{}\n{}\n", detached.scenario_dir.display(), pids.join(" ")),
            )
            .context("record the running scenario")?;
            println!("export DBUS_SYSTEM_BUS_ADDRESS={}", detached.bus_address);
        }
        Command::Down => {
            if stop_previous()? {
                println!("stopped");
            } else {
                println!("nothing running");
            }
        }
    }
    Ok(())
}

fn stop_previous() -> Result<bool> {
    let Ok(state) = fs::read_to_string(state_file()) else {
        return Ok(false);
    };
    let mut lines = state.lines();
    let dir = lines.next().unwrap_or_default();
    let pids: Vec<u32> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|pid| pid.parse().ok())
        .collect();
    Detached::stop(&pids);
    if !dir.is_empty() {
        let _ = fs::remove_dir_all(dir);
    }
    fs::remove_file(state_file()).context("remove the scenario record")?;
    Ok(true)
}
