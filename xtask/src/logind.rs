//! `cargo xtask logind up|down|demo`: thin dispatch to the harness binary and the core demo.

use anyhow::Result;
use clap::Subcommand;

use crate::{cargo, run_command};

#[derive(Debug, Clone, Copy, Subcommand)]
pub enum Action {
    /// Starts elogind on a private bus in the background and prints its bus address.
    Up,
    /// Stops what `up` started.
    Down,
    /// Takes a delay and a block inhibitor, triggers PowerOff and shows the delayed shutdown.
    Demo,
}

pub fn run(action: Action) -> Result<()> {
    match action {
        Action::Up => {
            run_command(cargo().args(["run", "--quiet", "--package", "logind-harness", "--", "up"]))
        }
        Action::Down => run_command(cargo().args([
            "run",
            "--quiet",
            "--package",
            "logind-harness",
            "--",
            "down",
        ])),
        Action::Demo => run_command(cargo().args([
            "run",
            "--quiet",
            "--package",
            "nodegrace-core",
            "--example",
            "logind_demo",
        ])),
    }
}
