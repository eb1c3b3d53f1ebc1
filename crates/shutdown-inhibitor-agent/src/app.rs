//! Assembling the agent and running it until SIGTERM.

use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::ObjectReference;
use nodegrace_core::admin::{self, Readiness};
use nodegrace_core::error_chain::Chain;
use nodegrace_core::k8s::client::client;
use nodegrace_core::k8s::events::{EventPublisher, EventType};
use nodegrace_core::logind::Logind;
use nodegrace_core::telemetry::program_registry;
use tokio_util::sync::CancellationToken;

use crate::agent::{Agent, ExtraEvents};
use crate::alerts::Alerts;
use crate::cli::Args;
use crate::config::alert_timeout;
use crate::metrics::Metrics;

pub const PROGRAM: &str = "shutdown-inhibitor-agent";

#[derive(Debug)]
pub struct Started {
    pub admin_address: std::net::SocketAddr,
    pub finished: tokio::task::JoinHandle<Result<()>>,
}

pub async fn run(args: Args, stop: CancellationToken) -> Result<()> {
    start(args, stop, None).await?.finished.await?
}

pub async fn start(
    args: Args,
    stop: CancellationToken,
    extra_events: Option<ExtraEvents>,
) -> Result<Started> {
    let alert_timeout = alert_timeout(args.config.as_deref(), args.alert_timeout)
        .context("invalid configuration")?;
    let mut registry = program_registry(PROGRAM);
    let metrics = Metrics::register(&mut registry);
    let readiness = Readiness::new();
    let ready = readiness.gate("leases-and-logind");
    let admin = admin::serve(
        args.common.admin.admin_listen,
        registry,
        readiness,
        stop.clone(),
    )
    .await
    .context("start the admin server")?;
    let admin_address = admin.local_addr();
    tracing::info!(address = %admin_address, node = args.node.node_name, "admin server listening");
    let client = client(&args.common.kube, PROGRAM)
        .await
        .context("build the Kubernetes client")?;
    let node = args.node.node_name.clone();
    let events = EventPublisher::new(client.clone(), PROGRAM, &node);
    let finished = tokio::spawn(async move {
        let reference = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(node.clone()),
            uid: Some(node.clone()),
            ..ObjectReference::default()
        };
        if !args.enabled {
            // Not ready, on purpose and visibly; no crash loop.
            tracing::warn!("the shutdown inhibitor is disabled (--enabled=false)");
            events.publish(&reference, EventType::Warning, "ShutdownInhibitorDisabled", "Inhibit", Some("The shutdown inhibitor agent is disabled; Leases do not block shutdown on this node".into())).await;
            stop.cancelled().await;
            return Ok(());
        }
        let Some(logind) =
            connect_logind(args.dbus_address.as_deref(), &stop, &events, &reference).await
        else {
            return Ok(());
        };
        let reporter =
            crate::reporter::Reporter::start(client.clone(), node.clone(), events, stop.clone());
        let agent = Agent {
            logind,
            client,
            node,
            what: args.inhibit_what,
            metrics,
            reporter,
            alerts: Alerts::new(alert_timeout),
            ready,
        };
        agent.run(stop, extra_events).await
    });
    Ok(Started {
        admin_address,
        finished,
    })
}

/// Connects to logind, retrying while it is not there (the agent stays not ready and says why).
async fn connect_logind(
    address: Option<&str>,
    stop: &CancellationToken,
    events: &EventPublisher,
    node: &ObjectReference,
) -> Option<Logind> {
    let mut pause = Duration::from_millis(200);
    let mut reported = false;
    loop {
        let connected = match address {
            Some(address) => Logind::connect_to(address).await,
            None => Logind::connect().await,
        };
        match connected {
            Ok(logind) => return Some(logind),
            Err(error) => {
                tracing::error!(error = %Chain(&error), "cannot reach logind; retrying");
                if !reported {
                    reported = true;
                    events
                        .publish(
                            node,
                            EventType::Warning,
                            "LogindUnavailable",
                            "Inhibit",
                            Some(format!("Cannot reach logind: {error}")),
                        )
                        .await;
                }
            }
        }
        tokio::select! {
            () = stop.cancelled() => return None,
            () = tokio::time::sleep(pause) => {}
        }
        pause = (pause * 2).min(Duration::from_secs(10));
    }
}
