//! What every part of the controller shares: the clients, the settings, the caches and
//! clocks of all nodes, and the error a pass or an attempt ends with.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::Client;
use nodegrace_core::k8s::api_errors::status_code;
use nodegrace_core::k8s::node_identity::UpdateError;
use nodegrace_core::k8s::reporter::Reporter;
use nodegrace_core::k8s::watched::Watched;

use crate::guard::Heartbeats;
use crate::metrics::Metrics;
use crate::qualify::TaintClock;

/// What every node's cleanup shares.
pub struct Shared {
    pub client: Client,
    pub reporter: Reporter,
    pub metrics: Metrics,
    pub settings: Settings,
    pub attachments: Watched<VolumeAttachment>,
    /// The nodes' heartbeats as this process saw them (fed by a Lease watch when the guard is
    /// on, and by the fresh read before each force action).
    pub heartbeats: Arc<Heartbeats>,
    pub taint_clock: TaintClock,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Clone, Copy)]
pub struct Settings {
    pub liveness_guard: bool,
    pub guard_window: Option<Duration>,
    pub auto_untaint: bool,
    /// `--clean-node-recheck`.
    pub clean_node_recheck: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum PassError {
    #[error("{what}: {source}")]
    Api {
        what: String,
        #[source]
        source: kube::Error,
    },
    /// Some force actions of the pass failed, others landed: worth retrying soon, not after a
    /// backoff that grew while the node was being worked through.
    #[error("{0} (other actions of the pass succeeded)")]
    Partial(Box<PassError>),
    #[error("{what}: {source}")]
    Contended {
        what: String,
        #[source]
        source: UpdateError,
    },
}

impl PassError {
    pub fn api(what: impl Into<String>, source: kube::Error) -> Self {
        Self::Api {
            what: what.into(),
            source,
        }
    }

    /// A write through [`NodeIdentity::update`] that failed.
    pub fn update(what: impl Into<String>, error: UpdateError) -> Self {
        match error {
            UpdateError::Api(source) => Self::api(what, source),
            contended @ UpdateError::Contended(_) => Self::Contended {
                what: what.into(),
                source: contended,
            },
        }
    }

    pub fn kind(&self) -> &'static str {
        let source = match self {
            Self::Api { source, .. } => source,
            Self::Partial(inner) => return inner.kind(),
            Self::Contended { .. } => return "conflict",
        };
        match status_code(source) {
            Some(403) => "forbidden",
            Some(429) => "throttled",
            Some(500..) => "server",
            Some(_) => "api",
            None => "unreachable",
        }
    }
}
