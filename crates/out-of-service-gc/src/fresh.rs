//! Reads that are fresh for everyone who asked: a force action waits for a read of the Node that
//! *began after* it asked, so a taint removed a moment before is always seen. Actions that ask
//! together share one read, which keeps a node of 110 pods at a couple of reads, not 110.

use std::future::Future;

use tokio::sync::Mutex;
use tokio::time::Instant;

#[derive(Debug)]
pub struct Fresh<T> {
    last: Mutex<Option<(Instant, T)>>,
}

impl<T> Default for Fresh<T> {
    fn default() -> Self {
        Self {
            last: Mutex::new(None),
        }
    }
}

impl<T: Clone> Fresh<T> {
    /// The value of a `read` that started no earlier than this call.
    pub async fn get<E, Fut>(&self, read: impl FnOnce() -> Fut) -> Result<T, E>
    where
        Fut: Future<Output = Result<T, E>>,
    {
        let asked = Instant::now();
        // One read at a time: whoever waits here reuses the read made while it waited, when
        // that read started after it asked.
        let mut last = self.last.lock().await;
        if let Some((started, value)) = last.as_ref()
            && *started >= asked
        {
            return Ok(value.clone());
        }
        let started = Instant::now();
        let value = read().await?;
        *last = Some((started, value.clone()));
        Ok(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn callers_share_a_read_only_when_it_began_after_they_asked() {
        let fresh = Arc::new(Fresh::<u32>::default());
        let reads = Arc::new(AtomicU32::new(0));
        let read = |reads: Arc<AtomicU32>| async move {
            // The API call: takes time, and returns how many reads were made so far.
            tokio::time::sleep(Duration::from_millis(10)).await;
            Ok::<_, ()>(reads.fetch_add(1, Ordering::SeqCst) + 1)
        };
        // Ten actions asking at the same instant (the clock is paused): the read the first
        // makes begins at that instant too, not before any of them asked, so all share it.
        let together = futures::future::join_all((0..10).map(|_| {
            let (fresh, reads) = (Arc::clone(&fresh), Arc::clone(&reads));
            async move { fresh.get(|| read(reads)).await.unwrap() }
        }))
        .await;
        assert!(together.iter().all(|value| *value == 1), "{together:?}");
        // Asked while a read is in flight: that read began before the ask, so a new one is
        // made and shared by everyone who asked during the first.
        let first = {
            let (fresh, reads) = (Arc::clone(&fresh), Arc::clone(&reads));
            tokio::spawn(async move { fresh.get(|| read(reads)).await.unwrap() })
        };
        tokio::time::sleep(Duration::from_millis(5)).await;
        let during = futures::future::join_all((0..5).map(|_| {
            let (fresh, reads) = (Arc::clone(&fresh), Arc::clone(&reads));
            async move { fresh.get(|| read(reads)).await.unwrap() }
        }))
        .await;
        assert_eq!(first.await.unwrap(), 2);
        assert!(during.iter().all(|value| *value == 3), "{during:?}");
        assert_eq!(reads.load(Ordering::SeqCst), 3);
        // Later, alone: a read of its own.
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(fresh.get(|| read(Arc::clone(&reads))).await.unwrap(), 4);
    }
}
