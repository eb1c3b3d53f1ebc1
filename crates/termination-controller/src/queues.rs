//! Eviction queues: the pods of a draining node grouped by the PodDisruptionBudget that covers
//! them. A queue sends one eviction at a time; after an answer it waits for whichever comes
//! first of its timer and a budget status that says the next eviction will pass — a status it
//! has not seen yet (a new resourceVersion, so never the one from before its own eviction),
//! observed for the current generation, with `disruptionsAllowed` > 0. No queue polls: the
//! timer is the fallback for a watch that lags, and grows 100 ms → 10 s.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use nodegrace_core::backoff::Backoff;
use tokio::time::Instant;

/// Retry delay after a 500 "more than one PodDisruptionBudget": nothing but an operator's fix
/// helps, so asking often only fills the logs.
pub const MISCONFIGURED_RETRY: Duration = Duration::from_secs(30);
/// After this many refusals in a row a queue raises a Warning Event (and again every
/// `WARN_EVERY` after that).
pub const WARN_AFTER: u32 = 5;
pub const WARN_EVERY: u32 = 30;

/// Which queue a pod waits in.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum QueueKey {
    /// The budgets covering the pod (one, normally; several is a misconfiguration the
    /// Eviction API refuses with a 500).
    Budget {
        namespace: String,
        names: Vec<String>,
    },
    /// A pod no budget covers: a queue of its own, so such pods go in parallel (bounded by the
    /// drain's concurrency).
    Unbudgeted { namespace: String, name: String },
}

impl QueueKey {
    pub fn of(pod: &Pod, covering: &[&PodDisruptionBudget]) -> Self {
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        if covering.is_empty() {
            return Self::Unbudgeted {
                namespace,
                name: pod.metadata.name.clone().unwrap_or_default(),
            };
        }
        let mut names: Vec<String> = covering
            .iter()
            .filter_map(|pdb| pdb.metadata.name.clone())
            .collect();
        names.sort();
        Self::Budget { namespace, names }
    }

    /// The one budget whose status wakes this queue.
    pub fn budget(&self) -> Option<(&str, &str)> {
        match self {
            Self::Budget { namespace, names } if names.len() == 1 => {
                Some((namespace, names[0].as_str()))
            }
            _ => None,
        }
    }

    /// `namespace/name` of the budget(s), for metrics and messages; `none` for no budget.
    pub fn label(&self) -> String {
        match self {
            Self::Budget { namespace, names } => format!("{namespace}/{}", names.join("+")),
            Self::Unbudgeted { .. } => "none".to_owned(),
        }
    }
}

/// What a queue needs to know of its budget's cached status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetView {
    pub resource_version: String,
    pub allows: bool,
}

impl BudgetView {
    pub fn of(pdb: &PodDisruptionBudget) -> Self {
        let status = pdb.status.as_ref();
        let fresh = status.and_then(|status| status.observed_generation) >= pdb.metadata.generation;
        Self {
            resource_version: pdb.metadata.resource_version.clone().unwrap_or_default(),
            allows: fresh && status.and_then(|status| status.disruptions_allowed) > Some(0),
        }
    }
}

/// How one eviction request ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// 2xx: the pod is being deleted.
    Evicted,
    /// 404 or 409 (gone, or another pod by that name): nothing left to do.
    Gone,
    /// 429: the budget does not allow it now.
    Refused { retry_after: Option<Duration> },
    /// 500 naming several budgets.
    MultipleBudgets,
    /// Anything else (network, 5xx, 403): retried with backoff.
    Failed,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Gate {
    Open,
    Wait {
        until: Instant,
        /// The budget version the last answer was seen with; a different one may wake the
        /// queue early. `None`: only the timer does.
        seen: Option<String>,
    },
}

/// One queue's pacing.
#[derive(Debug, Clone)]
pub struct Queue {
    in_flight: bool,
    refusals: u32,
    failures: u32,
    gate: Gate,
}

impl Default for Queue {
    fn default() -> Self {
        Self {
            in_flight: false,
            refusals: 0,
            failures: 0,
            gate: Gate::Open,
        }
    }
}

