//! Waiting on state with a deadline. The demo watches the API where it can; these polls are for
//! what offers no notification (a file appearing, logind's inhibitor list, an HTTP probe).

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

const INTERVAL: Duration = Duration::from_millis(20);

/// Polls `check` until it yields a value, or `None` once `timeout` has passed.
pub async fn poll_for<T, F, Fut>(timeout: Duration, mut check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return Some(value);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(INTERVAL).await;
    }
}

/// Polls `ready` until it holds (true) or `timeout` passes (false).
pub async fn poll_until<F, Fut>(timeout: Duration, mut ready: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    poll_for(timeout, || {
        let ready = ready();
        async move { ready.await.then_some(()) }
    })
    .await
    .is_some()
}
