//! The guards a fence passes before the power-off, each checked on fresh reads: the operator's
//! `do-not-fence`, the kubelet's heartbeat, the partition guard, the machine known to the
//! provider, and `--max-fenced`. A guard that holds says why on the node
//! (`FenceHeld…`) and sets when the node is looked at again.

use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::ListParams;
use nodegrace_controller::instances::{InstanceState, NodeMachine, ProviderId};
use nodegrace_core::k8s::node_identity::NodeIdentity;
use nodegrace_core::k8s::partition::partitioned;

use super::{FenceOutcome, Fencer, PROVIDER_BACKOFF, RECHECK, Report, seconds};
use crate::api::FENCE_LABEL;
use crate::conditions::Reason;
use crate::fence_mark::do_not_fence;
use crate::guard::Heartbeat;
use crate::shared::{PassError, Shared};

/// What the guards found when they all let the fence go.
#[derive(Debug)]
pub(super) struct Cleared {
    pub id: ProviderId,
    pub state: InstanceState,
}

/// A guard that holds the fence, and until when.
#[derive(Debug)]
pub(super) struct Hold {
    /// The `guard` label of the holds metric.
    guard: &'static str,
    reason: Reason,
    why: String,
    until: Until,
}

#[derive(Debug)]
enum Until {
    /// The node changes (the operator's annotation goes).
    Change,
    /// This long.
    For(Duration),
    /// The provider failed: the machine's backoff.
    Backoff,
}

impl Fencer {
    /// The guards before the lock of the decision: `Err` with the first that holds.
    pub(super) async fn guards(
        &self,
        shared: &Shared,
        identity: &NodeIdentity,
        node: &Node,
    ) -> Result<Result<Cleared, Hold>, PassError> {
        if let Some(value) = do_not_fence(node) {
            return Ok(Err(Hold {
                guard: "do-not-fence",
                reason: Reason::FenceHeldDoNotFence,
                why: format!(
                    "the node carries nodegrace.io/do-not-fence={value:?}; remove the annotation \
                     to let it be fenced, or power it off and taint it yourself"
                ),
                until: Until::Change,
            }));
        }
        if let Heartbeat::Recent { evidence, left } = self.heartbeat(shared, identity).await? {
            return Ok(Err(Hold {
                guard: "heartbeat",
                reason: Reason::FenceHeldHeartbeat,
                why: evidence.explain(Timestamp::now()),
                until: Until::For(left),
            }));
        }
        if let Some(hold) = self.partition(node) {
            return Ok(Err(hold));
        }
        Ok(self.machine(identity, node).await)
    }

    fn partition(&self, node: &Node) -> Option<Hold> {
        let managed: Vec<Arc<Node>> = self
            .nodes
            .state()
            .into_iter()
            .filter(|other| self.manages(other))
            .collect();
        let partition = partitioned(&managed, node, self.settings.max_fraction)?;
        Some(Hold {
            guard: "partition",
            reason: Reason::FenceHeldPartition,
            why: format!(
                "{partition}; so many at once is taken for a partition, not dead machines"
            ),
            until: Until::For(RECHECK),
        })
    }

    /// The machine, known to the provider: one it cannot find cannot be confirmed off.
    async fn machine(&self, identity: &NodeIdentity, node: &Node) -> Result<Cleared, Hold> {
        let failed = |reason, why: String| Hold {
            guard: if reason == Reason::FenceHeldMachineNotFound {
                "not-found"
            } else {
                "provider"
            },
            reason,
            why,
            until: Until::Backoff,
        };
        let id = identity
            .machine(node)
            .map_err(|error| failed(Reason::FenceHeldProvider, error.to_string()))?;
        match self.provider.state(&id).await {
            Ok(InstanceState::NotFound) => Err(failed(
                Reason::FenceHeldMachineNotFound,
                format!(
                    "the {} provider does not know machine {id}; a machine that cannot be found \
                     cannot be confirmed off, so the node is never tainted for it",
                    self.provider.name()
                ),
            )),
            Ok(state) => Ok(Cleared { id, state }),
            Err(error) => Err(failed(
                Reason::FenceHeldProvider,
                format!("cannot ask about machine {id}: {error}"),
            )),
        }
    }

    /// `--max-fenced`, counted by a fresh list under the decision's lock.
    pub(super) async fn max_fenced(
        &self,
        shared: &Shared,
        identity: &NodeIdentity,
    ) -> Result<Option<Hold>, PassError> {
        let fenced = self.fenced_elsewhere(shared, identity).await?;
        if fenced < self.settings.max_fenced {
            return Ok(None);
        }
        let machines = if fenced == 1 {
            "machine is"
        } else {
            "machines are"
        };
        Ok(Some(Hold {
            guard: "max-fenced",
            reason: Reason::FenceHeldMaxFenced,
            why: format!(
                "{fenced} other {machines} fenced and not yet back (label {FENCE_LABEL}), and \
                 --max-fenced is {}",
                self.settings.max_fenced
            ),
            until: Until::For(RECHECK),
        }))
    }

    /// Says the hold on the node, counts it, and sets when the node is looked at again.
    pub(super) fn hold(
        &self,
        shared: &Shared,
        identity: &NodeIdentity,
        hold: Hold,
    ) -> FenceOutcome {
        let Hold {
            guard,
            reason,
            why,
            until,
        } = hold;
        let (outcome, again) = match until {
            Until::Change => (FenceOutcome::WaitForChange, String::new()),
            Until::For(wait) => {
                self.held_for(identity, wait);
                (FenceOutcome::Retry(wait), String::new())
            }
            Until::Backoff => {
                let wait = self.failed(identity, PROVIDER_BACKOFF);
                (
                    FenceOutcome::Retry(wait),
                    format!(" (asked again in {})", seconds(wait)),
                )
            }
        };
        shared.metrics.fence.hold(guard);
        self.report(
            shared,
            identity.name(),
            identity.uid(),
            Report {
                reason,
                holding: false,
                warning: true,
                message: format!(
                    "Not powered off although NotReady past --fence-after: {why}{again}"
                ),
            },
        );
        outcome
    }

    pub(super) async fn heartbeat(
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
            .filter(|node| !identity.is(*node))
            .count())
    }
}
