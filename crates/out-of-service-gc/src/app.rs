//! Assembling the controller and running it until SIGTERM.

use std::sync::Arc;

use anyhow::{Result, bail};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::Api;
use kube::runtime::watcher;
use nodegrace_core::assembly::Frame;
use nodegrace_core::cli::InstanceProviderKind;
use nodegrace_core::instances::Metered;
use nodegrace_core::k8s::watched::{WatchCounters, Watched};
use nodegrace_core::k8s::{nodes, volumes};
use nodegrace_core::program::Started;
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

/// Labels too: this controller selects no node by them.
fn trim_node(node: &mut Node) {
    nodes::trim_for_cache(node);
    node.metadata.labels = None;
}

/// Starts the admin server, then the controller in a task of its own.
pub async fn start(args: Args, stop: CancellationToken) -> Result<Started<anyhow::Error>> {
    // Every option is used here: a new flag that nothing reads does not compile.
    let Args {
        controller,
        liveness_guard,
        liveness_guard_window,
        auto_untaint,
        auto_taint_after,
    } = args;
    if controller.instances.instance_provider == InstanceProviderKind::ClusterApi {
        bail!(
            "--instance-provider=cluster-api cannot confirm that a machine is off: a Cluster API \
             Machine has no power state. Use aws, redfish, exec or sim, or none with the \
             nodegrace.io/fenced annotation"
        );
    }
    let mut frame = Frame::new(PROGRAM, controller);
    let metrics = Metrics::register(frame.registry());
    let provider_metrics = metrics.provider.clone();
    let started = frame.start(stop, move |cluster| async move {
        let nodes = cluster.watch_nodes(trim_node);
        let attachments = {
            let dirty = Arc::clone(&cluster.dirty);
            Watched::start_observed(
                Api::<VolumeAttachment>::all(cluster.client.clone()),
                watcher::Config::default(),
                WatchCounters::default(),
                volumes::trim_for_cache,
                move |attachment: &VolumeAttachment| dirty.mark(&attachment.spec.node_name),
            )
        };
        let heartbeats = Arc::new(Heartbeats::new(tokio::time::Instant::now()));
        // Watched from the start, leader or not: a new leader must already know which kubelets
        // were heard from lately, or it would have to wait a whole window before any cleanup.
        let heartbeat_watch = liveness_guard.then(|| heartbeats.watch(cluster.client.clone()));
        let _stop_watching = heartbeat_watch.map(AbortOnDropHandle::new);
        let caches = async {
            nodes.synced().await?;
            attachments.synced().await
        };
        if !cluster
            .synced("nodes and VolumeAttachments", caches)
            .await?
        {
            return Ok(());
        }
        if !liveness_guard {
            tracing::warn!("the liveness guard is off (--liveness-guard=false)");
        }
        let controller = Controller {
            shared: Arc::new(Shared {
                client: cluster.client.clone(),
                reporter: cluster.reporter.clone(),
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
            dirty: Arc::clone(&cluster.dirty),
            auto_taint: auto_taint_after.map(|after| AutoTaint {
                after,
                provider: cluster
                    .provider
                    .clone()
                    .map(|provider| Metered::wrap(provider, provider_metrics.clone())),
            }),
        };
        Ok(cluster.lead(controller).await?)
    });
    Ok(started.await?)
}
