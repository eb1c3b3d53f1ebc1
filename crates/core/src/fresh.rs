//! Reads that are fresh for everyone who asked: a destructive step waits for a read that
//! *began after* it asked, so a change made a moment before is always seen. Callers that ask
//! together share one read: a node of 110 pods force-deleted at once costs out-of-service-gc a
//! couple of Node reads, not 110, and a rollout's granting pass costs termination-controller one
//! LIST of a budget's nodes, not one per node it grants.

use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::{Mutex, watch};

/// The last read of one thing, shared by everyone who asks for it.
///
/// Reads are ordered by a count, not a clock: a coarse or paused clock gives a read and an ask
/// the same instant, and could then pass off a read that began before the ask as fresh.
#[derive(Debug)]
pub struct Fresh<T> {
    /// How many reads have begun.
    begun_count: AtomicU64,
    /// The number of the last read and what it gave, while a caller may still take it;
    /// locked while a read is under way.
    last: Mutex<Option<(u64, T)>>,
    /// Callers between their ask and their answer. The last one out drops `last`: a caller who
    /// asks after a read began never takes it, and a read of thousands of Nodes kept for no
    /// one was most of a rollout's idle memory.
    asking: AtomicUsize,
    /// Ticks as each read begins, for callers waiting to join the next.
    begun: watch::Sender<()>,
}

impl<T> Default for Fresh<T> {
    fn default() -> Self {
        Self {
            begun_count: AtomicU64::new(0),
            last: Mutex::new(None),
            asking: AtomicUsize::new(0),
            begun: watch::Sender::new(()),
        }
    }
}

impl<T: Clone> Fresh<T> {
    /// The value of a `read` that began no earlier than this call: the one under way or just
    /// made, if it began since, else a new one.
    pub async fn get<E, Fut>(&self, read: impl FnOnce() -> Fut) -> Result<T, E>
    where
        Fut: Future<Output = Result<T, E>>,
    {
        let (asking, asked) = self.ask();
        self.get_since(asking, asked, read).await
    }

    /// [`Self::get`], but joining a read some other caller begins within `within` rather than
    /// starting one at once: a check that can wait that long shares the next read instead of
    /// adding one of its own. Still a read that began after this call did.
    pub async fn get_joining<E, Fut>(
        &self,
        within: Duration,
        read: impl FnOnce() -> Fut,
    ) -> Result<T, E>
    where
        Fut: Future<Output = Result<T, E>>,
    {
        let mut begun = self.begun.subscribe();
        let (asking, asked) = self.ask();
        // Past `within`, or on any read beginning from now on: either way the read below is
        // the first that began after `asked`, waited for if it is under way.
        let _ = tokio::time::timeout(within, begun.changed()).await;
        self.get_since(asking, asked, read).await
    }

    /// Counts the caller in before it reads how many reads have begun, so that whoever sees
    /// itself the last one out knows no one asked before its read began.
    fn ask(&self) -> (Asking<'_>, u64) {
        self.asking.fetch_add(1, Ordering::SeqCst);
        let asking = Asking(&self.asking);
        (asking, self.begun_count.load(Ordering::SeqCst))
    }

    /// `asked`: how many reads had begun when the caller asked; a read numbered above it
    /// began after.
    async fn get_since<E, Fut>(
        &self,
        asking: Asking<'_>,
        asked: u64,
        read: impl FnOnce() -> Fut,
    ) -> Result<T, E>
    where
        Fut: Future<Output = Result<T, E>>,
    {
        // One read at a time: whoever waits here reuses the read made while it waited, when
        // that read began after it asked.
        let mut last = self.last.lock().await;
        let answer = match last.as_ref() {
            Some((number, value)) if *number > asked => Ok(value.clone()),
            _ => {
                let number = self.begun_count.fetch_add(1, Ordering::SeqCst) + 1;
                self.begun.send_replace(());
                let answer = read().await;
                if let Ok(value) = &answer {
                    *last = Some((number, value.clone()));
                }
                answer
            }
        };
        // Anyone who asks from now on asks after this read began: it is no one's any more.
        if self.asking.load(Ordering::SeqCst) == 1 {
            *last = None;
        }
        drop(asking);
        answer
    }
}

