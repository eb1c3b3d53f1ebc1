//! What every node's termination shares: clients, caches, limits, reporting.

use std::collections::HashMap;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use governor::DefaultDirectRateLimiter;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use nodegrace_core::backoff::Backoff;
use nodegrace_core::instances::InstanceProvider;
use nodegrace_core::k8s::reporter::Reporter;
use nodegrace_core::k8s::selectors::selects_node;
use nodegrace_core::k8s::watched::Watched;

use crate::api::NodeDrainRule;
use crate::drain_rules::{Applied, NodeRules};
use crate::grants::{Budgets, Verdict};
use crate::metrics::Metrics;
use crate::turns::Turns;

#[derive(Debug, Clone)]
pub struct Settings {
    pub node_selector: LabelSelector,
    pub eviction_concurrency: usize,
    pub eviction_backoff: Backoff,
    pub drain_timeout: Option<Duration>,
    pub hook_timeout: Option<Duration>,
    pub volume_detach_timeout: Duration,
    pub not_ready_timeout: Option<Duration>,
    pub stuck_terminating_after: Duration,
    pub not_ready_max_fraction: f64,
    pub instance_not_found_confirm: Duration,
}

impl Settings {
    /// Whether the controller manages `node` (adds its finalizer).
    pub fn manages(&self, node: &Node) -> bool {
        selects_node(&self.node_selector, node)
    }
}

pub struct Shared {
    pub client: kube::Client,
    /// Evictions only: kube's own 429 retry is off, a refusal is the queue's business.
    pub evictions: kube::Client,
    pub eviction_limiter: Arc<DefaultDirectRateLimiter>,
    pub reporter: Reporter,
    pub metrics: Metrics,
    pub settings: Settings,
    pub budgets: Budgets,
    pub pdbs: Watched<PodDisruptionBudget>,
    pub drain_rules: Watched<NodeDrainRule>,
    /// Namespaces' labels, for the drain rules' namespace selectors.
    pub namespaces: Watched<Namespace>,
    pub attachments: Watched<VolumeAttachment>,
    pub provider: Option<Arc<dyn InstanceProvider>>,
    /// Why each node waiting for its budgets waits (by UID), from the leader's last
    /// allocation pass.
    pub waiting: RwLock<Arc<HashMap<String, Verdict>>>,
    /// The waiting nodes' own wake-ups.
    pub turns: Turns,
}

impl Shared {
    pub fn nodes(&self) -> &Watched<Node> {
        &self.budgets.nodes
    }

    /// The drain rule `pod` follows among the node's `rules`.
    pub fn drain_rule(&self, rules: &NodeRules, pod: &Pod) -> Applied {
        let namespace = self
            .namespaces
            .get(None, pod.metadata.namespace.as_deref().unwrap_or_default());
        let labels = namespace
            .as_ref()
            .and_then(|namespace| namespace.metadata.labels.as_ref())
            .unwrap_or(&crate::drain_rules::NO_LABELS);
        rules.applied(pod, labels)
    }

    /// Records the pass's verdicts and wakes the nodes whose wait they changed (granted, or
    /// waiting on something new; not a budget's numbers moving).
    pub fn set_waiting(&self, waiting: HashMap<String, Verdict>) {
        let new = Arc::new(waiting);
        let old = std::mem::replace(
            &mut *self.waiting.write().unwrap_or_else(PoisonError::into_inner),
            Arc::clone(&new),
        );
        for (uid, verdict) in new.iter() {
            if old.get(uid).is_none_or(|before| !before.same_wait(verdict)) {
                self.turns.wake(uid);
            }
        }
        for uid in old.keys().filter(|uid| !new.contains_key(*uid)) {
            self.turns.wake(uid);
        }
    }

    /// Why the node with `uid` waits, if the last allocation pass saw it waiting.
    pub fn waiting_on(&self, uid: &str) -> Option<Verdict> {
        self.waiting
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(uid)
            .cloned()
    }
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}
