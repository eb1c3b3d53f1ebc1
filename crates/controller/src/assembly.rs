//! How a cluster-wide controller is put together, written once for both: the admin server and
//! its readiness, a client per concern (each under the flags' rate limit), the reporter, the
//! watches' first sync, leader election, and the order things stop in. A program's `app.rs`
//! then says only what is its own: its options, its watches, its controller.
//!
//! ```text
//! Frame::new(program, args)        registry, readiness gates, election settings
//!   .start(stop, |connected| …)    admin server up, then in a task of its own:
//!       Connected                  client, instance provider, reporter, node marks
//!       .synced(what, caches)      caches-synced gate; or the stop, first
//!       .lead(controller)          election on its own client; the reporter flushed last
//! ```

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use kube::runtime::watcher;
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

use nodegrace_core::admin::{Readiness, ReadinessGate};
use nodegrace_core::cli::{CommonArgs, KubeArgs};
use nodegrace_core::dirty::Dirty;
use nodegrace_core::k8s::client::{self, ClientError};
use nodegrace_core::k8s::node_identity::NodeObject;
use nodegrace_core::k8s::reporter::{ApiSink, Flushed, Reporter};
use nodegrace_core::k8s::watched::{WatchCounters, WatchEnded, Watched};
use nodegrace_core::program::{self, Started};
use nodegrace_core::telemetry::ProgramRegistry;

use crate::cli::{ControllerArgs, InstanceArgs, InstanceArgsError};
use crate::instances::InstanceProvider;
use crate::leader::{LeaderConfig, LeaderError, run_elected};

