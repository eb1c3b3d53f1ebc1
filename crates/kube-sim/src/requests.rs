//! Every request the API was sent, counted by client, verb, resource and subresource: what a
//! real API server's `apiserver_request_total` counts, with the client (the User-Agent's
//! product, as `kubectl`'s audit log would show it) added so a benchmark can bill a
//! controller for its own requests and not for the test's.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

/// One kind of request: who sent it and what it asked.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RequestKind {
    /// The User-Agent's product (`nodegrace-termination-controller`), empty without one.
    pub agent: String,
    /// get, list, watch, create, update, patch, delete, deletecollection.
    pub verb: &'static str,
    /// The plural (`nodes`), empty for discovery and the simulator's own endpoints.
    pub resource: String,
    /// `status`, `eviction`, … or empty.
    pub subresource: String,
}

/// Shared by the server and the tests that read it. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct Requests {
    counts: Arc<Mutex<BTreeMap<RequestKind, u64>>>,
}

impl Requests {
    pub(crate) fn count(&self, kind: RequestKind) {
        *self
            .counts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(kind)
            .or_default() += 1;
    }

    /// The counts of requests from clients whose User-Agent's product is `agent`.
    pub fn of(&self, agent: &str) -> BTreeMap<RequestKind, u64> {
        self.counts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter(|(kind, _)| kind.agent == agent)
            .map(|(kind, count)| (kind.clone(), *count))
            .collect()
    }

    /// Forgets every count: a benchmark starts its measure here.
    pub fn reset(&self) {
        self.counts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }
}

/// The product of a User-Agent header: `kubectl/v1.33.0 (linux/amd64)` → `kubectl`.
pub(crate) fn agent_of(user_agent: Option<&str>) -> String {
    user_agent
        .and_then(|agent| agent.split(['/', ' ']).next())
        .unwrap_or_default()
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_agent_is_the_product_before_its_version() {
        assert_eq!(agent_of(Some("kubectl/v1.33.0 (linux/amd64)")), "kubectl");
        assert_eq!(
            agent_of(Some("nodegrace-termination-controller")),
            "nodegrace-termination-controller"
        );
        assert_eq!(agent_of(None), "");
    }
}
