//! What every node's termination shares: clients, caches, limits, reporting.

use std::sync::Arc;
use std::time::Duration;

use governor::DefaultDirectRateLimiter;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use nodegrace_controller::instances::InstanceProvider;
use nodegrace_core::backoff::Backoff;
use nodegrace_core::k8s::cached_node::CachedNode;
use nodegrace_core::k8s::reporter::Reporter;
use nodegrace_core::k8s::selectors::selects_node;
use nodegrace_core::k8s::watched::Watched;

use crate::api::NodeDrainRule;
use crate::drain_rules::{Applied, NodeRules};
use crate::grants::Budgets;
use crate::metrics::Metrics;
use crate::turns::Turns;
use nodegrace_core::dirty::Dirty;

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
    /// `--terminate-resend-after`.
    pub terminate_resend_after: Duration,
    /// `--eviction-api`, resolved when leading begins.
    pub eviction_api: crate::cli::EvictionApi,
}

impl Settings {
    /// Whether the controller manages `node` (adds its finalizer).
    pub fn manages(&self, node: &CachedNode) -> bool {
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
    /// Every node, as watched. The budgets are handed the same cache.
    pub nodes: Watched<CachedNode>,
    pub budgets: Budgets,
    pub pdbs: Watched<PodDisruptionBudget>,
    pub drain_rules: Watched<NodeDrainRule>,
    /// Namespaces' labels, for the drain rules' namespace selectors.
    pub namespaces: Watched<Namespace>,
    pub attachments: Watched<VolumeAttachment>,
    pub provider: Option<Arc<dyn InstanceProvider>>,
    /// The termination tasks' own wake-ups.
    pub turns: Turns,
    /// Nodes (by UID) whose wait the granting pass judged anew, for the leader's waiting room
    /// ([`crate::waiting_room`]) to tell.
    pub rejudged: Dirty,
    /// With the EvictionRequest API in use: our requests and their Evictions.
    pub handover: Option<crate::handover::Handover>,
}

impl Shared {
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
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}
