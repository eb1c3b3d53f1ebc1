//! Assembling the agent from its options and running it until SIGTERM.

use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use nodegrace_core::admin::{self, Readiness};
use nodegrace_core::error_chain::Chain;
use nodegrace_core::k8s::client::client;
use nodegrace_core::k8s::events::EventPublisher;
use nodegrace_core::logind::{DelayConfig, Logind, ensure_inhibit_delay};
use nodegrace_core::telemetry::program_registry;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::agent::Agent;
use crate::cli::Args;
use crate::metrics::Metrics;
use crate::node_marks::NodeMarks;
use crate::node_pods::NodePods;
use crate::state::{StateFile, read_boot_id};
use crate::terminate::Terminator;

pub const PROGRAM: &str = "graceful-shutdown-agent";

/// Runs the agent until `stop` is cancelled.
pub async fn run(args: Args, stop: CancellationToken) -> Result<()> {
    start(args, stop, None).await?.finished.await?
}

/// A started agent: where its admin server listens, and its completion.
#[derive(Debug)]
pub struct Started {
    pub admin_address: std::net::SocketAddr,
    pub finished: tokio::task::JoinHandle<Result<()>>,
}

/// Extra shutdown events merged into logind's (tests use it for PrepareForShutdown(false),
/// which elogind cannot be made to send).
pub type ExtraEvents = futures::stream::BoxStream<'static, nodegrace_core::logind::ShutdownEvent>;

/// Starts the admin server and the agent; the agent keeps running in a task.
pub async fn start(
    args: Args,
    stop: CancellationToken,
    extra_events: Option<ExtraEvents>,
) -> Result<Started> {
    let plan = args
        .settings()
        .and_then(|settings| settings.plan())
        .context("invalid shutdown configuration")?;
    let node = args.node.node_name.clone();
    let mut registry = program_registry(PROGRAM);
    let metrics = Metrics::register(&mut registry);
    let readiness = Readiness::new();
    let inhibitor_gate = readiness.gate("logind-inhibitor");
    // The admin server outlives SIGTERM while a shutdown is being finished: probes and metrics
    // matter most then. It stops when the agent does.
    let admin_stop = CancellationToken::new();
    let admin = admin::serve(
        args.common.admin.admin_listen,
        registry,
        readiness.clone(),
        admin_stop.clone(),
    )
    .await
    .context("start the admin server")?;
    let admin_address = admin.local_addr();
    tracing::info!(address = %admin_address, node, "admin server listening");
    let finished = tokio::spawn(async move {
        let _stop_admin = admin_stop.drop_guard();
        if plan.is_disabled() {
            tracing::info!(
                "graceful shutdown is disabled: no shutdownGracePeriod or shutdownGracePeriodByPodPriority is set; \
                 holding no inhibitor"
            );
            inhibitor_gate.set(true);
            stop.cancelled().await;
            return Ok(());
        }
        run_agent(args, plan, metrics, inhibitor_gate, stop, extra_events).await
    });
    Ok(Started {
        admin_address,
        finished,
    })
}

async fn run_agent(
    args: Args,
    plan: crate::plan::ShutdownPlan,
    metrics: Metrics,
    inhibitor_gate: nodegrace_core::admin::ReadinessGate,
    stop: CancellationToken,
    extra_events: Option<ExtraEvents>,
) -> Result<()> {
    let node = args.node.node_name.clone();

    let client = client(&args.common.kube, PROGRAM)
        .await
        .context("build the Kubernetes client")?;
    let logind = connect_logind(args.dbus_address.as_deref(), &stop).await?;
    let Some(logind) = logind else { return Ok(()) };

    let events = EventPublisher::new(client.clone(), PROGRAM, &node);
    let marks = NodeMarks::new(Api::<Node>::all(client.clone()), node.clone(), events);
    let delay = DelayConfig {
        drop_in_dir: args.logind_drop_in_dir.clone(),
        file_name: args.logind_drop_in_file.clone(),
        reload_timeout: args.logind_reload_timeout,
    };
    let wanted = plan.total();
    // The lock is taken with what logind allows now; the budget rises when logind applies the
    // drop-in, which may take the whole reload timeout (or never happen).
    let allowed = logind.inhibit_delay_max().await?;
    let initial = wanted.min(allowed);
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
        terminator: Terminator::new(client, pods.clone(), node.clone()),
        pods,
        marks,
        state: StateFile::new(&args.state_dir),
        boot_id: read_boot_id(&args.boot_id_file),
        own_pod: args.pod_namespace.clone().zip(args.pod_name.clone()),
        metrics,
        ready: inhibitor_gate,
    };
    agent.run(stop, extra_events).await
}

/// Raises logind's InhibitDelayMaxSec through the drop-in and publishes the budget in effect.
async fn raise_budget(
    logind: Logind,
    wanted: Duration,
    delay: DelayConfig,
    budget: watch::Sender<Duration>,
    metrics: Metrics,
    marks: NodeMarks,
) {
    let effective = match ensure_inhibit_delay(&logind, wanted, &delay).await {
        Ok(outcome) => outcome.effective,
        Err(error) => {
            // Running with what logind grants beats crash-looping on a read-only host path.
            tracing::error!(error = %Chain(&error), "cannot raise logind's InhibitDelayMaxSec");
            logind
                .inhibit_delay_max()
                .await
                .map_or(*budget.borrow(), |allowed| allowed.min(wanted))
        }
    };
    budget.send_replace(effective);
    metrics.budget_seconds.set(effective.as_secs_f64());
    if effective < wanted {
        metrics.budget_reduced.set(1);
        tracing::warn!(
            wanted = wanted.as_secs(),
            effective = effective.as_secs(),
            "shutdown budget reduced by logind"
        );
        marks
            .budget_reduced(wanted.as_secs(), effective.as_secs())
            .await;
    } else {
        tracing::info!(
            budget = effective.as_secs(),
            "logind applied the shutdown budget"
        );
    }
}

/// Connects to logind, retrying while it is not there yet (the agent stays not-ready).
async fn connect_logind(address: Option<&str>, stop: &CancellationToken) -> Result<Option<Logind>> {
    let mut pause = Duration::from_millis(200);
    loop {
        let connected = match address {
            Some(address) => Logind::connect_to(address).await,
            None => Logind::connect().await,
        };
        match connected {
            Ok(logind) => return Ok(Some(logind)),
            Err(error) => tracing::error!(error = %Chain(&error), "cannot reach logind; retrying"),
        }
        tokio::select! {
            () = stop.cancelled() => return Ok(None),
            () = tokio::time::sleep(pause) => {}
        }
        pause = (pause * 2).min(Duration::from_secs(10));
    }
}
