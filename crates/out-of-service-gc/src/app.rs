//! Assembling the controller and running it until SIGTERM.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Result, bail};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::Api;
use kube::runtime::watcher;
use nodegrace_controller::InstanceProviderKind;
use nodegrace_controller::assembly::Frame;
use nodegrace_controller::instances::{InstanceProvider, Metered, ProviderMetrics};
use nodegrace_core::dirty::Dirty;
use nodegrace_core::k8s::watched::{WatchCounters, Watched};
use nodegrace_core::k8s::{nodes, volumes};
use nodegrace_core::program::Started;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use crate::cli::{Args, FencingArgs};
use crate::controller::Controller;
use crate::fencing::{FenceSettings, Fencer};
use crate::guard::Heartbeats;
use crate::metrics::Metrics;
use crate::qualify::TaintClock;
use crate::shared::{Settings, Shared};
use crate::tainting::AutoTaint;

pub const PROGRAM: &str = "out-of-service-gc";

/// Runs the controller until `stop` is cancelled.
pub async fn run(args: Args, stop: CancellationToken) -> Result<()> {
    start(args, stop).await?.wait().await
}

/// Labels too: without `--fence-after` this controller selects no node by them.
fn trim_node(node: &mut Node) {
    nodes::trim_for_cache(node);
    node.metadata.labels = None;
}

/// With `--fence-after`, labels stay: the fence node selector and the zone read them.
fn trim_node_keeping_labels(node: &mut Node) {
    nodes::trim_for_cache(node);
}

/// What `--fence-after` and `--recover-after-cleanup` need, checked before anything starts.
fn check_fencing(
    fencing: &FencingArgs,
    provider: InstanceProviderKind,
    auto_untaint: bool,
) -> Result<()> {
    let Some(after) = fencing.fence_after else {
        if fencing.recover_after_cleanup {
            bail!(
                "--recover-after-cleanup powers on machines that --fence-after powered off; set \
                 --fence-after too"
            );
        }
        return Ok(());
    };
    if after < Duration::from_secs(1) {
        bail!(
            "--fence-after must be at least 1s (the fence's time must fall in a later second \
             than the node's turn to NotReady), got {after:?}"
        );
    }
    let why = match provider {
        InstanceProviderKind::None => Some(
            "there is no --instance-provider to power machines off with; set aws, redfish or sim",
        ),
        InstanceProviderKind::Exec => Some(
            "--instance-provider=exec has verbs for state and terminate only, no power-off; use \
             aws, redfish or sim, or fence with your own agent and its nodegrace.io/fenced \
             annotation (--auto-taint-after)",
        ),
        InstanceProviderKind::ClusterApi => Some(
            "--instance-provider=cluster-api has no power control (a Machine has no power state)",
        ),
        InstanceProviderKind::Sim | InstanceProviderKind::Aws | InstanceProviderKind::Redfish => {
            None
        }
    };
    if let Some(why) = why {
        bail!("--fence-after cannot fence: {why}");
    }
    if !(0.0..=1.0).contains(&fencing.not_ready_max_fraction) {
        bail!(
            "--not-ready-max-fraction must be a fraction from 0 to 1 (0.2 = 20 % of the nodes \
             --fence-node-selector selects), got {}",
            fencing.not_ready_max_fraction
        );
    }
    if fencing.max_fenced == 0 {
        bail!("--max-fenced 0 would never fence; unset --fence-after to turn fencing off");
    }
    if fencing.recover_after_cleanup && !auto_untaint {
        bail!(
            "--recover-after-cleanup needs --auto-untaint=true: a machine powered on again \
             comes back only once the taint goes"
        );
    }
    Ok(())
}

