//! `--recover-after-cleanup`: a machine this controller fenced is powered on again once its
//! node is clean, and its node's return ends the fence; a machine that does not come back in
//! `--recover-timeout` is powered off again and left off for a person.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use nodegrace_controller::instances::{NodeMachine, Power, ProviderId};
use nodegrace_core::k8s::node_identity::NodeIdentity;
use nodegrace_core::k8s::nodes::{Readiness, readiness};

use super::{Fencer, POLL, PROVIDER_BACKOFF, Report, seconds, seconds_between};
use crate::api::FENCE_LABEL;
use crate::conditions::Reason;
use crate::fence_mark::{Mark, Step, mark};
use crate::shared::{PassError, Shared};

impl Fencer {
    /// `--recover-after-cleanup`, called by the cleanup of a fenced node once nothing that
    /// must go is left: powers the machine on, and after `--recover-timeout` without the node
    /// Ready, off again for good. Returns when to look again.
    pub async fn recover(
        &self,
        shared: &Shared,
        identity: &NodeIdentity,
        node: &Node,
    ) -> Result<Option<Duration>, PassError> {
        let Some(found) = mark(node) else {
            return Ok(None);
        };
        if !self.settings.recover || readiness(node) == Readiness::Ready {
            return Ok(None);
        }
        let Ok(id) = identity.machine(node) else {
            return Ok(None);
        };
        // A failed power change is waited out whatever woke the cleanup (our own write too).
        if let Some(wait) = self.retry_wait(identity) {
            return Ok(Some(wait));
        }
        if node.metadata.deletion_timestamp.is_some() {
            // The machine leaves with its Node: whoever holds the Node's finalizer
            // (termination-controller) terminates it, and on bare metal that termination is a
            // power-off this power-on would undo.
            if found.step == Step::Fenced {
                self.left_off_for_deletion(shared, identity, &id);
            }
            return Ok(None);
        }
        match found.step {
            Step::Fenced => self.power_on(shared, identity, &id).await,
            Step::Recovering => {
                let since = found.since.unwrap_or_else(Timestamp::now);
                let deadline = since
                    .checked_add(self.settings.recover_timeout)
                    .unwrap_or(Timestamp::MAX);
                let now = Timestamp::now();
                if now < deadline {
                    return Ok(Some(
                        Duration::try_from(deadline.duration_since(now)).unwrap_or(POLL),
                    ));
                }
                self.give_up(shared, identity, &id).await
            }
            Step::Fencing | Step::RecoveryFailed => Ok(None),
        }
    }

    async fn power_on(
        &self,
        shared: &Shared,
        identity: &NodeIdentity,
        id: &ProviderId,
    ) -> Result<Option<Duration>, PassError> {
        let at = Timestamp::now();
        if !self
            .advance(shared, identity, Step::Fenced, Step::Recovering, at)
            .await?
        {
            return Ok(Some(Duration::ZERO));
        }
        if let Err(error) = self.provider.power(id, Power::On).await {
            // Counted before the write back to Fenced, which wakes the cleanup.
            let wait = self.failed(identity, PROVIDER_BACKOFF);
            self.advance(shared, identity, Step::Recovering, Step::Fenced, at)
                .await?;
            self.report(
                shared,
                identity.name(),
                identity.uid(),
                Report {
                    reason: Reason::PowerOnFailed,
                    holding: true,
                    warning: true,
                    message: format!(
                        "The node is clean, but powering machine {id} on failed: {error}; tried \
                         again in {}",
                        seconds(wait)
                    ),
                },
            );
            return Ok(Some(wait));
        }
        self.succeeded(identity);
        self.report(
            shared,
            identity.name(),
            identity.uid(),
            Report {
                reason: Reason::PoweringOn,
                holding: true,
                warning: false,
                message: format!(
                    "The node is clean: machine {id} powered on at {at}; the taint goes when the \
                     node is Ready, or the machine goes off again if it is not Ready within \
                     --recover-timeout ({}s)",
                    self.settings.recover_timeout.as_secs()
                ),
            },
        );
        Ok(Some(self.settings.recover_timeout))
    }

    fn left_off_for_deletion(&self, shared: &Shared, identity: &NodeIdentity, id: &ProviderId) {
        self.report(
            shared,
            identity.name(),
            identity.uid(),
            Report {
                reason: Reason::LeftOffForDeletion,
                holding: true,
                warning: false,
                message: format!(
                    "The node is clean, but it is being deleted: machine {id} is not powered on \
                     again; it goes with the node"
                ),
            },
        );
    }

    async fn give_up(
        &self,
        shared: &Shared,
        identity: &NodeIdentity,
        id: &ProviderId,
    ) -> Result<Option<Duration>, PassError> {
        // Off before it is written off: a machine that boots late must not run beside the
        // workload that moved away from it.
        if let Err(error) = self.provider.power(id, Power::Off).await {
            let wait = self.failed(identity, PROVIDER_BACKOFF);
            self.report(
                shared,
                identity.name(),
                identity.uid(),
                Report {
                    reason: Reason::RecoveryFailed,
                    holding: true,
                    warning: true,
                    message: format!(
                        "Not Ready within --recover-timeout, and powering machine {id} off again \
                         failed: {error}; tried again in {}",
                        seconds(wait)
                    ),
                },
            );
            return Ok(Some(wait));
        }
        self.succeeded(identity);
        if !self
            .advance(
                shared,
                identity,
                Step::Recovering,
                Step::RecoveryFailed,
                Timestamp::now(),
            )
            .await?
        {
            return Ok(Some(Duration::ZERO));
        }
        shared.metrics.fence.recovery("failed");
        self.report(
            shared,
            identity.name(),
            identity.uid(),
            Report {
                reason: Reason::RecoveryFailed,
                holding: true,
                warning: true,
                message: format!(
                    "Not Ready within --recover-timeout ({}s) of the power-on: machine {id} is \
                     powered off again and left off. Repair it, then remove the label \
                     {FENCE_LABEL} (it counts against --max-fenced until then)",
                    self.settings.recover_timeout.as_secs()
                ),
            },
        );
        Ok(None)
    }

    /// The node is Ready and its taint went (`--auto-untaint`): a recovery ends here.
    pub fn recovered(&self, shared: &Shared, identity: &NodeIdentity, found: Mark) {
        if found.step != Step::Recovering {
            return;
        }
        self.succeeded(identity);
        shared.metrics.fence.recovery("recovered");
        let took = found
            .since
            .map(|since| seconds_between(since, Timestamp::now()));
        if let Some(took) = took {
            shared.metrics.fence.recovery.observe(took);
        }
        self.report(
            shared,
            identity.name(),
            identity.uid(),
            Report {
                reason: Reason::Recovered,
                holding: false,
                warning: false,
                message: format!(
                    "Back: Ready {}after the power-on; the out-of-service taint and the fence \
                     are removed",
                    took.map(|took| format!("{took:.1}s ")).unwrap_or_default()
                ),
            },
        );
    }
}
