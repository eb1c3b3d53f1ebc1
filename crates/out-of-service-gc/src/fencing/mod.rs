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
use k8s_openapi::api::core::v1::{Node, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};
use kube::Api;
use kube::api::ListParams;
use nodegrace_core::backoff::{Backoff, Retry};
use nodegrace_core::instances::{InstanceProvider, InstanceState, Power, ProviderId};
use nodegrace_core::k8s::conditions::ConditionSpec;
use nodegrace_core::k8s::events::EventReport;
use nodegrace_core::k8s::node_identity::{NodeIdentity, Updated};
use nodegrace_core::k8s::nodes::{Readiness, node_reference, readiness, taint_with_key};
use nodegrace_core::k8s::partition::partitioned;
use nodegrace_core::k8s::reporter::ConditionGuard;
use nodegrace_core::k8s::selectors::selects_node;
use nodegrace_core::k8s::taints::put_taint;
use nodegrace_core::k8s::watched::Watched;

use crate::fence_mark::{FENCE_LABEL, Mark, Step, clear_mark, do_not_fence, mark, set_mark};
use crate::guard::Heartbeat;
use crate::qualify::{EXPECTED_EFFECT, OUT_OF_SERVICE_TAINT, not_ready_since};
use crate::shared::{PassError, Shared};
use crate::status::{AUTO_TAINT_VALUE, FENCED_ANNOTATION};

mod recovery;

