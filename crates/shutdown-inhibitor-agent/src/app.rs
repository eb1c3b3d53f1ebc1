//! Assembling the agent and running it until SIGTERM.

use anyhow::{Context, Result};
use nodegrace_core::admin::Readiness;
use nodegrace_core::cli::{CommonArgs, NodeArgs};
use nodegrace_core::k8s::client::client;
use nodegrace_core::k8s::events::EventReport;
use nodegrace_core::k8s::nodes::node_reference;
use nodegrace_core::k8s::reporter::{ApiSink, Reporter};
use nodegrace_core::k8s::selectors::parse_selector;
use nodegrace_core::program::{self, Started};
use nodegrace_core::telemetry::ProgramRegistry;
use nodegrace_logind::AgentArgs;
use tokio_util::sync::CancellationToken;

use crate::agent::Agent;
use crate::alerts::Alerts;
use crate::cli::Args;
use crate::config::alert_timeout;
use crate::leases::Scope;
use crate::metrics::Metrics;

pub const PROGRAM: &str = "shutdown-inhibitor-agent";
const ACTION: &str = "Inhibit";

/// Runs the agent until `stop` is cancelled.
pub async fn run(args: Args, stop: CancellationToken) -> Result<()> {
    start(args, stop).await?.wait().await
}

/// Starts the admin server, then the agent in a task of its own.
pub async fn start(args: Args, stop: CancellationToken) -> Result<Started<anyhow::Error>> {
    // Every option is used here: a new flag that nothing reads does not compile.
    let Args {
        agent,
        enabled,
        inhibit_what,
        lease_namespaces,
        lease_selector,
        config,
        alert_timeout: alert_timeout_flag,
    } = args;
    let AgentArgs {
        common,
        node: NodeArgs { node_name: node },
        logind,
    } = agent;
    let CommonArgs {
        kube,
        log: _,
        admin,
    } = common;
    let scope = Scope {
        namespaces: lease_namespaces
            .into_iter()
            .map(|namespace| namespace.trim().to_owned())
            .filter(|namespace| !namespace.is_empty())
            .collect(),
        selector: parse_selector(&lease_selector)
            .map_err(anyhow::Error::msg)
            .context("--lease-selector")?,
        selector_text: lease_selector,
    };
    let alert_timeout =
        alert_timeout(config.as_deref(), alert_timeout_flag).context("invalid configuration")?;
    let mut registry = ProgramRegistry::new(PROGRAM);
    let metrics = Metrics::register(&mut registry);
    let registry = registry.into_registry();
    let readiness = Readiness::new();
    let ready = readiness.gate("leases-and-logind");
    let started = program::start(admin.admin_listen, registry, readiness, async move {
        let client = client(&kube, PROGRAM)
            .await
            .context("build the Kubernetes client")?;
        let (reporter, flushed) = Reporter::start(ApiSink::new(client.clone(), PROGRAM, &node));
        if !enabled {
            // Not ready, on purpose and visibly; no crash loop.
            tracing::warn!("the shutdown inhibitor is disabled (--enabled=false)");
            reporter.event(EventReport::warning(
                node_reference(&node),
                "ShutdownInhibitorDisabled",
                ACTION,
                "The shutdown inhibitor agent is disabled; Leases do not block shutdown on this node",
            ));
            stop.cancelled().await;
            return Ok(());
        }
        let unavailable = |error: &nodegrace_logind::LogindError| {
            reporter.event(EventReport::warning(
                node_reference(&node),
                "LogindUnavailable",
                ACTION,
                format!("Cannot reach logind: {error}"),
            ));
        };
        let Some(logind) = logind.source().connect(&stop, unavailable).await else {
            return Ok(());
        };
        let agent = Agent {
            logind,
            client,
            node,
            scope,
            what: inhibit_what,
            metrics,
            reporter,
            alerts: Alerts::new(alert_timeout),
            ready,
        };
        let result = agent.run(stop).await;
        flushed.wait().await;
        result
    });
    started.await.context("start the admin server")
}
