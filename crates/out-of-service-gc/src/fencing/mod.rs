//! `--fence-after`: this controller as the fencing agent KEP-2268 leaves to the operator. A
//! managed node NotReady that long has its machine powered off through the provider, behind
//! every guard; once the provider *reports* it off (the request's answer proves nothing) the
//! node gets the fence annotation and the out-of-service taint, and the cleanup follows. With
//! `--recover-after-cleanup` the clean machine is powered on again (see [`Fencer::recover`]).
//!
//! Every power change is preceded by its step written on the Node ([`crate::fence_mark`]),
//! decided again on the very version written, so a restart, a second leader or a namesake
//! finds what was under way instead of guessing. The histories this guards against, and their
//! tests, are in docs/out-of-service-gc.md ("Fencing and recovery").

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use nodegrace_controller::instances::InstanceProvider;
use nodegrace_core::backoff::{Backoff, Retry};
use nodegrace_core::k8s::conditions::ConditionSpec;
use nodegrace_core::k8s::events::EventReport;
use nodegrace_core::k8s::node_identity::{NodeIdentity, Updated};
use nodegrace_core::k8s::nodes::{node_reference, taint_with_key};
use nodegrace_core::k8s::reporter::ConditionGuard;
use nodegrace_core::k8s::selectors::selects_node;
use nodegrace_core::k8s::watched::Watched;

use crate::api::{FENCE_CONDITION, OUT_OF_SERVICE_TAINT};
use crate::conditions::Reason;
use crate::fence_mark::{Mark, Step, do_not_fence, mark, set_mark};
use crate::qualify::not_ready_since;
use crate::shared::{PassError, Shared};

mod guards;
mod power;
mod recovery;

use guards::Cleared;

const ACTION: &str = "Fence";
/// How often the provider is asked whether a machine is off yet.
pub(crate) const POLL: Duration = Duration::from_secs(1);
/// How soon a fence held by a guard is looked at again.
pub(crate) const RECHECK: Duration = Duration::from_secs(10);
/// A machine's failed provider calls (power off, power on, state): 10 s, doubling to 5 min,
/// plus up to a tenth. No change of the node, not even our own write, retries sooner.
pub const PROVIDER_BACKOFF: Backoff = Backoff {
    first: Duration::from_secs(10),
    longest: Duration::from_secs(300),
};

#[derive(Debug, Clone)]
pub struct FenceSettings {
    pub after: Duration,
    pub selector: LabelSelector,
    pub max_fraction: f64,
    pub max_fenced: usize,
    pub timeout: Duration,
    pub recover: bool,
    pub recover_timeout: Duration,
    /// `--liveness-guard-window`: the kubelet's silence a fence needs first.
    pub window: Option<Duration>,
}

/// What an attempt leaves to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FenceOutcome {
    /// Nothing for now: not a candidate, or fenced (the cleanup takes it from here).
    NotDue,
    /// Held or failed: look again after this long, and not sooner whatever changes.
    Retry(Duration),
    /// Held until the node changes (`nodegrace.io/do-not-fence`).
    WaitForChange,
}

pub struct Fencer {
    pub provider: Arc<dyn InstanceProvider>,
    pub settings: FenceSettings,
    /// Every node, for the partition guard.
    pub nodes: Watched<Node>,
    /// One decision to fence at a time: `--max-fenced` counts the steps written, so two
    /// decisions must not both count the same free place.
    deciding: tokio::sync::Mutex<()>,
    /// The last reason reported per node (by name, with the UID it was said of), so a pass
    /// that finds the same hold says nothing new.
    said: Mutex<HashMap<String, (String, Reason)>>,
    /// Each Node object's failures in a row and the earliest it may be tried again, shared by
    /// the fence and the recovery of its machine.
    retries: Mutex<BTreeMap<NodeIdentity, Retry>>,
}

impl std::fmt::Debug for Fencer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fencer")
            .field("provider", &self.provider.name())
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

/// One line of the fence's story on the node: the condition, and an Event when it is news.
pub(crate) struct Report {
    pub reason: Reason,
    /// The condition's status: `True` while a machine is held off or on its way.
    pub holding: bool,
    pub warning: bool,
    pub message: String,
}

impl Fencer {
    pub fn new(
        provider: Arc<dyn InstanceProvider>,
        settings: FenceSettings,
        nodes: Watched<Node>,
    ) -> Self {
        Self {
            provider,
            settings,
            nodes,
            deciding: tokio::sync::Mutex::new(()),
            said: Mutex::default(),
            retries: Mutex::default(),
        }
    }

