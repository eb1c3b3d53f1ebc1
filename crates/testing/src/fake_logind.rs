//! A logind stand-in for tests that need no root: locks are one end of a socket pair (held
//! while the agent keeps its end open, released when it drops it), shutdown events come from
//! the test, and Inhibit can be made to fail. The real-elogind tests remain the proof; this
//! drives the decisions.

use std::io::Read;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::channel::mpsc;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt};

use nodegrace_logind::{
    DelayConfig, DelayError, DelayOutcome, InhibitMode, Inhibitor, InhibitorLock, LogindApi,
    LogindError, SharedLogind, ShutdownEvent,
};

#[derive(Debug)]
struct Held {
    what: String,
    who: String,
    why: String,
    mode: InhibitMode,
    /// Our end of the pair: reading EOF from it means the agent closed the lock.
    ours: UnixStream,
}

#[derive(Debug, Default)]
struct State {
    locks: Vec<Held>,
    subscribers: Vec<mpsc::UnboundedSender<ShutdownEvent>>,
}

/// See the module documentation. Cheap to clone; clones share the state.
#[derive(Debug, Clone, Default)]
pub struct FakeLogind {
    state: Arc<Mutex<State>>,
    refuse_inhibit: Arc<AtomicBool>,
    preparing: Arc<AtomicBool>,
    delay_max: Arc<Mutex<Duration>>,
}

impl FakeLogind {
    pub fn new(inhibit_delay_max: Duration) -> Self {
        let fake = Self::default();
        *fake
            .delay_max
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = inhibit_delay_max;
        fake
    }

    pub fn shared(&self) -> SharedLogind {
        Arc::new(self.clone())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Every later Inhibit fails (as logind does when it is overloaded or the caller lacks
    /// the right) until called with `false`.
    pub fn refuse_inhibit(&self, refuse: bool) {
        self.refuse_inhibit.store(refuse, Ordering::SeqCst);
    }

    /// Sends `event` to every subscriber, tracking `PreparingForShutdown` as logind does.
    pub fn send(&self, event: ShutdownEvent) {
        if let ShutdownEvent::PrepareForShutdown(preparing) = event {
            self.preparing.store(preparing, Ordering::SeqCst);
        }
        self.lock()
            .subscribers
            .retain(|subscriber| subscriber.unbounded_send(event).is_ok());
    }

    /// The locks still held, as `(who, why, mode)`.
    pub fn held(&self) -> Vec<(String, String, InhibitMode)> {
        let mut state = self.lock();
        state.locks.retain_mut(|held| still_open(&mut held.ours));
        state
            .locks
            .iter()
            .map(|held| (held.who.clone(), held.why.clone(), held.mode))
            .collect()
    }
}

fn still_open(ours: &mut UnixStream) -> bool {
    let mut byte = [0u8; 1];
    match ours.read(&mut byte) {
        Ok(0) => false,
        Ok(_) => true,
        Err(error) => error.kind() == std::io::ErrorKind::WouldBlock,
    }
}

fn refused() -> LogindError {
    LogindError::Call {
        call: "Inhibit",
        source: zbus::Error::Failure("refused by the test".to_owned()),
    }
}

impl LogindApi for FakeLogind {
    fn inhibit<'a>(
        &'a self,
        what: &'a str,
        who: &'a str,
        why: &'a str,
        mode: InhibitMode,
    ) -> BoxFuture<'a, Result<InhibitorLock, LogindError>> {
        async move {
            if self.refuse_inhibit.load(Ordering::SeqCst) {
                return Err(refused());
            }
            let (ours, theirs) = UnixStream::pair().map_err(|e| LogindError::Call {
                call: "Inhibit",
                source: zbus::Error::InputOutput(Arc::new(e)),
            })?;
            ours.set_nonblocking(true).map_err(|e| LogindError::Call {
                call: "Inhibit",
                source: zbus::Error::InputOutput(Arc::new(e)),
            })?;
            self.lock().locks.push(Held {
                what: what.to_owned(),
                who: who.to_owned(),
                why: why.to_owned(),
                mode,
                ours,
            });
            Ok(InhibitorLock::new(theirs.into(), what, mode))
        }
        .boxed()
    }

    fn shutdown_events(
        &self,
    ) -> BoxFuture<'_, Result<BoxStream<'static, ShutdownEvent>, LogindError>> {
        let (sender, receiver) = mpsc::unbounded();
        self.lock().subscribers.push(sender);
        async move { Ok(receiver.boxed()) }.boxed()
    }

