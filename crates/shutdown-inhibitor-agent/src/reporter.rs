//! Telling the cluster (the node condition and Events) off the agent's critical path: the
//! block is taken or released at once, and the API writes follow in order in a worker of their
//! own, so a slow or rate-limited API server never delays the inhibitor. Failed writes are
//! retried every second until they land. Each Event is its own object (never folded into a
//! series, which would keep only the first note of a reason).

use std::collections::VecDeque;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, ObjectReference};
use kube::{Api, Client};
use nodegrace_core::error_chain::Chain;
use nodegrace_core::k8s::conditions::{ConditionSpec, upsert_node_condition};
use nodegrace_core::k8s::events::{EventPublisher, EventType};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::leases::{Holder, describe};

pub const CONDITION_TYPE: &str = "ShutdownInhibited";

#[derive(Debug)]
enum Report {
    Event {
        regarding: ObjectReference,
        warning: bool,
        reason: &'static str,
        note: String,
    },
    Condition(Vec<Holder>),
}

#[derive(Debug, Clone)]
pub struct Reporter {
    sender: mpsc::UnboundedSender<Report>,
}

impl Reporter {
    pub fn start(
        client: Client,
        node: String,
        events: EventPublisher,
        stop: CancellationToken,
    ) -> Self {
        let (sender, receiver) = mpsc::unbounded_channel();
        tokio::spawn(work(Api::all(client), node, events, receiver, stop));
        Self { sender }
    }

    pub fn event(
        &self,
        regarding: ObjectReference,
        warning: bool,
        reason: &'static str,
        note: String,
    ) {
        // The worker only stops with the agent; a lost report then no longer matters.
        let _ = self.sender.send(Report::Event {
            regarding,
            warning,
            reason,
            note,
        });
    }

    /// The condition to converge to; later calls supersede earlier ones.
    pub fn condition(&self, holders: Vec<Holder>) {
        let _ = self.sender.send(Report::Condition(holders));
    }
}

/// How long a failed write waits before it is tried again.
const RETRY_PAUSE: Duration = Duration::from_secs(1);

async fn work(
    nodes: Api<Node>,
    node: String,
    events: EventPublisher,
    mut reports: mpsc::UnboundedReceiver<Report>,
    stop: CancellationToken,
) {
    // Both survive failed writes: an alert that falls due while the API server is away is
    // published when it is back, once, and the condition converges to the latest holders.
    let mut pending_events: VecDeque<Report> = VecDeque::new();
    let mut pending_condition: Option<Vec<Holder>> = None;
    let mut open = true;
    loop {
        let retrying = !pending_events.is_empty() || pending_condition.is_some();
        if !open && !retrying {
            return;
        }
        let first = tokio::select! {
            () = stop.cancelled() => return,
            report = reports.recv(), if open => {
                if report.is_none() {
                    open = false;
                    continue;
                }
                report
            }
            () = tokio::time::sleep(RETRY_PAUSE), if retrying => None,
        };
        let mut batch: Vec<Report> = first.into_iter().collect();
        while let Ok(report) = reports.try_recv() {
            batch.push(report);
        }
        for report in batch {
            match report {
                Report::Condition(holders) => pending_condition = Some(holders),
                event @ Report::Event { .. } => pending_events.push_back(event),
            }
        }
        // In order: a later Event is not published before an earlier one that failed.
        while let Some(Report::Event {
            regarding,
            warning,
            reason,
            note,
        }) = pending_events.front()
        {
            let type_ = if *warning {
                EventType::Warning
            } else {
                EventType::Normal
            };
            let published = events
                .try_publish_distinct(regarding, type_, reason, "Inhibit", note.clone())
                .await;
            match published {
                Ok(()) => {
                    pending_events.pop_front();
                }
                Err(error) => {
                    tracing::warn!(error = %Chain(&error), reason, "cannot publish an Event; retrying");
                    break;
                }
            }
        }
        if let Some(holders) = &pending_condition {
            let message = if holders.is_empty() {
                "No active Leases block shutdown.".to_owned()
            } else {
                describe(holders)
            };
            let condition = ConditionSpec {
                type_: CONDITION_TYPE,
                status: if holders.is_empty() { "False" } else { "True" },
                reason: if holders.is_empty() {
                    "NoActiveLeases"
                } else {
                    "ActiveLeases"
                },
                message: &message,
            };
            match upsert_node_condition(&nodes, &node, &condition).await {
                Ok(_) => pending_condition = None,
                Err(error) => {
                    tracing::warn!(error = %Chain(&error), "cannot update the ShutdownInhibited condition; retrying");
                }
            }
        }
    }
}