    fn retries(&self) -> std::sync::MutexGuard<'_, BTreeMap<NodeIdentity, Retry>> {
        self.retries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `identity`'s failures in a row.
    fn failures(&self, identity: &NodeIdentity) -> u32 {
        self.retries().get(identity).map_or(0, Retry::failures)
    }

    /// How long `identity`'s machine must still wait after its last failure or hold.
    pub fn retry_wait(&self, identity: &NodeIdentity) -> Option<Duration> {
        let now = tokio::time::Instant::now();
        self.retries()
            .get(identity)
            .and_then(|retry| retry.wait(now))
    }

    /// Counts a failure of `identity`'s work under `policy`; returns how long it now waits.
    pub fn failed(&self, identity: &NodeIdentity, policy: Backoff) -> Duration {
        let now = tokio::time::Instant::now();
        self.retries()
            .entry(identity.clone())
            .or_default()
            .failed(policy, now)
    }

    /// A guard holds `identity` for `wait`: not looked at sooner, no failure counted.
    fn held_for(&self, identity: &NodeIdentity, wait: Duration) {
        let now = tokio::time::Instant::now();
        self.retries()
            .entry(identity.clone())
            .or_default()
            .hold(wait, now);
    }

    /// `identity`'s work went through (or has nothing left to fail): its backoff starts over.
    fn succeeded(&self, identity: &NodeIdentity) {
        self.retries().remove(identity);
    }

    pub fn manages(&self, node: &Node) -> bool {
        selects_node(&self.settings.selector, node)
    }

    /// When `node` is to be looked at: a fence under way at once (resumed after a restart), a
    /// managed untainted NotReady node once it has been NotReady for `--fence-after`.
    pub fn due_at(&self, node: &Node, now: Timestamp) -> Option<Timestamp> {
        match mark(node) {
            Some(Mark {
                step: Step::Fencing,
                ..
            }) => Some(now),
            Some(_) => None,
            None if !self.manages(node) || taint_with_key(node, OUT_OF_SERVICE_TAINT).is_some() => {
                None
            }
            None => not_ready_since(node)?.checked_add(self.settings.after).ok(),
        }
    }

    /// Says once per NotReady period that the node is seen down and when it would be fenced.
    pub fn seen_not_ready(&self, shared: &Shared, node: &Node, due: Timestamp) {
        if mark(node).is_some() || due <= Timestamp::now() {
            return;
        }
        let Some(since) = not_ready_since(node) else {
            return;
        };
        let name = node.metadata.name.as_deref().unwrap_or_default();
        let uid = node.metadata.uid.clone().unwrap_or_default();
        self.report(
            shared,
            name,
            &uid,
            Report {
                reason: Reason::NotReadySeen,
                holding: false,
                warning: false,
                message: format!(
                    "NotReady since {since}: its machine is powered off at {} (--fence-after \
                     {}s) unless the node comes back or a guard holds it",
                    due.round(jiff::Unit::Second).unwrap_or(due),
                    self.settings.after.as_secs()
                ),
            },
        );
    }

    pub(crate) fn report(&self, shared: &Shared, name: &str, uid: &str, report: Report) {
        let Report {
            reason,
            holding,
            warning,
            message,
        } = report;
        let said_reason = reason;
        let reason = said_reason.as_str();
        shared.reporter.condition_of(
            &NodeIdentity::new(name, uid),
            ConditionSpec::new(
                FENCE_CONDITION,
                if holding { "True" } else { "False" },
                reason,
                &message,
            ),
            ConditionGuard::Always,
        );
        let news = self
            .said
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(name.to_owned(), (uid.to_owned(), said_reason))
            .is_none_or(|said| said != (uid.to_owned(), said_reason));
        if news {
            if warning {
                tracing::warn!(node = name, reason, %message, "fence");
            } else {
                tracing::info!(node = name, reason, %message, "fence");
            }
            let reference = node_reference(name);
            let event = if warning {
                EventReport::warning(reference, reason, ACTION, message)
            } else {
                EventReport::normal(reference, reason, ACTION, message)
            };
            // A step tried again (Fencing, FenceFailed, …) counts up its first Event.
            shared
                .reporter
                .event(event.in_series(format!("{uid}/{reason}")));
        }
    }

