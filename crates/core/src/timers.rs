//! Optional timers for a `select!`: a loop whose next deadline may not exist waits on one arm
//! either way.

use std::time::Duration;

/// Sleeps for `wait`, or for ever without one: the timer arm of a `select!` whose timer is
/// optional.
pub async fn sleep_or_forever(wait: Option<Duration>) {
    match wait {
        Some(wait) => tokio::time::sleep(wait).await,
        None => std::future::pending().await,
    }
}

/// Sleeps until `deadline`, or for ever without one.
pub async fn sleep_until_or_forever(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}