    fn preparing_for_shutdown(&self) -> BoxFuture<'_, Result<bool, LogindError>> {
        let preparing = self.preparing.load(Ordering::SeqCst);
        async move { Ok(preparing) }.boxed()
    }

    fn inhibit_delay_max(&self) -> BoxFuture<'_, Result<Duration, LogindError>> {
        let max = *self
            .delay_max
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        async move { Ok(max) }.boxed()
    }

    /// Answers as the elogind of the tests does (and every logind before systemd 257).
    fn block_binds_root(&self) -> BoxFuture<'_, Result<bool, LogindError>> {
        async { Ok(false) }.boxed()
    }

    fn list_inhibitors(&self) -> BoxFuture<'_, Result<Vec<Inhibitor>, LogindError>> {
        let mut state = self.lock();
        state.locks.retain_mut(|held| still_open(&mut held.ours));
        let rows = state
            .locks
            .iter()
            .map(|held| Inhibitor {
                what: held.what.clone(),
                who: held.who.clone(),
                why: held.why.clone(),
                mode: held.mode.as_str().to_owned(),
                uid: 0,
                pid: std::process::id(),
            })
            .collect();
        async move { Ok(rows) }.boxed()
    }

    fn ensure_inhibit_delay<'a>(
        &'a self,
        wanted: Duration,
        _config: &'a DelayConfig,
    ) -> BoxFuture<'a, Result<DelayOutcome, DelayError>> {
        // A logind whose configuration cannot be changed: the caller runs with what it grants.
        async move {
            let reported = *self
                .delay_max
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            Ok(DelayOutcome {
                wanted,
                reported,
                effective: wanted.min(reported),
                drop_in_written: false,
            })
        }
        .boxed()
    }
}

/// A real logind with extra shutdown events merged in, for what elogind cannot be made to
/// send (a cancelled shutdown).
pub struct WithExtraEvents {
    inner: SharedLogind,
    extra: Mutex<Option<BoxStream<'static, ShutdownEvent>>>,
}

impl std::fmt::Debug for WithExtraEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WithExtraEvents")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl WithExtraEvents {
    pub fn wrap(inner: SharedLogind, extra: BoxStream<'static, ShutdownEvent>) -> SharedLogind {
        Arc::new(Self {
            inner,
            extra: Mutex::new(Some(extra)),
        })
    }
}

impl LogindApi for WithExtraEvents {
    fn inhibit<'a>(
        &'a self,
        what: &'a str,
        who: &'a str,
        why: &'a str,
        mode: InhibitMode,
    ) -> BoxFuture<'a, Result<InhibitorLock, LogindError>> {
        self.inner.inhibit(what, who, why, mode)
    }

    fn shutdown_events(
        &self,
    ) -> BoxFuture<'_, Result<BoxStream<'static, ShutdownEvent>, LogindError>> {
        let extra = self
            .extra
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        async move {
            let events = self.inner.shutdown_events().await?;
            Ok(match extra {
                Some(extra) => futures::stream::select(events, extra).boxed(),
                None => events,
            })
        }
        .boxed()
    }

    fn preparing_for_shutdown(&self) -> BoxFuture<'_, Result<bool, LogindError>> {
        self.inner.preparing_for_shutdown()
    }

    fn inhibit_delay_max(&self) -> BoxFuture<'_, Result<Duration, LogindError>> {
        self.inner.inhibit_delay_max()
    }

    fn list_inhibitors(&self) -> BoxFuture<'_, Result<Vec<Inhibitor>, LogindError>> {
        self.inner.list_inhibitors()
    }

    fn block_binds_root(&self) -> BoxFuture<'_, Result<bool, LogindError>> {
        self.inner.block_binds_root()
    }

    fn ensure_inhibit_delay<'a>(
        &'a self,
        wanted: Duration,
        config: &'a DelayConfig,
    ) -> BoxFuture<'a, Result<DelayOutcome, DelayError>> {
        self.inner.ensure_inhibit_delay(wanted, config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_lock_is_held_until_its_fd_is_closed() {
        let fake = FakeLogind::new(Duration::from_secs(30));
        let lock = fake
            .inhibit("shutdown", "me", "testing", InhibitMode::Block)
            .await
            .unwrap();
        assert_eq!(fake.held().len(), 1);
        drop(lock);
        assert!(fake.held().is_empty());
        fake.refuse_inhibit(true);
        assert!(
            fake.inhibit("shutdown", "me", "x", InhibitMode::Delay)
                .await
                .is_err()
        );
    }

    #[tokio::test]
    async fn events_reach_every_subscriber_and_track_preparing() {
        let fake = FakeLogind::default();
        let mut events = fake.shutdown_events().await.unwrap();
        fake.send(ShutdownEvent::PrepareForShutdown(true));
        assert_eq!(
            events.next().await,
            Some(ShutdownEvent::PrepareForShutdown(true))
        );
        assert!(fake.preparing_for_shutdown().await.unwrap());
    }
}
