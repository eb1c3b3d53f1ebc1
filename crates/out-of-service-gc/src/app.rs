//! Assembling the controller and running it until SIGTERM.

use std::sync::Arc;

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::Api;
use kube::runtime::watcher;
use nodegrace_core::admin::Readiness;
use nodegrace_core::cli::CommonArgs;
use nodegrace_core::controller::Dirty;
use nodegrace_core::k8s::client;
use nodegrace_core::k8s::reporter::{ApiSink, Reporter};
use nodegrace_core::k8s::watched::{WatchCounters, Watched};
use nodegrace_core::leader::run_elected;
use nodegrace_core::program::{self, Started};
use nodegrace_core::telemetry::ProgramRegistry;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use crate::cleanup::{Settings, Shared};
use crate::cli::Args;
use crate::controller::Controller;
use crate::guard::Heartbeats;
use crate::metrics::Metrics;
use crate::qualify::TaintClock;
use crate::tainting::AutoTaint;

pub const PROGRAM: &str = "out-of-service-gc";

/// Runs the controller until `stop` is cancelled.
pub async fn run(args: Args, stop: CancellationToken) -> Result<()> {
    start(args, stop).await?.wait().await
}

fn trim_node(node: &mut Node) {
    node.metadata.managed_fields = None;
    node.metadata.labels = None;
    if let Some(status) = node.status.as_mut() {
        status.images = None;
        status.volumes_in_use = None;
        status.volumes_attached = None;
        status.node_info = None;
        status.addresses = None;
    }
}

fn trim_attachment(attachment: &mut VolumeAttachment) {
    attachment.metadata.managed_fields = None;
    attachment.status = None;
}

/// Starts the admin server, then the controller in a task of its own.
pub async fn start(args: Args, stop: CancellationToken) -> Result<Started<anyhow::Error>> {
    // Every option is used here: a new flag that nothing reads does not compile.
    let Args {
        common: CommonArgs {
            kube,
            log: _,
            admin,
        },
        leader,
        instances,
        liveness_guard,
        liveness_guard_window,
        auto_untaint,
        auto_taint_after,
    } = args;
    let election = leader.config(PROGRAM);
    let mut registry = ProgramRegistry::new(PROGRAM);
    let metrics = Metrics::register(&mut registry);
    let registry = registry.into_registry();
    let readiness = Readiness::new();
    let synced = readiness.gate("caches-synced");
    let started = program::start(admin.admin_listen, registry, readiness, async move {
        let client = client::client(&kube, PROGRAM)
            .await
            .context("build the Kubernetes client")?;
        let provider = instances
            .provider(&client)
            .context("invalid instance provider options")?;
        // Events and conditions go through a client of their own (same limits), so reporting
        // never takes a place in line from a force action.
        let reporting = client::client(&kube, PROGRAM)
            .await
            .context("build the Kubernetes client")?;
        let identity = election
            .as_ref()
            .map_or_else(|| PROGRAM.to_owned(), |config| config.identity.clone());
        let (reporter, flushed) = Reporter::start(ApiSink::new(reporting, PROGRAM, &identity));
        let dirty = Arc::new(Dirty::default());
        let nodes = {
            let dirty = Arc::clone(&dirty);
            Watched::start_observed(
                Api::<Node>::all(client.clone()),
                watcher::Config::default(),
                WatchCounters::default(),
                trim_node,
                move |node: &Node| dirty.mark(node.metadata.name.as_deref().unwrap_or_default()),
            )
        };
        let attachments = {
            let dirty = Arc::clone(&dirty);
            Watched::start_observed(
                Api::<VolumeAttachment>::all(client.clone()),
                watcher::Config::default(),
                WatchCounters::default(),
                trim_attachment,
                move |attachment: &VolumeAttachment| dirty.mark(&attachment.spec.node_name),
            )
        };
        let heartbeats = Arc::new(Heartbeats::new(tokio::time::Instant::now()));
        // Watched from the start, leader or not: a new leader must already know which kubelets
        // were heard from lately, or it would have to wait a whole window before any cleanup.
        let heartbeat_watch = liveness_guard.then(|| heartbeats.watch(client.clone()));
        let _stop_watching = heartbeat_watch.map(AbortOnDropHandle::new);
        tokio::select! {
            () = stop.cancelled() => return Ok(()),
            synced = async { nodes.synced().await?; attachments.synced().await } => {
                synced.context("watch nodes and VolumeAttachments")?;
            }
        }
        synced.set(true);
        let controller = Controller {
            shared: Arc::new(Shared {
                client: client.clone(),
                reporter,
                metrics,
                settings: Settings {
                    liveness_guard,
                    guard_window: liveness_guard_window,
                    auto_untaint,
                },
                attachments,
                heartbeats,
                taint_clock: TaintClock::default(),
            }),
            nodes,
            dirty,
            auto_taint: auto_taint_after.map(|after| AutoTaint { after, provider }),
        };
        if !liveness_guard {
            tracing::warn!("the liveness guard is off (--liveness-guard=false)");
        }
        // The election on a client of its own: a busy controller's own rate limit must
        // never delay a renewal past the renew deadline.
        let electing = client::client(&kube, PROGRAM)
            .await
            .context("build the Kubernetes client")?;
        let result = run_elected(electing, election.as_ref(), &stop, |acting| {
            controller.run(acting)
        })
        .await
        .context("leader election");
        drop(controller);
        flushed.wait().await;
        result
    });
    started.await.context("start the admin server")
}