/// Stretches `delay` by a factor in [0.8, 1.2) (`unit` in [0, 1)), so queues that failed
/// together do not retry together.
pub fn jittered(delay: Duration, unit: f64) -> Duration {
    delay.mul_f64(0.8 + 0.4 * unit.clamp(0.0, 1.0))
}

impl Queue {
    /// Whether the queue may send its next eviction now.
    pub fn due(&self, now: Instant, view: Option<&BudgetView>) -> bool {
        if self.in_flight {
            return false;
        }
        match &self.gate {
            Gate::Open => true,
            Gate::Wait { until, seen } => {
                now >= *until
                    || seen.as_ref().is_some_and(|seen| {
                        view.is_some_and(|view| view.allows && view.resource_version != *seen)
                    })
            }
        }
    }

    /// When the timer would make the queue due (none while a request is out or it is open).
    pub fn wakes_at(&self) -> Option<Instant> {
        match (&self.gate, self.in_flight) {
            (Gate::Wait { until, .. }, false) => Some(*until),
            _ => None,
        }
    }

    pub fn in_flight(&self) -> bool {
        self.in_flight
    }

    /// Refusals (429) in a row.
    pub fn refusals(&self) -> u32 {
        self.refusals
    }

    pub fn sent(&mut self) {
        self.in_flight = true;
    }