/// With `--fence-after` and a provider that can power machines off, the fencing agent.
fn fencer(
    fencing: &FencingArgs,
    window: Option<Duration>,
    provider: Option<&Arc<dyn InstanceProvider>>,
    metrics: &ProviderMetrics,
    nodes: &Watched<Node>,
) -> Result<Option<Arc<Fencer>>> {
    let (Some(after), Some(provider)) = (fencing.fence_after, provider) else {
        return Ok(None);
    };
    if let Some(why) = provider.power_unsupported() {
        bail!(
            "--fence-after cannot fence: the {} provider cannot power machines off: {why}",
            provider.name()
        );
    }
    Ok(Some(Arc::new(Fencer::new(
        Metered::wrap(Arc::clone(provider), metrics.clone()),
        FenceSettings {
            after,
            selector: fencing.fence_node_selector.clone(),
            max_fraction: fencing.not_ready_max_fraction,
            max_fenced: fencing.max_fenced,
            timeout: fencing.fence_timeout,
            recover: fencing.recover_after_cleanup,
            recover_timeout: fencing.recover_timeout,
            window,
        },
        nodes.clone(),
    ))))
}

/// Every VolumeAttachment, cached trimmed; a change marks its node.
fn watch_attachments(client: &kube::Client, dirty: &Arc<Dirty>) -> Watched<VolumeAttachment> {
    let dirty = Arc::clone(dirty);
    Watched::start_observed(
        Api::<VolumeAttachment>::all(client.clone()),
        watcher::Config::default(),
        WatchCounters::default(),
        volumes::trim_for_cache,
        move |attachment: &VolumeAttachment| dirty.mark(&attachment.spec.node_name),
    )
}

/// Starts the admin server, then the controller in a task of its own.
pub async fn start(args: Args, stop: CancellationToken) -> Result<Started<anyhow::Error>> {
    // Every option is used here: a new flag that nothing reads does not compile.
    let Args {
        controller,
        liveness_guard,
        liveness_guard_window,
        auto_untaint,
        clean_node_recheck,
        auto_taint_after,
        fencing,
    } = args;
    if controller.instances.instance_provider == InstanceProviderKind::ClusterApi {
        bail!(
            "--instance-provider=cluster-api cannot confirm that a machine is off: a Cluster API \
             Machine has no power state. Use aws, redfish, exec or sim, or none with the \
             nodegrace.io/fenced annotation"
        );
    }
    check_fencing(
        &fencing,
        controller.instances.instance_provider,
        auto_untaint,
    )?;
    let mut frame = Frame::new(PROGRAM, controller);
    let metrics = Metrics::register(frame.registry());
    let provider_metrics = metrics.provider.clone();
    let started = frame.start(stop, move |cluster| async move {
        let nodes = cluster.watch_nodes(if fencing.fence_after.is_some() {
            trim_node_keeping_labels
        } else {
            trim_node
        });
        let fencer = fencer(
            &fencing,
            liveness_guard_window,
            cluster.provider.as_ref(),
            &provider_metrics,
            &nodes,
        )?;
        let attachment_changes = Arc::new(Dirty::default());
        let attachments = watch_attachments(&cluster.client, &attachment_changes);
        let heartbeats = Arc::new(Heartbeats::new(tokio::time::Instant::now()));
        // Watched from the start, leader or not: a new leader must already know which kubelets
        // were heard from lately, or it would have to wait a whole window before any cleanup.
        // A fence always asks the heartbeat, whatever --liveness-guard says of the cleanup.
        let heartbeat_watch =
            (liveness_guard || fencer.is_some()).then(|| heartbeats.watch(cluster.client.clone()));
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
                    clean_node_recheck,
                },
                attachments,
                heartbeats,
                taint_clock: TaintClock::default(),
            }),
            nodes,
            dirty: Arc::clone(&cluster.dirty),
            attachment_changes,
            auto_taint: auto_taint_after.map(|after| AutoTaint {
                after,
                provider: cluster
                    .provider
                    .clone()
                    .map(|provider| Metered::wrap(provider, provider_metrics.clone())),
            }),
            fencer,
        };
        Ok(cluster.lead(controller).await?)
    });
    Ok(started.await?)
}
