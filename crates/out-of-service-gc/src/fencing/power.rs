//! The power-off of a fence and what follows it: the request, its confirmation by the
//! provider's word (then the node is marked fenced and tainted in one write), a node that came
//! back meanwhile (no taint, powered on again), a fence found under way after a restart, and a
//! failure (the step cleared, tried again on the machine's backoff).

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use nodegrace_controller::instances::{InstanceState, NodeMachine, Power, ProviderId};
use nodegrace_core::k8s::events::EventReport;
use nodegrace_core::k8s::node_identity::{NodeIdentity, Updated};
use nodegrace_core::k8s::nodes::{Readiness, node_reference, readiness, taint_with_key};
use nodegrace_core::k8s::taints::put_taint;

use super::{FenceOutcome, Fencer, POLL, PROVIDER_BACKOFF, Report, seconds, seconds_between};
use crate::api::{
    AUTO_TAINT_VALUE, EXPECTED_EFFECT, FENCED_ANNOTATION, OUT_OF_SERVICE_TAINT, auto_taint,
};
use crate::conditions::Reason;
use crate::fence_mark::{Step, clear_mark, mark, set_mark};
use crate::guard::Heartbeat;
use crate::qualify::not_ready_since;
use crate::shared::{PassError, Shared};

/// What the write of the `fenced` step found.
enum Marked {
    Fenced(Box<Node>),
    /// The node turned Ready again: nothing written.
    CameBack,
    /// No fence under way any more: nothing written.
    NotFencing,
}

impl Fencer {
    /// A fence found under way (this process restarted, or a leader changed): the request may
    /// or may not have gone. A node back meanwhile is not powered off; otherwise the request is
    /// made again (power-off is idempotent) and confirmed as usual.
    pub(super) async fn resume(
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
                    reason: Reason::FenceCancelled,
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
    pub(super) async fn power_off(&self, id: &ProviderId) -> Result<(), String> {
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
            .update(&shared.client, |current: &mut Node| {
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
    pub(super) async fn confirm(
        &self,
        shared: &Shared,
        identity: &NodeIdentity,
        id: &ProviderId,
        requested: Timestamp,
    ) -> Result<FenceOutcome, PassError> {
        let last = match self.await_off(id, requested).await {
            Ok(state) => state,
            Err(why) => return self.fail(shared, identity, why).await,
        };
        let off_at = Timestamp::now();
        match self.mark_fenced(shared, identity, off_at).await? {
            Marked::CameBack => self.came_back(shared, identity, id).await,
            Marked::NotFencing => Ok(FenceOutcome::NotDue),
            Marked::Fenced(node) => {
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
                self.say_fenced(shared, identity, id, last, off_at);
                Ok(FenceOutcome::NotDue)
            }
        }
    }

    /// The provider's states until one is off; past `--fence-timeout` from `requested`, why
    /// the fence failed.
    async fn await_off(
        &self,
        id: &ProviderId,
        requested: Timestamp,
    ) -> Result<InstanceState, String> {
        let deadline = requested
            .checked_add(self.settings.timeout)
            .unwrap_or(Timestamp::MAX);
        loop {
            let state = self.provider.state(id).await;
            if let Ok(state) = state
                && state.powered_off()
            {
                return Ok(state);
            }
            if Timestamp::now() >= deadline {
                let said = match state {
                    Ok(state) => format!("it still reads {state}"),
                    Err(error) => format!("the last answer was an error: {error}"),
                };
                return Err(format!(
                    "machine {id} was not reported off within --fence-timeout ({}s): {said}",
                    self.settings.timeout.as_secs()
                ));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// The `fenced` step, the fence annotation and the taint in one write, decided on the
    /// version written: still at `fencing`, and not Ready (a node back is not tainted).
    async fn mark_fenced(
        &self,
        shared: &Shared,
        identity: &NodeIdentity,
        off_at: Timestamp,
    ) -> Result<Marked, PassError> {
        let mut came_back = false;
        let taint = auto_taint(off_at);
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
        Ok(match written {
            _ if came_back => Marked::CameBack,
            Updated::Written(node) => Marked::Fenced(node),
            _ => Marked::NotFencing,
        })
    }

    fn say_fenced(
        &self,
        shared: &Shared,
        identity: &NodeIdentity,
        id: &ProviderId,
        last: InstanceState,
        off_at: Timestamp,
    ) {
        self.report(
            shared,
            identity.name(),
            identity.uid(),
            Report {
                reason: Reason::Fenced,
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
            Reason::OutOfServiceTaintAdded.as_str(),
            "OutOfServiceTaint",
            format!(
                "Added {OUT_OF_SERVICE_TAINT}={AUTO_TAINT_VALUE}:{EXPECTED_EFFECT}: NotReady for \
                 more than {}s and fenced at {off_at}",
                self.settings.after.as_secs()
            ),
        ));
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
                reason: Reason::FencedAfterBack,
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

    pub(super) async fn fail(
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
                reason: Reason::FenceFailed,
                holding: false,
                warning: true,
                message: format!(
                    "{why}; tried again in {} ({} failure(s) in a row)",
                    seconds(wait),
                    self.failures(identity)
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
}
