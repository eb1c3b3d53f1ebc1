//! Assembling the agent from its options and running it until SIGTERM.

use std::time::Duration;

use anyhow::{Context, Result};
use nodegrace_core::admin::{Readiness, ReadinessGate};
use nodegrace_core::cli::{CommonArgs, KubeArgs, NodeArgs};
use nodegrace_core::error_chain::Chain;
use nodegrace_core::k8s::client::client;
use nodegrace_core::k8s::reporter::{ApiSink, Reporter};
use nodegrace_core::program::{self, Started};
use nodegrace_core::telemetry::ProgramRegistry;
use nodegrace_logind::AgentArgs;
use nodegrace_logind::{DelayConfig, LogindError, SharedLogind};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::agent::Agent;
use crate::budget::effective;
use crate::cli::Args;
use crate::kubelet_conflict;
use crate::metrics::Metrics;
use crate::node_marks::NodeMarks;
use crate::node_pods::NodePods;
use crate::plan::ShutdownPlan;
use crate::state::{StateFile, read_boot_id};
use crate::terminate::Terminator;
use crate::write_budget;

pub const PROGRAM: &str = "graceful-shutdown-agent";

/// Runs the agent until `stop` is cancelled.
pub async fn run(args: Args, stop: CancellationToken) -> Result<()> {
    start(args, stop).await?.wait().await
}

/// Starts the admin server, then the agent in a task of its own.
pub async fn start(args: Args, stop: CancellationToken) -> Result<Started<anyhow::Error>> {
    let plan = args
        .settings()
        .and_then(|settings| settings.plan())
        .context("invalid shutdown configuration")?;
    let mut registry = ProgramRegistry::new(PROGRAM);
    let metrics = Metrics::register(&mut registry);
    let registry = registry.into_registry();
    let readiness = Readiness::new();
    let inhibitor_gate = readiness.gate("logind-inhibitor");
    let listen = args.agent.common.admin.admin_listen;
    let work = async move {
        if plan.is_disabled() {
            tracing::info!(
                "graceful shutdown is disabled: no shutdownGracePeriod or \
                 shutdownGracePeriodByPodPriority is set; holding no inhibitor"
            );
            inhibitor_gate.set(true);
            stop.cancelled().await;
            return Ok(());
        }
        run_agent(args, plan, metrics, inhibitor_gate, stop).await
    };
    program::start(listen, registry, readiness, work)
        .await
        .context("start the admin server")
}

