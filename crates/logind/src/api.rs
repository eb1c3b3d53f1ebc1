//! What the node agents ask of logind, as a trait: the real client implements it, and tests
//! drive the agents through another implementation (events elogind cannot be made to send, a
//! logind that refuses locks) without root.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt};
use tokio_util::sync::CancellationToken;

use super::{
    DelayConfig, DelayError, DelayOutcome, InhibitMode, Inhibitor, InhibitorLock, Logind,
    LogindError, ShutdownEvent, ensure_inhibit_delay,
};
use nodegrace_core::error_chain::Chain;

pub type SharedLogind = Arc<dyn LogindApi>;

pub trait LogindApi: Send + Sync + std::fmt::Debug {
    /// Takes an inhibitor lock on `what`; dropping the lock releases it.
    fn inhibit<'a>(
        &'a self,
        what: &'a str,
        who: &'a str,
        why: &'a str,
        mode: InhibitMode,
    ) -> BoxFuture<'a, Result<InhibitorLock, LogindError>>;

    /// Shutdown signals, continuing across logind restarts; ends only with the bus connection.
    fn shutdown_events(
        &self,
    ) -> BoxFuture<'_, Result<BoxStream<'static, ShutdownEvent>, LogindError>>;

    /// Whether a shutdown is under way.
    fn preparing_for_shutdown(&self) -> BoxFuture<'_, Result<bool, LogindError>>;

    /// The longest a delay inhibitor may hold up shutdown (`InhibitDelayMaxSec`).
    fn inhibit_delay_max(&self) -> BoxFuture<'_, Result<Duration, LogindError>>;

    /// Every inhibitor lock held on the machine (`ListInhibitors`).
    fn list_inhibitors(&self) -> BoxFuture<'_, Result<Vec<Inhibitor>, LogindError>>;

    /// Whether a `block` inhibitor stops root's shutdown requests too (see
    /// [`Logind::block_binds_root`]).
    fn block_binds_root(&self) -> BoxFuture<'_, Result<bool, LogindError>>;

    /// Raises `InhibitDelayMaxSec` to `wanted` if needed (see [`ensure_inhibit_delay`]).
    fn ensure_inhibit_delay<'a>(
        &'a self,
        wanted: Duration,
        config: &'a DelayConfig,
    ) -> BoxFuture<'a, Result<DelayOutcome, DelayError>>;
}

impl LogindApi for Logind {
    fn inhibit<'a>(
        &'a self,
        what: &'a str,
        who: &'a str,
        why: &'a str,
        mode: InhibitMode,
    ) -> BoxFuture<'a, Result<InhibitorLock, LogindError>> {
        Logind::inhibit(self, what, who, why, mode).boxed()
    }

    fn shutdown_events(
        &self,
    ) -> BoxFuture<'_, Result<BoxStream<'static, ShutdownEvent>, LogindError>> {
        async { Ok(Logind::shutdown_events(self).await?.boxed()) }.boxed()
    }

    fn preparing_for_shutdown(&self) -> BoxFuture<'_, Result<bool, LogindError>> {
        Logind::preparing_for_shutdown(self).boxed()
    }

    fn inhibit_delay_max(&self) -> BoxFuture<'_, Result<Duration, LogindError>> {
        Logind::inhibit_delay_max(self).boxed()
    }

    fn list_inhibitors(&self) -> BoxFuture<'_, Result<Vec<Inhibitor>, LogindError>> {
        Logind::list_inhibitors(self).boxed()
    }

    fn block_binds_root(&self) -> BoxFuture<'_, Result<bool, LogindError>> {
        Logind::block_binds_root(self).boxed()
    }

    fn ensure_inhibit_delay<'a>(
        &'a self,
        wanted: Duration,
        config: &'a DelayConfig,
    ) -> BoxFuture<'a, Result<DelayOutcome, DelayError>> {
        ensure_inhibit_delay(self, wanted, config).boxed()
    }
}

/// Where a program finds logind.
#[derive(Debug, Clone)]
pub enum LogindSource {
    /// The system bus, or the bus at this address.
    Bus(Option<String>),
    /// An implementation handed in (tests).
    Given(SharedLogind),
}

const FIRST_PAUSE: Duration = Duration::from_millis(200);
const LONGEST_PAUSE: Duration = Duration::from_secs(10);

impl LogindSource {
    /// Connects, retrying with backoff while the bus or logind is not there yet (a node agent
    /// starting before dbus is normal at boot). `on_first_failure` runs once, so the program
    /// can say why it is not ready. `None` when `stop` fires first.
    pub async fn connect(
        self,
        stop: &CancellationToken,
        on_first_failure: impl FnOnce(&LogindError),
    ) -> Option<SharedLogind> {
        let address = match self {
            Self::Given(logind) => return Some(logind),
            Self::Bus(address) => address,
        };
        let mut on_first_failure = Some(on_first_failure);
        let mut pause = FIRST_PAUSE;
        loop {
            let connected = match address.as_deref() {
                Some(address) => Logind::connect_to(address).await,
                None => Logind::connect().await,
            };
            match connected {
                Ok(logind) => return Some(Arc::new(logind)),
                Err(error) => {
                    tracing::error!(error = %Chain(&error), "cannot reach logind; retrying");
                    if let Some(report) = on_first_failure.take() {
                        report(&error);
                    }
                }
            }
            tokio::select! {
                () = stop.cancelled() => return None,
                () = tokio::time::sleep(pause) => {}
            }
            pause = (pause * 2).min(LONGEST_PAUSE);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn an_absent_bus_is_retried_until_stop_and_reported_once() {
        let stop = CancellationToken::new();
        let reports = std::sync::atomic::AtomicUsize::new(0);
        let source = LogindSource::Bus(Some("unix:path=/nonexistent/bus".to_owned()));
        let stopper = {
            let stop = stop.clone();
            async move {
                tokio::time::sleep(Duration::from_secs(60)).await;
                stop.cancel();
            }
        };
        let (connected, ()) = tokio::join!(
            source.connect(&stop, |_| {
                reports.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }),
            stopper
        );
        assert!(connected.is_none());
        assert_eq!(reports.load(std::sync::atomic::Ordering::Relaxed), 1);
    }
}