#[derive(Debug, thiserror::Error)]
pub enum AssemblyError {
    #[error("start the admin server")]
    Admin(#[source] std::io::Error),
    #[error("build the Kubernetes client")]
    Client(#[source] ClientError),
    #[error("invalid instance provider options")]
    Instances(#[source] InstanceArgsError),
    #[error("watch {0}")]
    Watch(&'static str, #[source] WatchEnded),
    #[error("leader election")]
    Leader(#[source] LeaderError),
}

/// A controller's own loop, run while this replica leads.
pub trait Lead: Send + Sync {
    /// Runs until `acting` is cancelled (leadership lost, or the program stopping).
    fn lead(&self, acting: CancellationToken) -> impl Future<Output = ()> + Send;
}

/// What a controller is made of before it connects: its metrics and readiness gates are
/// registered on it, so the admin server can serve them from the start.
pub struct Frame {
    program: &'static str,
    kube: KubeArgs,
    admin_listen: SocketAddr,
    instances: InstanceArgs,
    election: Option<LeaderConfig>,
    registry: ProgramRegistry,
    readiness: Readiness,
    synced: ReadinessGate,
}

impl std::fmt::Debug for Frame {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Frame")
            .field("program", &self.program)
            .finish_non_exhaustive()
    }
}

impl Frame {
    pub fn new<const ADMIN_PORT: u16>(
        program: &'static str,
        args: ControllerArgs<ADMIN_PORT>,
    ) -> Self {
        let ControllerArgs {
            common:
                CommonArgs {
                    kube,
                    log: _,
                    admin,
                },
            leader,
            instances,
        } = args;
        let readiness = Readiness::new();
        Self {
            program,
            kube,
            admin_listen: admin.admin_listen,
            instances,
            election: leader.config(program),
            synced: readiness.gate("caches-synced"),
            registry: ProgramRegistry::new(program),
            readiness,
        }
    }

    pub fn registry(&mut self) -> &mut ProgramRegistry {
        &mut self.registry
    }

    /// Another condition `/readyz` waits for, besides the caches' first sync.
    pub fn gate(&self, name: &str) -> ReadinessGate {
        self.readiness.gate(name)
    }

    /// Starts the admin server, then connects and runs `assemble` in a task of its own.
    pub async fn start<E, F, Fut>(
        self,
        stop: CancellationToken,
        assemble: F,
    ) -> Result<Started<E>, AssemblyError>
    where
        F: FnOnce(Connected) -> Fut + Send + 'static,
        Fut: Future<Output = Result<(), E>> + Send,
        E: From<AssemblyError> + Send + 'static,
    {
        let Self {
            program,
            kube,
            admin_listen,
            instances,
            election,
            registry,
            readiness,
            synced,
        } = self;
        let registry = registry.into_registry();
        // Boxed: a controller's whole state machine would otherwise sit in every caller's future.
        let work = Box::pin(async move {
            let connected =
                Connected::connect(program, kube, &instances, election, synced, stop).await?;
            assemble(connected).await
        });
        program::start(admin_listen, registry, readiness, work)
            .await
            .map_err(AssemblyError::Admin)
    }
}

/// A controller's connection to the cluster, handed to the program to build its own parts on.
pub struct Connected {
    pub client: Client,
    /// `None` for `--instance-provider=none`.
    pub provider: Option<Arc<dyn InstanceProvider>>,
    /// Events and conditions go through a client of their own (same limits), so reporting
    /// never takes a place in line from a force action or an eviction.
    pub reporter: Reporter,
    /// Names of the nodes changed since the controller last looked (see [`Self::watch_nodes`]).
    pub dirty: Arc<Dirty>,
    pub stop: CancellationToken,
    program: &'static str,
    kube: KubeArgs,
    election: Option<LeaderConfig>,
    synced: ReadinessGate,
    flushed: Flushed,
}

impl std::fmt::Debug for Connected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connected")
            .field("program", &self.program)
            .finish_non_exhaustive()
    }
}

impl Connected {
    async fn connect(
        program: &'static str,
        kube: KubeArgs,
        instances: &InstanceArgs,
        election: Option<LeaderConfig>,
        synced: ReadinessGate,
        stop: CancellationToken,
    ) -> Result<Self, AssemblyError> {
        let client = client::client(&kube, program)
            .await
            .map_err(AssemblyError::Client)?;
        let provider = instances
            .provider(&client, &kube)
            .await
            .map_err(AssemblyError::Instances)?;
        let reporting = client::client(&kube, program)
            .await
            .map_err(AssemblyError::Client)?;
        let identity = election
            .as_ref()
            .map_or(program, |config| config.identity.as_str());
        let (reporter, flushed) = Reporter::start(ApiSink::new(reporting, program, identity));
        Ok(Self {
            client,
            provider,
            reporter,
            dirty: Arc::default(),
            stop,
            program,
            kube,
            election,
            synced,
            flushed,
        })
    }

    /// Another client under the same flags, for a concern that must not wait behind the
    /// main one's rate limit.
    pub async fn client(&self) -> Result<Client, AssemblyError> {
        client::client(&self.kube, self.program)
            .await
            .map_err(AssemblyError::Client)
    }

    /// Like [`Self::client`], without kube's retry of 429/503/504 (see
    /// [`client::client_without_retries`]).
    pub async fn client_without_retries(&self) -> Result<Client, AssemblyError> {
        client::client_without_retries(&self.kube, self.program)
            .await
            .map_err(AssemblyError::Client)
    }

    /// Every node, trimmed by `trim`; each change marks the node's name in [`Self::dirty`].
    pub fn watch_nodes<K: NodeObject>(&self, trim: fn(&mut K)) -> Watched<K> {
        let dirty = Arc::clone(&self.dirty);
        Watched::start_observed(
            Api::all(self.client.clone()),
            watcher::Config::default(),
            WatchCounters::default(),
            trim,
            move |node: &K| dirty.mark(node.meta().name.as_deref().unwrap_or_default()),
        )
    }

    /// Every object of a cluster-wide kind, trimmed by `trim`.
    pub fn watch_all<K>(&self, trim: fn(&mut K)) -> Watched<K>
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
        K: Send + Sync + 'static,
    {
        Watched::start_trimmed(
            Api::all(self.client.clone()),
            watcher::Config::default(),
            WatchCounters::default(),
            trim,
        )
    }

    /// Waits for the caches' first complete listing (`what` names them for the error), then
    /// says so on `/readyz`. `false`: the program was stopped first.
    pub async fn synced(
        &self,
        what: &'static str,
        caches: impl Future<Output = Result<(), WatchEnded>>,
    ) -> Result<bool, AssemblyError> {
        tokio::select! {
            () = self.stop.cancelled() => Ok(false),
            synced = caches => {
                synced.map_err(|ended| AssemblyError::Watch(what, ended))?;
                self.synced.set(true);
                Ok(true)
            }
        }
    }

    /// Runs `controller` whenever this replica leads, until the stop; then flushes what the
    /// reporter still holds.
    pub async fn lead(self, controller: impl Lead) -> Result<(), AssemblyError> {
        self.lead_beside(controller, std::future::pending()).await
    }

    /// [`Self::lead`], with `beside` (a server every replica runs, leader or not) alongside
    /// until the stop or either's error.
    pub async fn lead_beside<E>(
        self,
        controller: impl Lead,
        beside: impl Future<Output = Result<(), E>>,
    ) -> Result<(), E>
    where
        E: From<AssemblyError>,
    {
        // The election on a client of its own: a busy controller's own rate limit must never
        // delay a renewal past the renew deadline.
        let electing = self.client().await?;
        // Boxed, as the controller's loop is the largest state a program has.
        let elected = Box::pin(run_elected(
            electing,
            self.election.as_ref(),
            &self.stop,
            |acting| controller.lead(acting),
        ));
        let result = tokio::select! {
            result = elected => result.map_err(|error| E::from(AssemblyError::Leader(error))),
            result = beside => result,
        };
        // The reporter's worker ends once every clone is gone: the controller's, then ours.
        drop(controller);
        drop(self.reporter);
        self.flushed.wait().await;
        result
    }
}
