//! Process-wide stop: SIGTERM (the kubelet) or SIGINT (a person) cancels one token that every
//! task of the program watches.

use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

/// A token cancelled on the first SIGTERM or SIGINT. Must be called within a Tokio runtime.
pub fn shutdown_token() -> CancellationToken {
    let token = CancellationToken::new();
    let cancel = token.clone();
    tokio::spawn(async move {
        let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            tracing::error!("cannot install signal handlers; the process stops only when killed");
            return;
        };
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM received; stopping"),
            _ = int.recv() => tracing::info!("SIGINT received; stopping"),
        }
        cancel.cancel();
    });
    token
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn sigterm_cancels_the_token() {
        let token = shutdown_token();
        // Let the handler task install its signal streams before the signal arrives.
        tokio::task::yield_now().await;
        tokio::time::timeout(Duration::from_secs(5), async {
            while !token.is_cancelled() {
                nix::sys::signal::raise(nix::sys::signal::Signal::SIGTERM).unwrap();
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("SIGTERM did not cancel the token");
    }
}
