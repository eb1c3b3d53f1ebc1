//! The leader's loop: one cleanup task per node with the out-of-service taint (each watching
//! only its node's pods), woken when its node, its pods or its VolumeAttachments change; and,
//! with `--auto-taint-after`, a timer per NotReady node for when it becomes a candidate.
//! Watches report *which* object changed, so the loop never rescans thousands of nodes.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use nodegrace_core::assembly::Lead;
use nodegrace_core::controller::{Backoff, Dirty};
use nodegrace_core::error_chain::Chain;
use nodegrace_core::k8s::events::EventReport;
use nodegrace_core::k8s::nodes::{node_reference, taint_with_key};
use nodegrace_core::k8s::watched::Watched;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tokio_util::time::{DelayQueue, delay_queue};

use crate::cleanup::{NodeCleanup, Outcome, PassError, Shared};
use crate::qualify::OUT_OF_SERVICE_TAINT;
use crate::tainting::{Attempt, AutoTaint, due_at};

/// How soon a node that could not be confirmed powered off is asked about again.
const RECHECK_UNCONFIRMED: Duration = Duration::from_secs(30);
/// Retry delays of a failing cleanup pass.
const BACKOFF: Backoff = Backoff {
    first: Duration::from_millis(500),
    longest: Duration::from_secs(30),
};

#[derive(Debug)]
pub struct Controller {
    pub shared: Arc<Shared>,
    pub nodes: Watched<Node>,
    pub dirty: Arc<Dirty>,
    pub auto_taint: Option<AutoTaint>,
}

struct Worker {
    poke: watch::Sender<()>,
}

impl Lead for Controller {
    fn lead(&self, acting: CancellationToken) -> impl Future<Output = ()> + Send {
        self.run(acting)
    }
}

impl Controller {
    /// Runs until `acting` is cancelled (leadership lost, or the program stopping); every
    /// cleanup task stops with it.
    pub async fn run(&self, acting: CancellationToken) {
        let mut workers: HashMap<String, Worker> = HashMap::new();
        let mut running: JoinSet<String> = JoinSet::new();
        let mut checks: DelayQueue<String> = DelayQueue::new();
        let mut scheduled: HashMap<String, delay_queue::Key> = HashMap::new();
        let mut attempts: JoinSet<(String, Attempt)> = JoinSet::new();
        let mut told_unconfirmed: HashSet<String> = HashSet::new();
        for node in self.nodes.state() {
            self.dirty
                .mark(&node.metadata.name.clone().unwrap_or_default());
        }
        loop {
            for name in self.dirty.take() {
                let node = self.nodes.get(None, &name);
                let tainted = node
                    .as_deref()
                    .is_some_and(|node| taint_with_key(node, OUT_OF_SERVICE_TAINT).is_some());
                if let Some(worker) = workers.get(&name) {
                    worker.poke.send_replace(());
                } else if tainted {
                    let (poke, poked) = watch::channel(());
                    let cleanup = NodeCleanup::new(Arc::clone(&self.shared), &name);
                    running.spawn(look_after(
                        cleanup,
                        poked,
                        acting.child_token(),
                        name.clone(),
                    ));
                    workers.insert(name.clone(), Worker { poke });
                }
                if let Some(auto) = &self.auto_taint {
                    let due = node
                        .as_deref()
                        .and_then(|node| due_at(node, auto.after, Timestamp::now()));
                    if let Some(key) = scheduled.remove(&name) {
                        checks.remove(&key);
                    }
                    match due {
                        Some(due) => {
                            let wait = Duration::try_from(due.duration_since(Timestamp::now()))
                                .unwrap_or(Duration::ZERO);
                            scheduled.insert(name.clone(), checks.insert(name, wait));
                        }
                        None => {
                            told_unconfirmed.remove(&name);
                        }
                    }
                }
            }
            self.shared.metrics.nodes_tainted.set(workers.len() as i64);
            tokio::select! {
                () = acting.cancelled() => break,
                () = self.dirty.marked() => {}
                Some(finished) = running.join_next() => {
                    if let Ok(name) = finished {
                        workers.remove(&name);
                        // Tainted again since the task decided to finish: look again.
                        self.dirty.mark(&name);
                    }
                }
                Some(expired) = checks.next() => {
                    let name = expired.into_inner();
                    scheduled.remove(&name);
                    if let Some(auto) = self.auto_taint.clone() {
                        let shared = Arc::clone(&self.shared);
                        attempts.spawn(async move {
                            let attempt = match auto.attempt(&shared, &name).await {
                                Ok(attempt) => attempt,
                                Err(error) => {
                                    shared.metrics.error(error.kind());
                                    Attempt::Unconfirmed(Chain(&error).to_string())
                                }
                            };
                            (name, attempt)
                        });
                    }
                }
                Some(done) = attempts.join_next() => {
                    if let Ok((name, Attempt::Unconfirmed(why))) = done {
                        if told_unconfirmed.insert(name.clone()) {
                            tracing::warn!(node = %name, %why, "not tainting: not confirmed powered off");
                            self.shared.reporter.event(EventReport::warning(
                                node_reference(&name),
                                "OutOfServiceNotConfirmed",
                                "OutOfServiceTaint",
                                format!("NotReady long enough for --auto-taint-after, but not tainted: {why}"),
                            ));
                        }
                        if !scheduled.contains_key(&name) {
                            scheduled.insert(name.clone(), checks.insert(name, RECHECK_UNCONFIRMED));
                        }
                    }
                }
            }
        }
        running.shutdown().await;
        attempts.shutdown().await;
        self.shared.metrics.nodes_tainted.set(0);
    }
}

/// One node's cleanup task: passes until the node needs nothing more, waiting between them for
/// a change of its pods, a poke (its node or attachments changed), or a timer.
async fn look_after(
    cleanup: NodeCleanup,
    mut poked: watch::Receiver<()>,
    stop: CancellationToken,
    name: String,
) -> String {
    let mut pods = cleanup.pods().clone();
    tokio::select! {
        () = stop.cancelled() => return name,
        synced = pods.synced() => if synced.is_err() { return name },
    }
    let mut failures = 0;
    loop {
        let wait = match cleanup.pass().await {
            Ok(Outcome::Finished) => return name,
            Ok(Outcome::Wait(wait)) => {
                failures = 0;
                wait
            }
            Err(error) => {
                failures = match error {
                    PassError::Partial(_) => 1,
                    PassError::Api { .. } => failures + 1,
                };
                let delay = BACKOFF.delay(failures);
                tracing::warn!(node = %name, error = %Chain(&error), retry_in = ?delay, "cleanup pass failed");
                cleanup.shared().metrics.error(error.kind());
                // Backing off: changes do not cut the wait short.
                tokio::select! {
                    () = stop.cancelled() => return name,
                    () = tokio::time::sleep(delay) => continue,
                }
            }
        };
        let timer = nodegrace_core::controller::sleep_or_forever(wait);
        tokio::select! {
            () = stop.cancelled() => return name,
            changed = pods.changed() => if changed.is_err() { return name },
            changed = poked.changed() => if changed.is_err() { return name },
            () = timer => {}
        }
    }
}
