//! What the programs' tests share (a dev-dependency only): the program under test, waiting on
//! a condition with one default deadline, readers of the cluster and of a program's admin
//! server, a logind stand-in for tests without root, and checks of a program's binary, docs,
//! dashboard and alerts as an operator meets them.

mod alerts;
pub mod bench;
mod binary;
pub mod cluster;
mod dashboard;
mod fake_logind;
mod program;
pub mod proxy;
pub mod reference;
pub mod storms;

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

pub use alerts::check_program_alerts;
pub use binary::{
    check_env_follows_flags, check_help_and_chart_port, check_help_states,
    check_plain_one_line_error,
};
pub use dashboard::{check_dashboard, check_program_dashboard};
pub use fake_logind::{FakeLogind, WithExtraEvents};
pub use program::{ProgramUnderTest, command_line};

#[doc(hidden)]
pub use nodegrace_core;

/// The checks of a program as an operator meets it, written once for the four, in its
/// integration tests:
/// - its binary: `--help` shows the program's own admin port and its chart uses the same;
///   every flag reads its `NODEGRACE_` variable; logs in a pipe are plain and an error is one
///   line (`error_args`: what the program needs besides a kubeconfig to get that far);
/// - its docs: `docs/<program>.md`'s generated tables (flags, chart values, metrics) are current
///   (`cargo xtask docs` rewrites them);
/// - its chart: the Grafana dashboard selects only series the program exports and shows each,
///   and every alert selects an exported series.
#[macro_export]
macro_rules! operator_checks {
    (
        program: $program:expr,
        binary: $binary:expr,
        args: $args:ty,
        metrics: $metrics:ty,
        admin_port: $port:expr,
        error_args: $error_args:expr $(,)?
    ) => {
        fn program_metrics() -> $crate::nodegrace_core::telemetry::ProgramRegistry {
            let mut registry = $crate::nodegrace_core::telemetry::ProgramRegistry::new($program);
            <$metrics>::register(&mut registry);
            registry
        }

        #[test]
        fn help_shows_the_programs_own_admin_port_and_the_chart_uses_it() -> anyhow::Result<()> {
            let values = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../charts")
                .join($program)
                .join("values.yaml");
            $crate::check_help_and_chart_port($binary, $port, &values)
        }

        #[test]
        fn every_flag_reads_its_nodegrace_variable() -> anyhow::Result<()> {
            $crate::check_env_follows_flags(&<$args as clap::CommandFactory>::command())
        }

        #[test]
        fn logs_in_a_pipe_are_plain_and_each_cause_is_printed_once() -> anyhow::Result<()> {
            $crate::check_plain_one_line_error($binary, $error_args)
        }

        #[test]
        fn the_docs_reference_is_current() -> anyhow::Result<()> {
            $crate::reference::check_program_reference(
                $program,
                &<$args as clap::CommandFactory>::command(),
                &program_metrics(),
            )
        }

        #[test]
        fn every_dashboard_query_selects_an_exported_metric_and_every_metric_is_shown()
        -> anyhow::Result<()> {
            $crate::check_program_dashboard($program, &program_metrics())?;
            Ok(())
        }

        #[test]
        fn every_alert_of_the_chart_selects_an_exported_metric() -> anyhow::Result<()> {
            $crate::check_program_alerts($program, &program_metrics())?;
            Ok(())
        }
    };
}

/// How often a condition is checked again; the wait itself is bounded by its deadline.
const POLL: Duration = Duration::from_millis(10);

/// The CPU time (user + system) a process has used, in seconds, from `/proc/<pid>/stat`
/// (counted in USER_HZ, which Linux fixes at 100 for what /proc exports); 0 when it cannot be
/// read: for benchmarks.
pub fn cpu_seconds(pid: u32) -> f64 {
    const USER_HZ: f64 = 100.0;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command name, which may itself hold spaces: state is field 3,
    // utime 14 and stime 15.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks = |index: usize| {
        fields
            .get(index)
            .and_then(|value| value.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / USER_HZ
}

/// A process's resident memory in MiB (`VmRSS`), 0 when it cannot be read: for benchmarks.
pub fn rss_mib(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|value| {
            value
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<f64>()
                .ok()
        })
        .map_or(0.0, |kib| kib / 1024.0)
}

/// How long [`wait_for`] waits: far above anything a passing test waits for on a loaded 2-core
/// machine, so a deadline only ever ends a test that would never pass.
pub const WAIT: Duration = Duration::from_secs(60);

/// Waits until `check` returns true, failing after [`WAIT`] with `what` in the message.
pub async fn wait_for<F, Fut>(what: &str, check: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<bool>>,
{
    wait_for_within(what, WAIT, check).await
}

/// Waits until `check` returns true, failing after `timeout` with `what` in the message: for
/// a wait whose bound is itself what the test shows.
pub async fn wait_for_within<F, Fut>(what: &str, timeout: Duration, mut check: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<bool>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if check().await? {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(POLL).await;
    }
}

/// A program's admin server, read as Prometheus and the kubelet read it.
#[derive(Debug, Clone, Copy)]
pub struct Admin {
    pub address: SocketAddr,
    /// The metrics prefix, e.g. `nodegrace_shutdown_inhibitor_agent`.
    pub prefix: &'static str,
}

impl Admin {
    /// The raw HTTP response to `GET path`, status line first.
    pub async fn get(&self, path: &str) -> Result<String> {
        let mut stream = tokio::net::TcpStream::connect(self.address)
            .await
            .with_context(|| format!("connect to the admin server at {}", self.address))?;
        let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await?;
        let mut response = String::new();
        stream.read_to_string(&mut response).await?;
        Ok(response)
    }

    pub async fn is_ready(&self) -> Result<bool> {
        Ok(self.get("/readyz").await?.starts_with("HTTP/1.1 200"))
    }

    /// The value of the unlabelled sample `<prefix>_<name>`, if exported.
    pub async fn metric(&self, name: &str) -> Result<Option<f64>> {
        Ok(sample(
            &self.get("/metrics").await?,
            &format!("{}_{name}", self.prefix),
        ))
    }

    /// Like [`metric`](Self::metric) for counters and gauges that must be there.
    pub async fn value(&self, name: &str) -> Result<f64> {
        self.metric(name)
            .await?
            .with_context(|| format!("metric {}_{name} is not exported", self.prefix))
    }
}

/// The value of the sample named exactly `full_name` (labels included, if any) in an
/// OpenMetrics text body.
pub fn sample(body: &str, full_name: &str) -> Option<f64> {
    body.lines().find_map(|line| {
        let value = line.strip_prefix(full_name)?.strip_prefix(' ')?;
        value.trim().parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_are_found_by_their_exact_name() {
        let body = "# TYPE x_a counter\nx_a_total 3\nx_a_total_more 9\nx_b{kind=\"y\"} 2\n";
        assert_eq!(sample(body, "x_a_total"), Some(3.0));
        assert_eq!(sample(body, "x_b{kind=\"y\"}"), Some(2.0));
        assert_eq!(sample(body, "x_a"), None);
    }
}