/// One caller between its ask and its answer (dropped with it, answered or not).
struct Asking<'a>(&'a AtomicUsize);

impl Drop for Asking<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
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
        // Ten actions asking together: the first begins a read as it asks, which is before
        // the nine others asked, so they share a second one.
        let together = futures::future::join_all((0..10).map(|_| {
            let (fresh, reads) = (Arc::clone(&fresh), Arc::clone(&reads));
            async move { fresh.get(|| read(reads)).await.unwrap() }
        }))
        .await;
        assert_eq!(together[0], 1);
        assert!(
            together[1..].iter().all(|value| *value == 2),
            "{together:?}"
        );
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
        assert_eq!(first.await.unwrap(), 3);
        assert!(during.iter().all(|value| *value == 4), "{during:?}");
        assert_eq!(reads.load(Ordering::SeqCst), 4);
        // Later, alone: a read of its own.
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(fresh.get(|| read(Arc::clone(&reads))).await.unwrap(), 5);
    }

    /// A read is kept only while someone who asked before it began may take it: once every
    /// caller has its answer, the only copies are theirs.
    #[tokio::test(start_paused = true)]
    async fn a_read_is_not_kept_once_every_caller_has_it() {
        let fresh = Arc::new(Fresh::<Arc<Vec<u8>>>::default());
        let read = || async {
            tokio::time::sleep(Duration::from_millis(10)).await;
            Ok::<_, ()>(Arc::new(vec![0; 1024]))
        };
        let alone = fresh.get(read).await.unwrap();
        assert_eq!(Arc::strong_count(&alone), 1, "kept after its only caller");
        let together = futures::future::join_all((0..3).map(|_| {
            let fresh = Arc::clone(&fresh);
            async move { fresh.get(read).await.unwrap() }
        }))
        .await;
        // The first began a read; the two that asked while it was under way share the next.
        assert!(
            Arc::ptr_eq(&together[1], &together[2]),
            "callers that asked together share one read"
        );
        assert_eq!(Arc::strong_count(&together[0]), 1, "kept after its caller");
        assert_eq!(Arc::strong_count(&together[1]), 2, "kept after its callers");
        let failed = fresh.get(|| async { Err::<Arc<Vec<u8>>, ()>(()) }).await;
        assert!(failed.is_err());
        let after = fresh.get(read).await.unwrap();
        assert_eq!(Arc::strong_count(&after), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_caller_that_can_wait_rides_on_the_next_read_begun() {
        let fresh = Arc::new(Fresh::<u32>::default());
        let reads = Arc::new(AtomicU32::new(0));
        let read = |reads: Arc<AtomicU32>| async move {
            tokio::time::sleep(Duration::from_millis(10)).await;
            Ok::<_, ()>(reads.fetch_add(1, Ordering::SeqCst) + 1)
        };
        let joining = {
            let (fresh, reads) = (Arc::clone(&fresh), Arc::clone(&reads));
            tokio::spawn(async move {
                fresh
                    .get_joining(Duration::from_secs(600), || read(reads))
                    .await
                    .unwrap()
            })
        };
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(reads.load(Ordering::SeqCst), 0, "it waits to join");
        assert_eq!(fresh.get(|| read(Arc::clone(&reads))).await.unwrap(), 1);
        assert_eq!(joining.await.unwrap(), 1, "one read for the two");

        tokio::time::sleep(Duration::from_secs(1)).await;
        let alone = fresh
            .get_joining(Duration::from_millis(20), || read(Arc::clone(&reads)))
            .await
            .unwrap();
        assert_eq!(
            alone, 2,
            "with no read begun in its window it reads on its own"
        );
    }
}
