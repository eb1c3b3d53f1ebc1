//! Fault injection: what a test needs to see a controller survive a misbehaving API server.
//! Latency, failure rates per verb and resource, closing every watch, an outage (connections
//! dropped), and history expiry (watches resuming get 410 Gone).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::time::Instant;

/// How a matching request fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum FailureKind {
    /// 500 InternalError.
    InternalError,
    /// 429 TooManyRequests with Retry-After.
    TooManyRequests,
    /// The connection is dropped without an answer.
    ConnectionReset,
    /// 409 Conflict, as a write that lost a race with another writer gets.
    Conflict,
}

/// Fail `rate` (0..=1) of the requests with `verb` (get, list, watch, create, update, patch,
/// delete, deletecollection; empty = any) on `resource` (plural; empty = any).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ErrorRule {
    #[serde(default)]
    pub verb: String,
    #[serde(default)]
    pub resource: String,
    pub rate: f64,
    pub failure: FailureKind,
}

#[derive(Debug, Default)]
struct Settings {
    latency: Duration,
    rules: Vec<ErrorRule>,
    outage_until: Option<Instant>,
}

/// Shared by the server and whoever injects faults. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Faults {
    settings: Arc<Mutex<Settings>>,
    watches: Arc<watch::Sender<u64>>,
    /// Requests failed by a rule (not by an outage), for tests that wait for one.
    failed: Arc<std::sync::atomic::AtomicU64>,
}

impl Default for Faults {
    fn default() -> Self {
        Self {
            settings: Arc::default(),
            watches: Arc::new(watch::channel(0).0),
            failed: Arc::default(),
        }
    }
}

/// What to do with one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Serve,
    Fail(FailureKind),
}

impl Faults {
    fn settings(&self) -> std::sync::MutexGuard<'_, Settings> {
        self.settings.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn set_latency(&self, latency: Duration) {
        self.settings().latency = latency;
    }

    pub fn latency(&self) -> Duration {
        self.settings().latency
    }

    pub fn add_rule(&self, rule: ErrorRule) {
        self.settings().rules.push(rule);
    }

    /// Removes every fault (latency, rules, outage).
    pub fn clear(&self) {
        *self.settings() = Settings::default();
    }

    /// Ends every open watch now; clients must re-watch.
    pub fn close_watches(&self) {
        self.watches.send_modify(|generation| *generation += 1);
    }

    pub(crate) fn watches_closed(&self) -> watch::Receiver<u64> {
        self.watches.subscribe()
    }

    /// Drops every connection and request for `duration`, as an unreachable API server.
    pub fn outage(&self, duration: Duration) {
        self.settings().outage_until = Some(Instant::now() + duration);
        self.close_watches();
    }

    pub fn end_outage(&self) {
        self.settings().outage_until = None;
    }

    pub fn in_outage(&self) -> bool {
        self.settings()
            .outage_until
            .is_some_and(|until| Instant::now() < until)
    }

    /// Decides the fate of a request.
    pub fn judge(&self, verb: &str, resource: &str) -> Verdict {
        let settings = self.settings();
        if settings
            .outage_until
            .is_some_and(|until| Instant::now() < until)
        {
            return Verdict::Fail(FailureKind::ConnectionReset);
        }
        for rule in &settings.rules {
            let applies = (rule.verb.is_empty() || rule.verb == verb)
                && (rule.resource.is_empty() || rule.resource == resource);
            if applies && rand::random::<f64>() < rule.rate {
                self.failed
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                return Verdict::Fail(rule.failure);
            }
        }
        Verdict::Serve
    }

    /// How many requests the error rules have failed so far.
    pub fn failed(&self) -> u64 {
        self.failed.load(std::sync::atomic::Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_match_verb_and_resource() {
        let faults = Faults::default();
        assert_eq!(faults.judge("list", "pods"), Verdict::Serve);
        faults.add_rule(ErrorRule {
            verb: "delete".into(),
            resource: "pods".into(),
            rate: 1.0,
            failure: FailureKind::TooManyRequests,
        });
        assert_eq!(
            faults.judge("delete", "pods"),
            Verdict::Fail(FailureKind::TooManyRequests)
        );
        assert_eq!(faults.judge("delete", "nodes"), Verdict::Serve);
        assert_eq!(faults.judge("get", "pods"), Verdict::Serve);
        faults.clear();
        assert_eq!(faults.judge("delete", "pods"), Verdict::Serve);
    }

    #[tokio::test]
    async fn outage_fails_everything_until_it_ends_and_closes_watches() {
        let faults = Faults::default();
        let mut closed = faults.watches_closed();
        faults.outage(Duration::from_secs(60));
        assert!(closed.has_changed().unwrap());
        closed.mark_unchanged();
        assert_eq!(
            faults.judge("get", "nodes"),
            Verdict::Fail(FailureKind::ConnectionReset)
        );
        faults.end_outage();
        assert_eq!(faults.judge("get", "nodes"), Verdict::Serve);
    }
}
