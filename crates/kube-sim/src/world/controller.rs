//! The shape every simulated controller shares: level-triggered reconciliation of the whole
//! world, run shortly after a relevant change (changes arriving together are handled at once)
//! and on a period for what time alone changes.
//!
//! A pass reads the whole store, so its cost grows with the fleet: at 150,000 pods the garbage
//! collector's and the attach-detach controller's passes took a quarter of a second each and,
//! run after every deletion, left the API server almost no CPU (5 force-deletions a second).
//! A pass triggered by a change therefore first waits out [`PACE`] times the last pass's cost:
//! each controller takes at most a fifth of a core, and a big fleet's changes gather into fewer
//! passes. Small worlds pass in microseconds and wait only [`SETTLE`].

use std::time::{Duration, Instant};

use tokio::sync::broadcast::error::RecvError;
use tokio_util::sync::CancellationToken;

use crate::store::{Change, Store};

/// How long to let a burst of changes gather before reconciling.
const SETTLE: Duration = Duration::from_millis(10);

/// How many times its own cost a pass waits before the next change-triggered one.
const PACE: u32 = 4;

pub async fn run(
    store: Store,
    stop: CancellationToken,
    period: Duration,
    interested: impl Fn(&Change) -> bool,
    mut reconcile: impl FnMut(&Store),
) {
    run_timed(store, stop, period, interested, move |store| {
        reconcile(store);
        None
    })
    .await;
}

/// As `run`, for a controller that also knows when time alone will next change something
/// (a toleration running out): `reconcile` returns how soon to run again, if sooner than the
/// period.
pub async fn run_timed(
    store: Store,
    stop: CancellationToken,
    period: Duration,
    interested: impl Fn(&Change) -> bool,
    mut reconcile: impl FnMut(&Store) -> Option<Duration>,
) {
    let Ok(subscription) = store.subscribe(0) else {
        return;
    };
    let mut live = subscription.live;
    let (mut due, mut cost) = timed(|| reconcile(&store));
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let soon = async {
            match due {
                Some(wait) => tokio::time::sleep(wait).await,
                None => std::future::pending().await,
            }
        };
        let dirty = tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => true,
            () = soon => true,
            received = live.recv() => match received {
                Ok(change) => interested(&change),
                Err(RecvError::Lagged(_)) => true,
                Err(RecvError::Closed) => return,
            },
        };
        if dirty {
            tokio::time::sleep(SETTLE.max(cost * PACE)).await;
            // Whatever else arrived meanwhile is covered by this reconciliation.
            while let Ok(_) | Err(tokio::sync::broadcast::error::TryRecvError::Lagged(_)) =
                live.try_recv()
            {}
            (due, cost) = timed(|| reconcile(&store));
        }
    }
}

/// What `pass` returned, and how long it took.
fn timed<T>(pass: impl FnOnce() -> T) -> (T, Duration) {
    let began = Instant::now();
    let result = pass();
    (result, began.elapsed())
}
