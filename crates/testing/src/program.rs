//! A program under test: started in-process from its parsed `Args` as its `main` starts it,
//! ready once its `/readyz` says so, and stopped when the test drops it.

use std::future::Future;
use std::time::Duration;

use anyhow::{Context, Result};
use nodegrace_core::program::Started;
use tokio_util::sync::CancellationToken;

use crate::{Admin, wait_for};

/// How long a stopping program may take to finish what it was doing.
const STOP_TIMEOUT: Duration = Duration::from_secs(20);

#[derive(Debug)]
pub struct ProgramUnderTest {
    admin: Admin,
    started: Option<Started<anyhow::Error>>,
    stop: CancellationToken,
}

impl Drop for ProgramUnderTest {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl ProgramUnderTest {
    /// Runs `start` (a program's `app::start` with its arguments) with a stop of the handle's
    /// own, then waits until the program is ready. `metrics_prefix` is its metrics' prefix, e.g.
    /// `nodegrace_out_of_service_gc`.
    pub async fn start<F, Fut>(metrics_prefix: &'static str, start: F) -> Result<Self>
    where
        F: FnOnce(CancellationToken) -> Fut,
        Fut: Future<Output = Result<Started<anyhow::Error>>>,
    {
        let program = Self::start_unready(metrics_prefix, start).await?;
        let admin = program.admin;
        wait_for("the program to be ready", || admin.is_ready()).await?;
        Ok(program)
    }

    /// [`Self::start`] without waiting for readiness: for a program that must not become
    /// ready (a node agent whose logind refuses it).
    pub async fn start_unready<F, Fut>(metrics_prefix: &'static str, start: F) -> Result<Self>
    where
        F: FnOnce(CancellationToken) -> Fut,
        Fut: Future<Output = Result<Started<anyhow::Error>>>,
    {
        let stop = CancellationToken::new();
        let started = start(stop.clone()).await?;
        Ok(Self {
            admin: Admin {
                address: started.admin_address,
                prefix: metrics_prefix,
            },
            started: Some(started),
            stop,
        })
    }

    pub fn admin(&self) -> Admin {
        self.admin
    }

    /// A counter's value; 0 before it was first exported.
    pub async fn counter(&self, name: &str) -> Result<u64> {
        let value = self.admin.metric(&format!("{name}_total")).await?;
        Ok(value.map_or(0, |value| value.round() as u64))
    }

    /// A gauge's value, rounded; -1 while it is not exported.
    pub async fn gauge(&self, name: &str) -> Result<i64> {
        Ok(self
            .admin
            .metric(name)
            .await?
            .map_or(-1, |value| value.round() as i64))
    }

    /// Tells the program to stop, as SIGTERM does, without waiting for it to finish.
    pub fn sigterm(&self) {
        self.stop.cancel();
    }

    /// Stops the program as SIGTERM would, and returns how its run ended.
    pub async fn stop(self) -> Result<()> {
        self.sigterm();
        self.wait().await
    }

    /// Waits for the program to end by itself, and returns how its run ended.
    pub async fn wait(mut self) -> Result<()> {
        let started = self
            .started
            .take()
            .context("the program was started once")?;
        tokio::time::timeout(STOP_TIMEOUT, started.wait())
            .await
            .context("the program did not end in time")?
    }
}

/// A program's command line: `program`, then each of `defaults` whose flag `flags` does not
/// give, then `flags` (clap refuses a flag given twice).
pub fn command_line(program: &str, defaults: &[String], flags: &[&str]) -> Vec<String> {
    let flag_name = |flag: &str| flag.split('=').next().unwrap_or(flag).to_owned();
    let given: Vec<String> = flags.iter().map(|flag| flag_name(flag)).collect();
    std::iter::once(program.to_owned())
        .chain(
            defaults
                .iter()
                .filter(|default| !given.contains(&flag_name(default)))
                .cloned(),
        )
        .chain(flags.iter().map(|flag| (*flag).to_owned()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flag_given_replaces_its_default() {
        let line = command_line(
            "p",
            &["--a=1".to_owned(), "--b=2".to_owned()],
            &["--b=3", "--c"],
        );
        assert_eq!(line, ["p", "--a=1", "--b=3", "--c"]);
    }
}