    /// Records an answer; returns whether it is time for a Warning Event about the refusals.
    pub fn answered(
        &mut self,
        outcome: &Outcome,
        now: Instant,
        view: Option<&BudgetView>,
        backoff: Backoff,
        unit: f64,
    ) -> bool {
        self.in_flight = false;
        let seen = view.map(|view| view.resource_version.clone());
        match outcome {
            Outcome::Evicted => {
                self.refusals = 0;
                self.failures = 0;
                // The next pod waits for a status that counts this eviction.
                self.gate = Gate::Wait {
                    until: now + backoff.longest,
                    seen,
                };
                false
            }
            Outcome::Gone => {
                self.refusals = 0;
                self.failures = 0;
                self.gate = Gate::Open;
                false
            }
            Outcome::Refused { retry_after } => {
                self.refusals += 1;
                let delay = jittered(backoff.delay(self.refusals), unit)
                    .max(retry_after.unwrap_or_default());
                self.gate = Gate::Wait {
                    until: now + delay,
                    seen,
                };
                self.refusals == WARN_AFTER
                    || (self.refusals > WARN_AFTER && self.refusals.is_multiple_of(WARN_EVERY))
            }
            Outcome::MultipleBudgets => {
                self.failures += 1;
                self.gate = Gate::Wait {
                    until: now + MISCONFIGURED_RETRY,
                    seen: None,
                };
                self.failures == 1
            }
            Outcome::Failed => {
                self.failures += 1;
                self.gate = Gate::Wait {
                    until: now + jittered(backoff.delay(self.failures), unit),
                    seen: None,
                };
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const BACKOFF: Backoff = Backoff {
        first: Duration::from_millis(100),
        longest: Duration::from_secs(10),
    };

    fn pdb(
        name: &str,
        rv: &str,
        generation: i64,
        observed: i64,
        allowed: i32,
    ) -> PodDisruptionBudget {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "shop", "resourceVersion": rv, "generation": generation},
            "spec": {"selector": {"matchLabels": {"app": name}}},
            "status": {"observedGeneration": observed, "disruptionsAllowed": allowed,
                       "currentHealthy": 3, "desiredHealthy": 2, "expectedPods": 3},
        }))
        .unwrap()
    }

    #[test]
    fn pods_queue_by_their_budgets_and_unbudgeted_pods_alone() {
        let pod: Pod =
            serde_json::from_value(json!({"metadata": {"name": "web-1", "namespace": "shop"}}))
                .unwrap();
        let (web, all) = (pdb("web", "1", 1, 1, 1), pdb("all", "1", 1, 1, 1));
        assert_eq!(
            QueueKey::of(&pod, &[&web]),
            QueueKey::Budget {
                namespace: "shop".into(),
                names: vec!["web".into()]
            }
        );
        let both = QueueKey::of(&pod, &[&web, &all]);
        assert_eq!(both.label(), "shop/all+web");
        assert_eq!(
            both.budget(),
            None,
            "several budgets: only the timer wakes it"
        );
        assert_eq!(QueueKey::of(&pod, &[&web]).budget(), Some(("shop", "web")));
        assert_eq!(
            QueueKey::of(&pod, &[]),
            QueueKey::Unbudgeted {
                namespace: "shop".into(),
                name: "web-1".into()
            }
        );
    }

    #[test]
    fn a_stale_or_exhausted_budget_does_not_allow() {
        assert!(BudgetView::of(&pdb("web", "1", 2, 2, 1)).allows);
        assert!(!BudgetView::of(&pdb("web", "1", 2, 1, 1)).allows, "stale");
        assert!(!BudgetView::of(&pdb("web", "1", 2, 2, 0)).allows);
    }

    #[test]
    fn after_an_eviction_only_a_newer_allowing_status_or_the_timer_wakes_the_queue() {
        let start = Instant::now();
        let mut queue = Queue::default();
        let before = BudgetView::of(&pdb("web", "10", 1, 1, 1));
        assert!(queue.due(start, Some(&before)));
        queue.sent();
        assert!(!queue.due(start, Some(&before)), "one request at a time");
        assert!(!queue.answered(&Outcome::Evicted, start, Some(&before), BACKOFF, 0.5));
        assert!(
            !queue.due(start, Some(&before)),
            "the status from before the eviction"
        );
        let counted = BudgetView::of(&pdb("web", "11", 1, 1, 0));
        assert!(
            !queue.due(start, Some(&counted)),
            "newer, but allows nothing"
        );
        let replaced = BudgetView::of(&pdb("web", "12", 1, 1, 1));
        assert!(queue.due(start, Some(&replaced)), "woken by the budget");
        assert_eq!(queue.wakes_at(), Some(start + Duration::from_secs(10)));
        assert!(
            queue.due(start + Duration::from_secs(10), None),
            "the timer as fallback"
        );
    }

    #[test]
    fn refusals_back_off_with_jitter_honour_retry_after_and_warn_when_repeated() {
        let start = Instant::now();
        let view = BudgetView::of(&pdb("web", "10", 1, 1, 0));
        let mut queue = Queue::default();
        let mut delays = Vec::new();
        let mut warnings = Vec::new();
        for attempt in 1..=9u32 {
            queue.sent();
            let warn = queue.answered(
                &Outcome::Refused { retry_after: None },
                start,
                Some(&view),
                BACKOFF,
                0.5,
            );
            delays.push(queue.wakes_at().unwrap() - start);
            if warn {
                warnings.push(attempt);
            }
        }
        let millis: Vec<u128> = delays.iter().map(Duration::as_millis).collect();
        assert_eq!(millis, [100, 200, 400, 800, 1600, 3200, 6400, 10000, 10000]);
        assert_eq!(warnings, [WARN_AFTER]);
        assert_eq!(
            jittered(Duration::from_secs(1), 0.0),
            Duration::from_millis(800)
        );
        assert_eq!(
            jittered(Duration::from_secs(1), 0.999_999).as_millis(),
            1199
        );
        queue.sent();
        queue.answered(
            &Outcome::Refused {
                retry_after: Some(Duration::from_secs(20)),
            },
            start,
            Some(&view),
            BACKOFF,
            0.5,
        );
        assert_eq!(queue.wakes_at(), Some(start + Duration::from_secs(20)));
        let allowing = BudgetView::of(&pdb("web", "11", 1, 1, 1));
        assert!(
            queue.due(start, Some(&allowing)),
            "a status that allows wakes it before Retry-After"
        );
    }

    #[test]
    fn misconfigured_budgets_retry_slowly_on_the_timer_alone() {
        let start = Instant::now();
        let mut queue = Queue::default();
        queue.sent();
        assert!(
            queue.answered(&Outcome::MultipleBudgets, start, None, BACKOFF, 0.5),
            "warn at once"
        );
        assert_eq!(queue.wakes_at(), Some(start + MISCONFIGURED_RETRY));
        let allowing = BudgetView::of(&pdb("web", "11", 1, 1, 1));
        assert!(!queue.due(start, Some(&allowing)));
        queue.sent();
        queue.answered(&Outcome::Gone, start, None, BACKOFF, 0.5);
        assert!(queue.due(start, None));
    }
}
