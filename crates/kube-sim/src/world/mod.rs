//! The simulated world around the API server: kubelets, and the control-plane controllers our
//! components interact with. Each runs in-process on the store (writes skip admission) and
//! can be switched off. Annotations under `sim.nodegrace.io/` steer it (see README.md).

mod kubelet;

use std::time::Duration;

use axum::Router;
use tokio_util::sync::CancellationToken;

use crate::store::Store;

/// Node annotation: `stopped` makes the node's kubelet stop (no lease renewal, no pod changes).
pub const KUBELET_ANNOTATION: &str = "sim.nodegrace.io/kubelet";
/// Pod annotation: seconds its containers take to exit after SIGTERM (default 0).
pub const STOP_SECONDS_ANNOTATION: &str = "sim.nodegrace.io/stop-seconds";
/// Pod annotation: seconds from Running to Ready (default 0).
pub const READY_AFTER_ANNOTATION: &str = "sim.nodegrace.io/ready-after-seconds";

/// Which simulated controllers run, and their timings.
#[derive(Debug, Clone)]
pub struct WorldOptions {
    pub kubelet: bool,
    /// How often a running kubelet renews its node's Lease in kube-node-lease.
    pub lease_renew_interval: Duration,
}

impl Default for WorldOptions {
    fn default() -> Self {
        Self {
            kubelet: true,
            lease_renew_interval: Duration::from_secs(10),
        }
    }
}

impl WorldOptions {
    /// Nothing simulated: a bare API server.
    pub fn none() -> Self {
        Self {
            kubelet: false,
            ..Self::default()
        }
    }
}

/// The running controllers.
#[derive(Debug, Clone)]
pub struct World {
    store: Store,
}

impl World {
    pub fn start(store: Store, options: &WorldOptions, stop: &CancellationToken) -> Self {
        if options.kubelet {
            tokio::spawn(kubelet::run(store.clone(), options.clone(), stop.clone()));
        }
        Self { store }
    }

    /// The world's `/sim/v1` endpoints.
    pub fn control_router<S: Clone + Send + Sync + 'static>(&self) -> Router<S> {
        let _ = &self.store;
        Router::new()
    }
}