async fn run_agent(
    args: Args,
    plan: ShutdownPlan,
    metrics: Metrics,
    ready: ReadinessGate,
    stop: CancellationToken,
) -> Result<()> {
    // Every option is used here or in `start`: a new flag that nothing reads does not compile.
    let Args {
        agent:
            AgentArgs {
                common:
                    CommonArgs {
                        kube,
                        log: _,
                        admin: _,
                    },
                node: NodeArgs { node_name: node },
                logind,
            },
        config: _,
        shutdown_grace_period: _,
        shutdown_grace_period_critical_pods: _,
        shutdown_grace_period_by_pod_priority: _,
        state_dir,
        logind_drop_in_dir,
        logind_drop_in_file,
        logind_reload_timeout,
        boot_id_file,
        shutdown_api_burst,
        pod_name,
        pod_namespace,
    } = args;
    let client = client(&kube, PROGRAM)
        .await
        .context("build the Kubernetes client")?;
    let (reporter, flushed) = Reporter::start(ApiSink::new(client.clone(), PROGRAM, &node));
    let marks = NodeMarks::new(reporter, node.clone());
    let max_pods = node_max_pods(&client, &node).await;
    let burst = write_budget::shutdown_burst(shutdown_api_burst, max_pods);
    if let Err(too_slow) = write_budget::check(&plan, max_pods, kube.api_qps, burst) {
        tracing::warn!(%too_slow, "the shutdown's API limit cannot stop a full node in time");
        marks.shutdown_writes_too_slow(&too_slow);
    }
    let shutdown_limits = KubeArgs {
        api_burst: burst,
        ..kube.clone()
    };
    let shutdown_client = nodegrace_core::k8s::client::client(&shutdown_limits, PROGRAM)
        .await
        .context("build the shutdown's Kubernetes client")?;
    let unavailable = |error: &LogindError| marks.logind_unavailable(error);
    let Some(logind) = logind.source().connect(&stop, unavailable).await else {
        return Ok(());
    };
    tokio::spawn(kubelet_conflict::watch(
        logind.clone(),
        logind_drop_in_dir.clone(),
        marks.clone(),
        stop.clone(),
    ));
    let delay = DelayConfig {
        drop_in_dir: logind_drop_in_dir,
        file_name: logind_drop_in_file,
        reload_timeout: logind_reload_timeout,
    };
    let wanted = plan.total();
    // The lock is taken with what logind allows now; the budget rises when logind applies the
    // drop-in, which may take the whole reload timeout (or never happen).
    let allowed = logind.inhibit_delay_max().await?;
    let initial = effective(wanted, allowed);
    let (budget_sender, budget) = watch::channel(initial);
    metrics.budget_seconds.set(initial.as_secs_f64());
    if allowed < wanted {
        tokio::spawn(raise_budget(
            logind.clone(),
            wanted,
            delay,
            budget_sender,
            metrics.clone(),
            marks.clone(),
        ));
    }

    let pods = NodePods::start(client.clone(), &node);
    let agent = Agent {
        logind,
        plan,
        budget,
        terminator: Terminator::new(shutdown_client, pods.clone(), node.clone()),
        pods,
        marks,
        state: StateFile::new(&state_dir),
        boot_id: read_boot_id(&boot_id_file),
        own_pod: pod_namespace.zip(pod_name),
        metrics,
        ready,
    };
    let result = agent.run(stop).await;
    flushed.wait().await;
    result
}

/// Raises logind's InhibitDelayMaxSec through the drop-in and publishes the budget in effect.
async fn raise_budget(
    logind: SharedLogind,
    wanted: Duration,
    delay: DelayConfig,
    budget: watch::Sender<Duration>,
    metrics: Metrics,
    marks: NodeMarks,
) {
    let granted = match logind.ensure_inhibit_delay(wanted, &delay).await {
        Ok(outcome) => outcome.effective,
        Err(error) => {
            // Running with what logind grants beats crash-looping on a read-only host path.
            tracing::error!(error = %Chain(&error), "cannot raise logind's InhibitDelayMaxSec");
            logind
                .inhibit_delay_max()
                .await
                .map_or(*budget.borrow(), |allowed| effective(wanted, allowed))
        }
    };
    budget.send_replace(granted);
    metrics.budget_seconds.set(granted.as_secs_f64());
    if granted < wanted {
        metrics.budget_reduced.set(1);
        tracing::warn!(
            wanted = wanted.as_secs(),
            effective = granted.as_secs(),
            "shutdown budget reduced by logind"
        );
        marks.budget_reduced(wanted.as_secs(), granted.as_secs());
    } else {
        tracing::info!(
            budget = granted.as_secs(),
            "logind applied the shutdown budget"
        );
    }
}

/// How many pods the node can hold (`status.allocatable.pods`), from a read at start; the
/// kubelet's default when the node does not say or cannot be read.
async fn node_max_pods(client: &kube::Client, node: &str) -> u32 {
    let read = kube::Api::<k8s_openapi::api::core::v1::Node>::all(client.clone())
        .get(node)
        .await;
    let allocatable = read.ok().and_then(|node| {
        let pods = node.status?.allocatable?.get("pods")?.0.clone();
        pods.parse::<u32>().ok()
    });
    allocatable.unwrap_or(write_budget::DEFAULT_MAX_PODS)
}
