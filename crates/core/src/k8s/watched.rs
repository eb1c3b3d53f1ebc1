//! A reflector cache with a change signal: the programs wait on "something changed" instead of
//! polling the API server, and read the cache when it fires.

use std::fmt::Debug;
use std::hash::Hash;
use std::sync::Arc;

use futures::StreamExt;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Resource};
use prometheus_client::metrics::counter::Counter;
use serde::de::DeserializeOwned;
use tokio::sync::watch;

use crate::error_chain::Chain;

/// Counters a program may keep about its watch (both optional).
#[derive(Debug, Clone, Default)]
pub struct WatchCounters {
    /// Objects applied or deleted, as the watch delivered them.
    pub events: Option<Counter>,
    /// Watch failures; the watch retries with backoff after each.
    pub restarts: Option<Counter>,
}

/// The watch ended: every stream of kube's watcher retries forever, so this means the task
/// that drives it is gone.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("the watch ended")]
pub struct WatchEnded;

/// Objects selected by one watch, and a signal that fires on every change to them. The watch
/// runs as long as any clone exists, and no longer: a program's stop token does not end it, so
/// work that still reads the cache while the program stops (a shutdown being finished) keeps
/// a live view. While the API server is away the cache keeps the last known state.
pub struct Watched<K: Resource + 'static>
where
    K::DynamicType: Eq + Hash + Clone,
{
    store: Store<K>,
    changes: watch::Receiver<u64>,
}

impl<K: Resource + 'static> std::fmt::Debug for Watched<K>
where
    K::DynamicType: Eq + Hash + Clone,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watched")
            .field("generation", &*self.changes.borrow())
            .finish_non_exhaustive()
    }
}

impl<K: Resource + 'static> Clone for Watched<K>
where
    K::DynamicType: Eq + Hash + Clone,
{
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            changes: self.changes.clone(),
        }
    }
}

impl<K> Watched<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Default + Send + Sync,
{
    /// Starts the watch in a task of its own.
    pub fn start(api: Api<K>, config: watcher::Config, counters: WatchCounters) -> Self {
        Self::start_trimmed(api, config, counters, |_| {})
    }

    /// Like [`start`](Self::start), with `trim` applied to every object before it is cached:
    /// a program that watches thousands of objects drops what it never reads
    /// (`managedFields`, a node's image list) and keeps its memory to what it uses.
    pub fn start_trimmed(
        api: Api<K>,
        config: watcher::Config,
        counters: WatchCounters,
        trim: fn(&mut K),
    ) -> Self {
        Self::start_observed(api, config, counters, trim, |_| {})
    }

    /// Like [`start_trimmed`](Self::start_trimmed), calling `observe` with every object the
    /// watch applies or deletes (after the cache has it), so a program can tell *which* object
    /// changed instead of rescanning all of them.
    pub fn start_observed(
        api: Api<K>,
        config: watcher::Config,
        counters: WatchCounters,
        trim: fn(&mut K),
        observe: impl Fn(&K) + Send + 'static,
    ) -> Self {
        let (store, writer) = reflector::store();
        let (notify, changes) = watch::channel(0u64);
        let events =
            reflector::reflector(writer, watcher(api, config).modify(trim)).default_backoff();
        tokio::spawn(async move {
            let mut events = std::pin::pin!(events);
            loop {
                tokio::select! {
                    () = notify.closed() => return,
                    event = events.next() => match event {
                        Some(Ok(event)) => {
                            if let watcher::Event::Apply(object)
                                | watcher::Event::Delete(object)
                                | watcher::Event::InitApply(object) = &event
                            {
                                observe(object);
                            }
                            if let (
                                watcher::Event::Apply(_) | watcher::Event::Delete(_) | watcher::Event::InitApply(_),
                                Some(counter),
                            ) = (&event, &counters.events) {
                                counter.inc();
                            }
                            notify.send_modify(|generation| *generation += 1);
                        }
                        Some(Err(error)) => {
                            if let Some(counter) = &counters.restarts {
                                counter.inc();
                            }
                            tracing::warn!(
                                kind = %K::kind(&K::DynamicType::default()),
                                error = %Chain(&error),
                                "watch failed; keeping the last known state and retrying"
                            );
                        }
                        None => return,
                    },
                }
            }
        });
        Self { store, changes }
    }

    /// A cache that stays empty and synced: for a kind the cluster does not serve (its CRD
    /// not installed), read as "none of them".
    pub fn empty() -> Self {
        let (store, mut writer) = reflector::store();
        writer.apply_watcher_event(&watcher::Event::Init);
        writer.apply_watcher_event(&watcher::Event::InitDone);
        let (notify, changes) = watch::channel(0u64);
        // Alive while any clone is, so `changed` waits rather than reporting the watch ended.
        tokio::spawn(async move { notify.closed().await });
        Self { store, changes }
    }

    /// Waits for the first complete listing.
    pub async fn synced(&self) -> Result<(), WatchEnded> {
        self.store.wait_until_ready().await.map_err(|_| WatchEnded)
    }

    pub fn state(&self) -> Vec<Arc<K>> {
        self.store.state()
    }

    /// The cached object named `name` (in `namespace`, for namespaced kinds).
    pub fn get(&self, namespace: Option<&str>, name: &str) -> Option<Arc<K>> {
        let mut reference = reflector::ObjectRef::new(name);
        if let Some(namespace) = namespace {
            reference = reference.within(namespace);
        }
        self.store.get(&reference)
    }

    /// Counts every change so far as seen by this clone: a caller about to read the whole
    /// state is not woken again for what it is going to read.
    pub fn mark_seen(&mut self) {
        self.changes.borrow_and_update();
    }

    /// Waits for the next change after the last one this clone saw.
    pub async fn changed(&mut self) -> Result<(), WatchEnded> {
        self.changes.changed().await.map_err(|_| WatchEnded)
    }
}