    /// Looks at `identity` afresh and fences it when it is due and every guard allows it:
    /// the guards (`guards.rs`), the step stamped on the Node (`stamp`), then the power-off
    /// and its confirmation (`power.rs`).
    pub async fn attempt(
        &self,
        shared: &Shared,
        identity: &NodeIdentity,
    ) -> Result<FenceOutcome, PassError> {
        // A failed call or a guard's hold is waited out whatever woke this attempt.
        if let Some(wait) = self.retry_wait(identity) {
            return Ok(FenceOutcome::Retry(wait));
        }
        let Some(node) = read(shared, identity).await? else {
            self.succeeded(identity);
            return Ok(FenceOutcome::NotDue);
        };
        match mark(&node) {
            Some(Mark {
                step: Step::Fencing,
                since,
            }) => return self.resume(shared, identity, &node, since).await,
            Some(_) => return Ok(FenceOutcome::NotDue),
            None => {}
        }
        let now = Timestamp::now();
        if self.due_at(&node, now).is_none_or(|due| due > now) {
            self.succeeded(identity);
            return Ok(FenceOutcome::NotDue);
        }
        let cleared = match self.guards(shared, identity, &node).await? {
            Ok(cleared) => cleared,
            Err(hold) => return Ok(self.hold(shared, identity, hold)),
        };
        // One decision at a time: `--max-fenced` counts the steps written.
        let deciding = self.deciding.lock().await;
        if let Some(hold) = self.max_fenced(shared, identity).await? {
            return Ok(self.hold(shared, identity, hold));
        }
        let Some(stamped_at) = self.stamp(shared, identity).await? else {
            return Ok(FenceOutcome::NotDue);
        };
        drop(deciding);
        self.power_off_stamped(shared, identity, &node, &cleared, stamped_at)
            .await
    }

    /// Writes the `fencing` step, decided again on the version written: still due, no step,
    /// no `do-not-fence`. Returns when, if it was written.
    async fn stamp(
        &self,
        shared: &Shared,
        identity: &NodeIdentity,
    ) -> Result<Option<Timestamp>, PassError> {
        let stamped_at = Timestamp::now();
        let stamped = identity
            .update(&shared.client, |current| {
                let now = Timestamp::now();
                let due = self.due_at(current, now).is_some_and(|due| due <= now);
                if !due || mark(current).is_some() || do_not_fence(current).is_some() {
                    return false;
                }
                set_mark(current, Step::Fencing, stamped_at);
                true
            })
            .await
            .map_err(|error| {
                PassError::update(format!("mark node {} fencing", identity.name()), error)
            })?;
        Ok(matches!(stamped, Updated::Written(_)).then_some(stamped_at))
    }

    /// Says that the power-off goes out, sends it unless the machine is off already, and
    /// confirms it.
    async fn power_off_stamped(
        &self,
        shared: &Shared,
        identity: &NodeIdentity,
        node: &Node,
        cleared: &Cleared,
        stamped_at: Timestamp,
    ) -> Result<FenceOutcome, PassError> {
        let Cleared { id, state } = cleared;
        let down_for = not_ready_since(node)
            .map(|since| stamped_at.duration_since(since).as_secs())
            .unwrap_or_default();
        self.report(
            shared,
            identity.name(),
            identity.uid(),
            Report {
                reason: Reason::Fencing,
                holding: true,
                warning: true,
                message: format!(
                    "NotReady for {down_for}s (--fence-after {}s), its kubelet silent, within \
                     the partition guard: powering machine {id} off through {} ({state} now)",
                    self.settings.after.as_secs(),
                    self.provider.name()
                ),
            },
        );
        if !state.powered_off()
            && let Err(why) = self.power_off(id).await
        {
            return self.fail(shared, identity, why).await;
        }
        self.confirm(shared, identity, id, stamped_at).await
    }
}

/// A wait as the messages say it: whole seconds.
pub(crate) fn seconds(wait: Duration) -> String {
    format!("{}s", wait.as_secs_f64().round())
}

pub(crate) fn seconds_between(from: Timestamp, to: Timestamp) -> f64 {
    to.duration_since(from).as_secs_f64().max(0.0)
}

async fn read(shared: &Shared, identity: &NodeIdentity) -> Result<Option<Node>, PassError> {
    identity
        .read(&shared.client)
        .await
        .map_err(|error| PassError::Api {
            what: format!("read node {}", identity.name()),
            source: error,
        })
}