/// The node condition that tells where a fence stands.
pub const CONDITION: &str = "OutOfServiceFence";
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
    said: Mutex<HashMap<String, (String, &'static str)>>,
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
    pub reason: &'static str,
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
                reason: "NotReadySeen",
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
        shared.reporter.condition(
            name,
            ConditionSpec::new(
                CONDITION,
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
            .insert(name.to_owned(), (uid.to_owned(), reason))
            .is_none_or(|said| said != (uid.to_owned(), reason));
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

    fn hold(
        &self,
        shared: &Shared,
        identity: &NodeIdentity,
        guard: &'static str,
        reason: &'static str,
        why: &str,
    ) {
        shared.metrics.fence.hold(guard);
        self.report(
            shared,
            identity.name(),
            identity.uid(),
            Report {
                reason,
                holding: false,
                warning: true,
                message: format!("Not powered off although NotReady past --fence-after: {why}"),
            },
        );
    }

    /// Looks at `identity` afresh and fences it when it is due and every guard allows it.
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
        if let Some(value) = do_not_fence(&node) {
            self.hold(
                shared,
                identity,
                "do-not-fence",
                "FenceHeldDoNotFence",
                &format!(
                    "the node carries nodegrace.io/do-not-fence={value:?}; remove the annotation \
                     to let it be fenced, or power it off and taint it yourself"
                ),
            );
            return Ok(FenceOutcome::WaitForChange);
        }
        if let Heartbeat::Recent { evidence, left } = self.heartbeat(shared, identity).await? {
            self.hold(
                shared,
                identity,
                "heartbeat",
                "FenceHeldHeartbeat",
                &evidence.explain(now),
            );
            self.held_for(identity, left);
            return Ok(FenceOutcome::Retry(left));
        }
        let managed: Vec<Arc<Node>> = self
            .nodes
            .state()
            .into_iter()
            .filter(|other| self.manages(other))
            .collect();
        if let Some(partition) = partitioned(&managed, &node, self.settings.max_fraction) {
            self.hold(
                shared,
                identity,
                "partition",
                "FenceHeldPartition",
                &format!(
                    "{partition}; so many at once is taken for a partition, not dead machines"
                ),
            );
            self.held_for(identity, RECHECK);
            return Ok(FenceOutcome::Retry(RECHECK));
        }
        let id = match identity.machine(&node) {
            Ok(id) => id,
            Err(error) => {
                let wait = self.failed(identity, PROVIDER_BACKOFF);
                self.hold(
                    shared,
                    identity,
                    "provider",
                    "FenceHeldProvider",
                    &format!("{error}; looked at again in {}", seconds(wait)),
                );
                return Ok(FenceOutcome::Retry(wait));
            }
        };
        let state = match self.provider.state(&id).await {
            Ok(InstanceState::NotFound) => {
                let wait = self.failed(identity, PROVIDER_BACKOFF);
                self.hold(
                    shared,
                    identity,
                    "not-found",
                    "FenceHeldMachineNotFound",
                    &format!(
                        "the {} provider does not know machine {id}; a machine that cannot be \
                         found cannot be confirmed off, so the node is never tainted for it \
                         (asked again in {})",
                        self.provider.name(),
                        seconds(wait)
                    ),
                );
                return Ok(FenceOutcome::Retry(wait));
            }
            Ok(state) => state,
            Err(error) => {
                let wait = self.failed(identity, PROVIDER_BACKOFF);
                self.hold(
                    shared,
                    identity,
                    "provider",
                    "FenceHeldProvider",
                    &format!(
                        "cannot ask about machine {id}: {error}; asked again in {}",
                        seconds(wait)
                    ),
                );
                return Ok(FenceOutcome::Retry(wait));
            }
        };
        let deciding = self.deciding.lock().await;
        let fenced = self.fenced_elsewhere(shared, identity).await?;
        if fenced >= self.settings.max_fenced {
            self.hold(
                shared,
                identity,
                "max-fenced",
                "FenceHeldMaxFenced",
                &format!(
                    "{fenced} other {} fenced and not yet back (label {FENCE_LABEL}), and \
                     --max-fenced is {}",
                    if fenced == 1 {
                        "machine is"
                    } else {
                        "machines are"
                    },
                    self.settings.max_fenced
                ),
            );
            self.held_for(identity, RECHECK);
            return Ok(FenceOutcome::Retry(RECHECK));
        }
        let after = self.settings.after;
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
        drop(deciding);
        if !matches!(stamped, Updated::Written(_)) {
            return Ok(FenceOutcome::NotDue);
        }
        let down_for = not_ready_since(&node)
            .map(|since| stamped_at.duration_since(since).as_secs())
            .unwrap_or_default();
        self.report(
            shared,
            identity.name(),
            identity.uid(),
            Report {
                reason: "Fencing",
                holding: true,
                warning: true,
                message: format!(
                    "NotReady for {down_for}s (--fence-after {}s), its kubelet silent, within \
                     the partition guard: powering machine {id} off through {} ({state} now)",
                    after.as_secs(),
                    self.provider.name()
                ),
            },
        );
        if !state.powered_off()
            && let Err(why) = self.power_off(&id).await
        {
            return self.fail(shared, identity, why).await;
        }
        self.confirm(shared, identity, &id, stamped_at).await
    }

    /// A fence found under way (this process restarted, or a leader changed): the request may
    /// or may not have gone. A node back meanwhile is not powered off; otherwise the request is
    /// made again (power-off is idempotent) and confirmed as usual.
    async fn resume(
        &self,
        shared: &Shared,
        identity: &NodeIdentity,
        node: &Node,
        since: Option<Timestamp>,
    ) -> Result<FenceOutcome, PassError> {
        let since = since.unwrap_or_else(Timestamp::now);
        let id = match identity.machine(node) {
            Ok(id) => id,
            Err(error) => return self.fail(shared, identity, error.to_string()).await,
        };
        let state = self.provider.state(&id).await;
        if readiness(node) == Readiness::Ready {
            if state.is_ok_and(InstanceState::powered_off) {
                return self.came_back(shared, identity, &id).await;
            }
            self.clear(shared, identity, Step::Fencing).await?;
            shared.metrics.fence.fence("cancelled");
            self.report(
                shared,
                identity.name(),
                identity.uid(),
                Report {
                    reason: "FenceCancelled",
                    holding: false,
                    warning: false,
                    message: "The node turned Ready before its machine was reported off: not \
                              powered off"
                        .to_owned(),
                },
            );
            self.succeeded(identity);
            return Ok(FenceOutcome::NotDue);
        }
        let silent = matches!(self.heartbeat(shared, identity).await?, Heartbeat::Silent);
        let mut requested = since;
        if silent && matches!(state, Ok(InstanceState::Running)) {
            if let Err(why) = self.power_off(&id).await {
                return self.fail(shared, identity, why).await;
            }
            // Sent again now: the machine gets the whole --fence-timeout from here.
            requested = Timestamp::now();
        }
        self.confirm(shared, identity, &id, requested).await
    }

    /// Asks for the power-off; the error as a fence failure says it.
    async fn power_off(&self, id: &ProviderId) -> Result<(), String> {
        self.provider
            .power(id, Power::Off)
            .await
            .map_err(|error| format!("the power-off request failed: {error}"))
    }

    /// Moves the fence on `identity`'s Node from `from` to `to` (begun `at`), decided on the
    /// version written: only while it is at `from` and the node is not Ready. Returns whether
    /// it was written.
    pub(crate) async fn advance(
        &self,
        shared: &Shared,
        identity: &NodeIdentity,
        from: Step,
        to: Step,
        at: Timestamp,
    ) -> Result<bool, PassError> {
        let written = identity
            .update(&shared.client, |current| {
                let at_step = mark(current).is_some_and(|found| found.step == from);
                if !at_step || readiness(current) == Readiness::Ready {
                    return false;
                }
                // Decided on the version written: a Node deleted since the pass's view leaves
                // with its machine, never powered on again (see `Fencer::recover`).
                if to == Step::Recovering && current.metadata.deletion_timestamp.is_some() {
                    return false;
                }
                set_mark(current, to, at);
                true
            })
            .await
            .map_err(|error| {
                PassError::update(
                    format!("mark node {} {}", identity.name(), to.as_str()),
                    error,
                )
            })?;
        Ok(matches!(written, Updated::Written(_)))
    }

    /// Polls the provider until it reports the machine off, then marks the node fenced and
    /// taints it, unless the node came back meanwhile.
    async fn confirm(
        &self,
        shared: &Shared,
        identity: &NodeIdentity,
        id: &ProviderId,
        requested: Timestamp,
    ) -> Result<FenceOutcome, PassError> {
        let deadline = requested
            .checked_add(self.settings.timeout)
            .unwrap_or(Timestamp::MAX);
        let last = loop {
            let state = self.provider.state(id).await;
            if let Ok(state) = state
                && state.powered_off()
            {
                break state;
            }
            if Timestamp::now() >= deadline {
                let said = match state {
                    Ok(state) => format!("it still reads {state}"),
                    Err(error) => format!("the last answer was an error: {error}"),
                };
                return self
                    .fail(
                        shared,
                        identity,
                        format!(
                            "machine {id} was not reported off within --fence-timeout ({}s): \
                             {said}",
                            self.settings.timeout.as_secs()
                        ),
                    )
                    .await;
            }
            tokio::time::sleep(POLL).await;
        };
        let off_at = Timestamp::now();
        let mut came_back = false;
        let taint = Taint {
            key: OUT_OF_SERVICE_TAINT.to_owned(),
            value: Some(AUTO_TAINT_VALUE.to_owned()),
            effect: EXPECTED_EFFECT.to_owned(),
            time_added: Some(Time(off_at)),
        };
        let written = identity
            .update(&shared.client, |current| {
                came_back = false;
                if mark(current).map(|mark| mark.step) != Some(Step::Fencing) {
                    return false;
                }
                if readiness(current) == Readiness::Ready {
                    came_back = true;
                    return false;
                }
                set_mark(current, Step::Fenced, off_at);
                current
                    .metadata
                    .annotations
                    .get_or_insert_with(Default::default)
                    .insert(FENCED_ANNOTATION.to_owned(), off_at.to_string());
                if taint_with_key(current, OUT_OF_SERVICE_TAINT).is_none() {
                    put_taint(current, &taint);
                }
                true
            })
            .await
            .map_err(|error| {
                PassError::update(format!("mark node {} fenced", identity.name()), error)
            })?;
        if came_back {
            return self.came_back(shared, identity, id).await;
        }
        let Updated::Written(node) = written else {
            return Ok(FenceOutcome::NotDue);
        };
        self.succeeded(identity);
        let metrics = &shared.metrics.fence;
        metrics.fence("fenced");
        metrics
            .power_off
            .observe(seconds_between(requested, off_at));
        if let Some(since) = not_ready_since(&node) {
            metrics
                .not_ready_to_fenced
                .observe(seconds_between(since, off_at));
        }
        shared.metrics.taints_added.inc();
        self.report(
            shared,
            identity.name(),
            identity.uid(),
            Report {
                reason: "Fenced",
                holding: true,
                warning: true,
                message: format!(
                    "Machine {id} confirmed off at {off_at} ({} reports it {last}); added \
                     {FENCED_ANNOTATION}={off_at}",
                    self.provider.name()
                ),
            },
        );
        // The taint's own Event, as `--auto-taint-after` and operators' tools say it.
        shared.reporter.event(EventReport::normal(
            node_reference(identity.name()),
            "OutOfServiceTaintAdded",
            "OutOfServiceTaint",
            format!(
                "Added {OUT_OF_SERVICE_TAINT}={AUTO_TAINT_VALUE}:{EXPECTED_EFFECT}: NotReady for \
                 more than {}s and fenced at {off_at}",
                self.settings.after.as_secs()
            ),
        ));
        Ok(FenceOutcome::NotDue)
    }

    /// The power-off landed after the node turned Ready again (a partition that healed during
    /// the fence): nothing is tainted, and the machine is powered on again.
    async fn came_back(
        &self,
        shared: &Shared,
        identity: &NodeIdentity,
        id: &ProviderId,
    ) -> Result<FenceOutcome, PassError> {
        shared.metrics.fence.fence("cancelled");
        self.succeeded(identity);
        let powered_on = self.provider.power(id, Power::On).await;
        self.clear(shared, identity, Step::Fencing).await?;
        let then = match powered_on {
            Ok(()) => "powering it on again".to_owned(),
            Err(error) => {
                format!("the power-on request failed ({error}): power machine {id} on yourself")
            }
        };
        self.report(
            shared,
            identity.name(),
            identity.uid(),
            Report {
                reason: "FencedAfterBack",
                holding: false,
                warning: true,
                message: format!(
                    "Machine {id} went off after the node had turned Ready again (a partition \
                     that healed during the fence): not tainted; {then}"
                ),
            },
        );
        Ok(FenceOutcome::NotDue)
    }

    async fn fail(
        &self,
        shared: &Shared,
        identity: &NodeIdentity,
        why: String,
    ) -> Result<FenceOutcome, PassError> {
        // Counted before the write that clears the step: that write wakes this node's loop,
        // which must find the backoff already in force.
        let wait = self.failed(identity, PROVIDER_BACKOFF);
        self.clear(shared, identity, Step::Fencing).await?;
        shared.metrics.fence.fence("failed");
        self.report(
            shared,
            identity.name(),
            identity.uid(),
            Report {
                reason: "FenceFailed",
                holding: false,
                warning: true,
                message: format!(
                    "{why}; tried again in {} ({} failure(s) in a row)",
                    seconds(wait),
                    self.retries().get(identity).map_or(1, Retry::failures)
                ),
            },
        );
        Ok(FenceOutcome::Retry(wait))
    }

    /// Removes the fence's step from the node if it is still `step`.
    async fn clear(
        &self,
        shared: &Shared,
        identity: &NodeIdentity,
        step: Step,
    ) -> Result<(), PassError> {
        identity
            .update(&shared.client, |current| {
                mark(current).is_some_and(|mark| mark.step == step) && clear_mark(current)
            })
            .await
            .map_err(|error| {
                PassError::update(
                    format!("clear the fence of node {}", identity.name()),
                    error,
                )
            })?;
        Ok(())
    }

    async fn heartbeat(
        &self,
        shared: &Shared,
        identity: &NodeIdentity,
    ) -> Result<Heartbeat, PassError> {
        shared
            .heartbeats
            .read(&shared.client, identity.name(), self.settings.window)
            .await
            .map_err(|error| PassError::Api {
                what: format!("read the Lease of node {}", identity.name()),
                source: error,
            })
    }

    /// Machines fenced and not yet back, other than `identity`'s, by a fresh list.
    async fn fenced_elsewhere(
        &self,
        shared: &Shared,
        identity: &NodeIdentity,
    ) -> Result<usize, PassError> {
        let nodes: Api<Node> = Api::all(shared.client.clone());
        let marked = nodes
            .list(&ListParams::default().labels(FENCE_LABEL))
            .await
            .map_err(|error| PassError::Api {
                what: format!("list the nodes labelled {FENCE_LABEL}"),
                source: error,
            })?;
        Ok(marked
            .items
            .iter()
            .filter(|node| !identity.is(node))
            .count())
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
