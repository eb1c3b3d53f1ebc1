//! The frame every nodegrace program runs in: `main`'s body, the admin server that outlives
//! the work, and a supervisor under which a task that dies takes the process down with it
//! (a controller whose watch or lease task is gone must not go on looking healthy).

use std::error::Error;
use std::future::Future;
use std::net::SocketAddr;
use std::process::ExitCode;

use futures::future::BoxFuture;
use prometheus_client::registry::Registry;
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::sync::CancellationToken;

use crate::admin::{self, Readiness};
use crate::cli::LogArgs;
use crate::error_chain::{Chain, exit_code};
use crate::{signals, telemetry};

/// The whole of a program's `main`: parse the options, start logging, run until SIGTERM or
/// SIGINT, and turn the outcome into the exit code (one error line on stderr).
pub fn main<A, F, Fut, E>(log: fn(&A) -> &LogArgs, run: F) -> ExitCode
where
    A: clap::Parser,
    F: FnOnce(A, CancellationToken) -> Fut,
    Fut: Future<Output = Result<(), E>>,
    E: AsRef<dyn Error + 'static>,
{
    let args = A::parse();
    if let Err(error) = telemetry::init_tracing(log(&args)) {
        return exit_code::<Box<dyn Error>>(Err(error.into()));
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => return exit_code::<Box<dyn Error>>(Err(error.into())),
    };
    runtime.block_on(async {
        let stop = signals::shutdown_token();
        exit_code(run(args, stop).await)
    })
}

/// A started program: where its admin server listens, and its completion.
#[derive(Debug)]
pub struct Started<E> {
    pub admin_address: SocketAddr,
    pub finished: JoinHandle<Result<(), E>>,
}

/// Starts the admin server (`/metrics`, `/livez`, `/readyz`), then `work` in a task. The
/// server stops only when `work` has finished: probes and metrics matter most while a program
/// finishes what it was doing after SIGTERM.
pub async fn start<E, Fut>(
    listen: SocketAddr,
    registry: Registry,
    readiness: Readiness,
    work: Fut,
) -> Result<Started<E>, std::io::Error>
where
    Fut: Future<Output = Result<(), E>> + Send + 'static,
    E: Send + 'static,
{
    let admin_stop = CancellationToken::new();
    let admin = admin::serve(listen, registry, readiness, admin_stop.clone()).await?;
    let admin_address = admin.local_addr();
    tracing::info!(address = %admin_address, "admin server listening");
    let finished = tokio::spawn(async move {
        let _stop_admin = admin_stop.drop_guard();
        work.await
    });
    Ok(Started {
        admin_address,
        finished,
    })
}

impl<E: From<tokio::task::JoinError>> Started<E> {
    /// Waits for the program's work to end; a panic in it is an error too.
    pub async fn wait(self) -> Result<(), E> {
        self.finished.await?
    }
}

pub type TaskError = Box<dyn Error + Send + Sync + 'static>;

#[derive(Debug, thiserror::Error)]
pub enum SupervisorError {
    #[error("task {task} failed: {source}")]
    Failed {
        task: &'static str,
        #[source]
        source: TaskError,
    },
    #[error("task {task} ended before the program was asked to stop")]
    EndedEarly { task: &'static str },
    #[error("task {task} panicked")]
    Panicked { task: &'static str },
}

/// Runs a program's long-lived tasks (watches, the lease, the reconcilers) as one: each is
/// meant to run until the stop token fires, so one that ends earlier — failed or not — stops
/// the others and is returned as the program's error.
#[derive(Debug)]
pub struct Supervisor {
    stop: CancellationToken,
    tasks: JoinSet<(&'static str, Result<(), TaskError>)>,
}

impl Supervisor {
    /// Tasks stop when `stop` fires, or when one of them ends.
    pub fn new(stop: &CancellationToken) -> Self {
        Self {
            stop: stop.child_token(),
            tasks: JoinSet::new(),
        }
    }

    /// The token every task must watch.
    pub fn stop_token(&self) -> CancellationToken {
        self.stop.clone()
    }

    pub fn spawn(&mut self, task: &'static str, work: BoxFuture<'static, Result<(), TaskError>>) {
        self.tasks.spawn(async move { (task, work.await) });
    }

    /// Waits for every task; the first to end before the stop is the error.
    pub async fn run(mut self) -> Result<(), SupervisorError> {
        let mut first_error = None;
        while let Some(joined) = self.tasks.join_next().await {
            let stopping = self.stop.is_cancelled();
            let error = match joined {
                Ok((_, Ok(()))) if stopping => None,
                Ok((task, Ok(()))) => Some(SupervisorError::EndedEarly { task }),
                Ok((task, Err(source))) => Some(SupervisorError::Failed { task, source }),
                // Names are lost with a panic; the panic message is already in the log.
                Err(_) => Some(SupervisorError::Panicked { task: "unknown" }),
            };
            if let Some(error) = error {
                if first_error.is_none() {
                    tracing::error!(error = %Chain(&error), "stopping every task");
                    first_error = Some(error);
                }
                self.stop.cancel();
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;

    fn until_stopped(stop: CancellationToken) -> BoxFuture<'static, Result<(), TaskError>> {
        async move {
            stop.cancelled().await;
            Ok(())
        }
        .boxed()
    }

    #[tokio::test]
    async fn a_task_that_fails_stops_the_others_and_is_the_error() {
        let stop = CancellationToken::new();
        let mut supervisor = Supervisor::new(&stop);
        supervisor.spawn("reconciler", until_stopped(supervisor.stop_token()));
        supervisor.spawn("watch", async { Err("the watch ended".into()) }.boxed());
        let error = supervisor.run().await.unwrap_err();
        assert_eq!(error.to_string(), "task watch failed: the watch ended");
        assert!(
            !stop.is_cancelled(),
            "the caller's token is not the supervisor's to cancel"
        );
    }

    #[tokio::test]
    async fn a_task_that_returns_early_is_an_error_and_a_stop_is_not() {
        let stop = CancellationToken::new();
        let mut supervisor = Supervisor::new(&stop);
        supervisor.spawn("lease", async { Ok(()) }.boxed());
        supervisor.spawn("reconciler", until_stopped(supervisor.stop_token()));
        let error = supervisor.run().await.unwrap_err();
        assert!(
            matches!(error, SupervisorError::EndedEarly { task: "lease" }),
            "{error}"
        );

        let mut supervisor = Supervisor::new(&stop);
        supervisor.spawn("a", until_stopped(supervisor.stop_token()));
        supervisor.spawn("b", until_stopped(supervisor.stop_token()));
        stop.cancel();
        assert!(supervisor.run().await.is_ok());
    }
}
