//! The shutdown-signal stream, kept alive across logind restarts.
//!
//! A signal subscription is tied to logind's bus connection; when logind restarts (upgrade,
//! crash) the old subscription goes quiet. We watch `NameOwnerChanged` for logind's name and
//! subscribe afresh each time a new owner appears, telling the consumer about the gap so it can
//! re-take its inhibitor and re-read `PreparingForShutdown`.

use std::pin::Pin;
use std::task::{Context, Poll};

use futures::{Stream, StreamExt};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use zbus::fdo::DBusProxy;
use zbus::proxy::CacheProperties;

use super::proxy::{ManagerProxy, PrepareForShutdownStream};
use super::{LOGIND_BUS_NAME, LogindError, call_error};
use nodegrace_core::error_chain::Chain;

/// What happened to logind, in the order it happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShutdownEvent {
    /// `PrepareForShutdown(true)`: shutdown has begun; delay locks hold it up until released.
    /// `PrepareForShutdown(false)`: a shutdown was cancelled.
    PrepareForShutdown(bool),
    /// logind left the bus. A logind that comes back restores the inhibitors recorded in
    /// `/run/systemd/inhibit` whose fd is still open; one closed meanwhile is gone.
    LogindStopped,
    /// logind (re)appeared on the bus; inhibitors must be taken again.
    LogindStarted,
}

/// A stream of [`ShutdownEvent`]s. It ends only if the bus connection itself is lost.
#[derive(Debug)]
pub struct ShutdownEvents {
    events: mpsc::Receiver<ShutdownEvent>,
    pump: JoinHandle<()>,
}

impl ShutdownEvents {
    pub(super) async fn subscribe(
        connection: zbus::Connection,
        manager: ManagerProxy<'static>,
    ) -> Result<Self, LogindError> {
        let dbus = DBusProxy::new(&connection)
            .await
            .map_err(call_error("create DBus proxy"))?;
        // Subscribe to owner changes before the signal so no restart can fall between the two.
        let owner_changes = dbus
            .receive_name_owner_changed_with_args(&[(0, LOGIND_BUS_NAME)])
            .await
            .map_err(call_error("subscribe NameOwnerChanged"))?;
        let prepare = manager
            .receive_prepare_for_shutdown()
            .await
            .map_err(call_error("subscribe PrepareForShutdown"))?;
        // A small buffer is enough: the consumer only needs the latest state, and logind sends
        // a handful of these per boot.
        let (sender, events) = mpsc::channel(16);
        let pump = tokio::spawn(pump(connection, owner_changes, prepare, sender));
        Ok(Self { events, pump })
    }
}

impl Stream for ShutdownEvents {
    type Item = ShutdownEvent;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.events.poll_recv(cx)
    }
}

impl Drop for ShutdownEvents {
    fn drop(&mut self) {
        self.pump.abort();
    }
}

async fn pump(
    connection: zbus::Connection,
    mut owner_changes: zbus::fdo::NameOwnerChangedStream,
    mut prepare: PrepareForShutdownStream,
    sender: mpsc::Sender<ShutdownEvent>,
) {
    loop {
        let event = tokio::select! {
            Some(signal) = prepare.next() => match signal.args() {
                Ok(args) => ShutdownEvent::PrepareForShutdown(args.start),
                Err(error) => {
                    tracing::warn!(error = %Chain(&error), "ignoring a malformed PrepareForShutdown signal");
                    continue;
                }
            },
            Some(change) = owner_changes.next() => {
                let started = change.args().is_ok_and(|args| args.new_owner().is_some());
                if !started {
                    ShutdownEvent::LogindStopped
                } else if let Some(fresh) = resubscribe(&connection).await {
                    prepare = fresh;
                    ShutdownEvent::LogindStarted
                } else {
                    // Without a subscription we would miss the next shutdown; ending the stream
                    // makes the consumer notice and start over.
                    return;
                }
            },
            else => return,
        };
        if sender.send(event).await.is_err() {
            return;
        }
    }
}

async fn resubscribe(connection: &zbus::Connection) -> Option<PrepareForShutdownStream> {
    let subscribed = async {
        ManagerProxy::builder(connection)
            .cache_properties(CacheProperties::No)
            .build()
            .await?
            .receive_prepare_for_shutdown()
            .await
    };
    match subscribed.await {
        Ok(stream) => Some(stream),
        Err(error) => {
            tracing::error!(error = %Chain(&error), "cannot re-subscribe to PrepareForShutdown after a logind restart");
            None
        }
    }
}
