//! The reconciler skeleton the cluster-wide controllers share, in kube-rs's controller-rs
//! manner: `reconcile(object, context) -> Result<Action>`, and an error policy that backs off
//! per object (exponentially, reset by a success) and counts errors by kind.

use std::collections::{HashMap, HashSet};
use std::fmt::Debug;
use std::future::Future;
use std::hash::Hash;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use kube::runtime::controller::Action;
use kube::runtime::{Controller, watcher};
use kube::{Api, Resource, ResourceExt};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use serde::de::DeserializeOwned;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::error_chain::Chain;

/// Names of objects that changed since a loop last looked: a watch's observer marks them, the
/// loop takes them when woken, so one change never costs a rescan of every object.
#[derive(Debug, Default)]
pub struct Dirty {
    names: std::sync::Mutex<HashSet<String>>,
    notify: Notify,
}

impl Dirty {
    pub fn mark(&self, name: &str) {
        self.names
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(name.to_owned());
        self.notify.notify_one();
    }

    /// The names marked since the last call.
    pub fn take(&self) -> HashSet<String> {
        std::mem::take(&mut *self.names.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Waits for the next mark (one made since the last wait counts).
    pub async fn marked(&self) {
        self.notify.notified().await;
    }
}

/// A reconcile error that says what kind it is, for the metric and the logs.
pub trait ReconcileError: std::error::Error + Send + Sync + 'static {
    /// A short, fixed label (`api`, `forbidden`, `invalid-spec`), never an object's name.
    fn kind(&self) -> &'static str;
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    pub kind: String,
}

/// `reconciliations_total`, `reconcile_errors_total{kind}`, `reconcile_duration_seconds`.
#[derive(Debug, Clone)]
pub struct ControllerMetrics {
    pub reconciliations: Counter,
    pub errors: Family<ErrorLabels, Counter>,
    pub duration: Histogram,
}

impl ControllerMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            reconciliations: Counter::default(),
            errors: Family::default(),
            duration: Histogram::new(exponential_buckets(0.001, 4.0, 8)),
        };
        registry.register(
            "reconciliations",
            "Reconciliations run",
            metrics.reconciliations.clone(),
        );
        registry.register(
            "reconcile_errors",
            "Reconciliations that failed, by error kind",
            metrics.errors.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "How long one reconciliation took",
            metrics.duration.clone(),
        );
        metrics
    }
}

/// Retry delays for an object whose reconciliation keeps failing: `first`, doubling, at most
/// `longest`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub first: Duration,
    pub longest: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            first: Duration::from_millis(500),
            longest: Duration::from_secs(300),
        }
    }
}

impl Backoff {
    /// The delay after the `failures`-th failure in a row (1-based).
    pub fn delay(self, failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(31);
        self.first
            .saturating_mul(1u32 << doublings)
            .min(self.longest)
    }
}

/// What every reconcile gets: the program's own state, the metrics, and the failure counts
/// the error policy backs off on.
#[derive(Debug)]
pub struct Context<T> {
    pub state: T,
    pub metrics: ControllerMetrics,
    pub backoff: Backoff,
    failures: Mutex<HashMap<String, u32>>,
}

impl<T> Context<T> {
    pub fn new(state: T, metrics: ControllerMetrics, backoff: Backoff) -> Arc<Self> {
        Arc::new(Self {
            state,
            metrics,
            backoff,
            failures: Mutex::default(),
        })
    }

    fn failures(&self) -> std::sync::MutexGuard<'_, HashMap<String, u32>> {
        self.failures.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records a failure of `key` and returns how long to wait before the retry.
    pub fn failed(&self, key: &str, error: &dyn ReconcileError) -> Duration {
        self.metrics
            .errors
            .get_or_create(&ErrorLabels {
                kind: error.kind().to_owned(),
            })
            .inc();
        let mut failures = self.failures();
        let count = failures.entry(key.to_owned()).or_default();
        *count += 1;
        self.backoff.delay(*count)
    }

    fn succeeded(&self, key: &str) {
        self.failures().remove(key);
    }
}

fn key_of<K: Resource>(object: &K) -> String {
    match object.namespace() {
        Some(namespace) => format!("{namespace}/{}", object.name_any()),
        None => object.name_any(),
    }
}

/// Runs a controller over the objects `api` and `config` select until `stop`, with at most
/// one reconciliation per object at a time (kube's Controller guarantees it).
pub async fn run<K, T, E, F, Fut>(
    api: Api<K>,
    config: watcher::Config,
    context: Arc<Context<T>>,
    reconcile: F,
    stop: CancellationToken,
) where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Default + Debug + Unpin,
    T: Send + Sync + 'static,
    E: ReconcileError,
    F: Fn(Arc<K>, Arc<Context<T>>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Action, E>> + Send + 'static,
{
    let reconcile = Arc::new(reconcile);
    let measured = move |object: Arc<K>, context: Arc<Context<T>>| {
        let reconcile = Arc::clone(&reconcile);
        async move {
            let started = tokio::time::Instant::now();
            let key = key_of(object.as_ref());
            let result = reconcile(object, Arc::clone(&context)).await;
            context.metrics.reconciliations.inc();
            context
                .metrics
                .duration
                .observe(started.elapsed().as_secs_f64());
            if result.is_ok() {
                context.succeeded(&key);
            }
            result
        }
    };
    let error_policy = |object: Arc<K>, error: &E, context: Arc<Context<T>>| {
        let key = key_of(object.as_ref());
        let delay = context.failed(&key, error);
        tracing::warn!(object = key, kind = error.kind(), error = %Chain(error), retry_in = ?delay, "reconcile failed");
        Action::requeue(delay)
    };
    Controller::new(api, config)
        .graceful_shutdown_on(async move { stop.cancelled().await })
        .run(measured, error_policy, context)
        .for_each(|_| futures::future::ready(()))
        .await;
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_the_first_delay_to_the_cap() {
        let backoff = Backoff {
            first: Duration::from_millis(500),
            longest: Duration::from_secs(5),
        };
        let cases = [
            (0, 500),
            (1, 500),
            (2, 1000),
            (3, 2000),
            (4, 4000),
            (5, 5000),
            (40, 5000),
            (u32::MAX, 5000),
        ];
        for (failures, millis) in cases {
            assert_eq!(
                backoff.delay(failures),
                Duration::from_millis(millis),
                "after {failures} failures"
            );
        }
    }

    #[derive(Debug, thiserror::Error)]
    #[error("boom")]
    struct Boom;

    impl ReconcileError for Boom {
        fn kind(&self) -> &'static str {
            "boom"
        }
    }

    #[test]
    fn failures_back_off_per_object_and_count_by_kind() {
        let mut registry = Registry::default();
        let context = Context::new(
            (),
            ControllerMetrics::register(&mut registry),
            Backoff::default(),
        );
        assert_eq!(context.failed("a", &Boom), Duration::from_millis(500));
        assert_eq!(context.failed("a", &Boom), Duration::from_secs(1));
        assert_eq!(
            context.failed("b", &Boom),
            Duration::from_millis(500),
            "per object"
        );
        context.succeeded("a");
        assert_eq!(
            context.failed("a", &Boom),
            Duration::from_millis(500),
            "reset by success"
        );
        let count = context
            .metrics
            .errors
            .get_or_create(&ErrorLabels {
                kind: "boom".into(),
            })
            .get();
        assert_eq!(count, 4);
    }
}
