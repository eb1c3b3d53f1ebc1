//! One node's termination, from its deletion to the removal of our finalizer: budgets →
//! cordon → drain → volumes → machine → finalizer. Every step starts by looking at what is
//! already done, so a restarted controller (or a new leader) picks a node up where it was:
//! grants are in the budgets' status, the cordon on the node, a terminate request in an
//! annotation, and the machine's state at the provider.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use nodegrace_core::controller::Backoff;
use nodegrace_core::error_chain::Chain;
use nodegrace_core::instances::{InstanceError, InstanceState, ProviderId};
use nodegrace_core::k8s::api_errors::status_code;
use nodegrace_core::k8s::conditions::ConditionSpec;
use nodegrace_core::k8s::events::EventReport;
use nodegrace_core::k8s::nodes::node_reference;
use nodegrace_core::k8s::reporter::ConditionGuard;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::api::{DISRUPTED_TAINT, EXCLUDE_FROM_LOAD_BALANCERS, FINALIZER};
use crate::drain::{Drain, Waiting};
use crate::grants::{Refusal, Verdict};
use crate::shared::Shared;
use crate::tiers::disrupted_taint;

pub const TERMINATING: &str = "Terminating";
pub const DRAIN_IN_PROGRESS: &str = "DrainInProgress";
pub const DRAINED: &str = "Drained";
/// When the terminate request was accepted: a restarted controller waits for that request to
/// finish instead of sending a second one.
pub const TERMINATE_REQUESTED: &str = "nodegrace.io/terminate-requested-at";
/// A request the provider accepted but never carried out is sent again after this long.
const TERMINATE_RESEND: Duration = Duration::from_secs(300);
/// How often the provider is asked while a machine shuts down (clouds have no watch).
const PROVIDER_POLL: Backoff = Backoff {
    first: Duration::from_millis(200),
    longest: Duration::from_secs(15),
};
/// Retry delays of failing API writes.
const WRITE_BACKOFF: Backoff = Backoff {
    first: Duration::from_millis(200),
    longest: Duration::from_secs(30),
};

/// How a node's termination ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finished {
    /// Our finalizer is removed (or the node is gone).
    Released,
    /// Not ours to do (not deleting, or no finalizer of ours).
    NotOurs,
    /// Leadership lost or the program stopping.
    Stopped,
}

/// One node's termination task.
#[derive(Debug)]
pub struct NodeTermination {
    shared: Arc<Shared>,
    node: String,
    last_condition: Option<(String, String)>,
    announced: HashSet<String>,
}

impl NodeTermination {
    pub fn new(shared: Arc<Shared>, node: &str) -> Self {
        Self {
            shared,
            node: node.to_owned(),
            last_condition: None,
            announced: HashSet::new(),
        }
    }

    fn current(&self) -> Option<Arc<Node>> {
        self.shared.nodes().get(None, &self.node)
    }

    fn condition(&mut self, reason: &str, message: String) {
        let key = (reason.to_owned(), message.clone());
        if self.last_condition.as_ref() == Some(&key) {
            return;
        }
        self.last_condition = Some(key);
        self.shared.reporter.condition(
            &self.node,
            ConditionSpec::new(TERMINATING, "True", reason, message),
            ConditionGuard::Always,
        );
    }

    /// An Event about the node, once per `key` for this task.
    fn announce(&mut self, key: &str, warning: bool, reason: &str, note: String) {
        if !self.announced.insert(key.to_owned()) {
            return;
        }
        let reference = node_reference(&self.node);
        self.shared.reporter.event(if warning {
            EventReport::warning(reference, reason, "Terminate", note)
        } else {
            EventReport::normal(reference, reason, "Terminate", note)
        });
    }

    /// Runs the termination until the finalizer is gone, it is not ours, or `stop`.
    pub async fn run(mut self, mut wake: watch::Receiver<()>, stop: CancellationToken) -> Finished {
        let mut failures = 0;
        loop {
            let result = self.attempt(&mut wake, &stop).await;
            match result {
                Ok(finished) => return finished,
                Err(error) => {
                    failures += 1;
                    self.shared.metrics.error(error.kind());
                    let delay = WRITE_BACKOFF.delay(failures);
                    tracing::warn!(node = self.node, error = %Chain(&error), retry_in = ?delay, "node termination step failed");
                    tokio::select! {
                        () = stop.cancelled() => return Finished::Stopped,
                        () = tokio::time::sleep(delay) => {}
                    }
                }
            }
        }
    }

    async fn attempt(
        &mut self,
        wake: &mut watch::Receiver<()>,
        stop: &CancellationToken,
    ) -> Result<Finished, StepError> {
        // 1. Every budget covering the node grants its disruption.
        let node = loop {
            let Some(node) = self.current() else {
                return Ok(Finished::Released);
            };
            if !ours(&node) {
                return Ok(Finished::NotOurs);
            }
            match self.shared.budgets.acquire(&node).await? {
                Verdict::Granted { budgets } => {
                    if !budgets.is_empty() {
                        self.announce(
                            "granted",
                            false,
                            "DisruptionGranted",
                            format!("Granted by NodeDisruptionBudget(s) {}", budgets.join(", ")),
                        );
                    }
                    break node;
                }
                Verdict::Waiting { budget, refusal } => {
                    let invalid = matches!(refusal, Refusal::Invalid(_));
                    let message = format!("NodeDisruptionBudget {budget}: {refusal}");
                    self.announce(
                        &format!("waiting:{budget}:{invalid}"),
                        invalid,
                        "AwaitingBudget",
                        format!("Waiting for NodeDisruptionBudget {budget}: {refusal}"),
                    );
                    self.condition("AwaitingBudget", message);
                }
            }
            tokio::select! {
                () = stop.cancelled() => return Ok(Finished::Stopped),
                changed = wake.changed() => if changed.is_err() { return Ok(Finished::Stopped) },
            }
        };
        // 2. Cordon.
        if !cordoned(&node) {
            self.cordon().await?;
            self.announce(
                "cordoned",
                false,
                "Cordoned",
                format!("Cordoned: taint {DISRUPTED_TAINT}:NoSchedule, unschedulable, excluded from external load balancers"),
            );
        }
        // 3. Drain.
        let deleted = node.metadata.deletion_timestamp.as_ref().map(|time| time.0);
        let mut drain = Drain::start(Arc::clone(&self.shared), &self.node, deleted);
        self.shared.reporter.condition(
            &self.node,
            ConditionSpec::new(
                DRAIN_IN_PROGRESS,
                "True",
                "Draining",
                "Evicting the node's pods tier by tier",
            ),
            ConditionGuard::Always,
        );
        drain
            .run(wake, stop, |waiting| match waiting {
                Waiting::DoNotEvict(message) => {
                    self.condition("BlockedByDoNotEvict", message.clone());
                }
                Waiting::Pods { message, .. } => self.condition("Draining", message.clone()),
            })
            .await
            .map_err(|_| StepError::WatchEnded)?;
        if stop.is_cancelled() {
            return Ok(Finished::Stopped);
        }
        if self.announced.insert("drained".to_owned()) {
            self.shared.metrics.nodes_drained.inc();
            self.shared.reporter.event(EventReport::normal(
                node_reference(&self.node),
                "Drained",
                "Drain",
                "Every pod that had to go is gone".to_owned(),
            ));
        }
        self.shared.reporter.condition(
            &self.node,
            ConditionSpec::new(DRAIN_IN_PROGRESS, "False", "Drained", "The drain completed"),
            ConditionGuard::Always,
        );
        self.shared.reporter.condition(
            &self.node,
            ConditionSpec::new(
                DRAINED,
                "True",
                "Drained",
                "Every pod that had to go is gone",
            ),
            ConditionGuard::Always,
        );
        // 4. Volumes.
        let staying = claimed_volumes(&self.shared.client, &drain.left_alone()).await?;
        drop(drain);
        if !self.volumes_detached(wake, stop, &staying).await? {
            return Ok(Finished::Stopped);
        }
        // 5. The machine.
        if !self.terminate_instance(wake, stop).await? {
            return Ok(Finished::Stopped);
        }
        // 6. Release the node.
        remove_finalizer(&self.shared.client, &self.node).await?;
        if let Some(deleted) = deleted {
            let seconds = Timestamp::now()
                .duration_since(deleted)
                .as_secs_f64()
                .max(0.0);
            self.shared.metrics.termination_duration.observe(seconds);
        }
        self.shared.reporter.event(EventReport::normal(
            node_reference(&self.node),
            "FinalizerRemoved",
            "Terminate",
            format!("Removed {FINALIZER}: the node is drained and its machine terminated"),
        ));
        Ok(Finished::Released)
    }

    async fn cordon(&self) -> Result<(), StepError> {
        let api: Api<Node> = Api::all(self.shared.client.clone());
        for _ in 0..5 {
            let mut node = api.get(&self.node).await?;
            if cordoned(&node) {
                return Ok(());
            }
            let spec = node.spec.get_or_insert_with(Default::default);
            spec.unschedulable = Some(true);
            let taints = spec.taints.get_or_insert_with(Vec::new);
            if !taints
                .iter()
                .any(|taint| taint.key == DISRUPTED_TAINT && taint.effect == "NoSchedule")
            {
                taints.push(disrupted_taint());
            }
            node.metadata
                .labels
                .get_or_insert_with(Default::default)
                .insert(EXCLUDE_FROM_LOAD_BALANCERS.to_owned(), "true".to_owned());
            match api.replace(&self.node, &PostParams::default(), &node).await {
                Ok(_) => return Ok(()),
                Err(error) if status_code(&error) == Some(409) => {}
                Err(error) => return Err(error.into()),
            }
        }
        Err(StepError::Contended)
    }

    /// Waits for the node's VolumeAttachments to go, except those of pods left on it, for at
    /// most --volume-detach-timeout. Returns false when stopped.
    async fn volumes_detached(
        &mut self,
        wake: &mut watch::Receiver<()>,
        stop: &CancellationToken,
        staying: &HashSet<String>,
    ) -> Result<bool, StepError> {
        let deadline = tokio::time::Instant::now() + self.shared.settings.volume_detach_timeout;
        let mut attachments = self.shared.attachments.clone();
        loop {
            let waiting: Vec<String> = self
                .shared
                .attachments
                .state()
                .iter()
                .filter(|attachment| attachment.spec.node_name == self.node)
                .filter(|attachment| {
                    attachment
                        .spec
                        .source
                        .persistent_volume_name
                        .as_ref()
                        .is_none_or(|volume| !staying.contains(volume))
                })
                .filter_map(|attachment| attachment.metadata.name.clone())
                .collect();
            if waiting.is_empty() {
                return Ok(true);
            }
            if tokio::time::Instant::now() >= deadline {
                self.announce(
                    "volume-timeout",
                    true,
                    "VolumeDetachTimeout",
                    format!(
                        "VolumeAttachments {} still exist after --volume-detach-timeout ({}s); terminating the machine anyway",
                        waiting.join(", "),
                        self.shared.settings.volume_detach_timeout.as_secs()
                    ),
                );
                return Ok(true);
            }
            self.condition(
                "AwaitingVolumeDetachment",
                format!(
                    "VolumeAttachments {} are still attached",
                    waiting.join(", ")
                ),
            );
            tokio::select! {
                () = stop.cancelled() => return Ok(false),
                changed = attachments.changed() => changed.map_err(|_| StepError::WatchEnded)?,
                changed = wake.changed() => if changed.is_err() { return Ok(false) },
                () = tokio::time::sleep_until(deadline) => {}
            }
        }
    }

    /// Asks the provider to terminate the machine unless it is already gone or a request is
    /// in progress, then waits for it to be gone. Returns false when stopped.
    async fn terminate_instance(
        &mut self,
        wake: &mut watch::Receiver<()>,
        stop: &CancellationToken,
    ) -> Result<bool, StepError> {
        let Some(provider) = self.shared.provider.clone() else {
            return Ok(true);
        };
        let mut polls = 0;
        loop {
            let Some(node) = self.current() else {
                return Ok(true);
            };
            let id = match ProviderId::of(&node) {
                Ok(id) => id,
                Err(error) => {
                    self.announce(
                        "no-provider-id",
                        true,
                        "TerminationBlocked",
                        error.to_string(),
                    );
                    self.condition("TerminatingInstance", error.to_string());
                    tokio::select! {
                        () = stop.cancelled() => return Ok(false),
                        changed = wake.changed() => if changed.is_err() { return Ok(false) },
                    }
                    continue;
                }
            };
            let state = provider.state(&id).await;
            match state {
                Ok(InstanceState::Terminated) => {
                    if !self.announced.contains("terminated") {
                        self.shared.metrics.instances_terminated.inc();
                    }
                    self.announce(
                        "terminated",
                        false,
                        "InstanceTerminated",
                        format!("Machine {id} is terminated"),
                    );
                    return Ok(true);
                }
                Ok(_) => {
                    let requested = requested_at(&node);
                    let resend = requested.is_none_or(|at| {
                        Timestamp::now().duration_since(at).unsigned_abs() >= TERMINATE_RESEND
                    });
                    if resend {
                        self.condition("TerminatingInstance", format!("Terminating machine {id}"));
                        match provider.terminate(&id).await {
                            Ok(()) => self.mark_requested().await?,
                            Err(error) => self.provider_failed(&error),
                        }
                    } else {
                        self.condition(
                            "TerminatingInstance",
                            format!("Waiting for machine {id} to be terminated"),
                        );
                    }
                }
                Err(error) => self.provider_failed(&error),
            }
            polls += 1;
            tokio::select! {
                () = stop.cancelled() => return Ok(false),
                () = tokio::time::sleep(PROVIDER_POLL.delay(polls)) => {}
            }
        }
    }

    fn provider_failed(&mut self, error: &InstanceError) {
        self.shared.metrics.error("provider");
        tracing::warn!(node = self.node, error = %error, "instance provider call failed; retrying");
        self.condition(
            "TerminatingInstance",
            format!("The instance provider failed: {error}; retrying"),
        );
        self.announce(
            &format!("provider-error:{error}"),
            true,
            "InstanceTerminationFailed",
            format!("The instance provider failed: {error}; retrying with backoff"),
        );
    }

    async fn mark_requested(&self) -> Result<(), StepError> {
        let api: Api<Node> = Api::all(self.shared.client.clone());
        let patch = serde_json::json!({"metadata": {"annotations": {
            TERMINATE_REQUESTED: Timestamp::now().to_string(),
        }}});
        api.patch(&self.node, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        Ok(())
    }
}

/// Removes our finalizer by an update carrying the resourceVersion read, so a concurrent
/// change of the list (another controller's finalizer) is a 409 and a re-read, never lost.
pub async fn remove_finalizer(client: &kube::Client, node: &str) -> Result<(), StepError> {
    let api: Api<Node> = Api::all(client.clone());
    for _ in 0..5 {
        let mut current = match api.get(node).await {
            Ok(current) => current,
            Err(error) if status_code(&error) == Some(404) => return Ok(()),
            Err(error) => return Err(error.into()),
        };
        let Some(finalizers) = current.metadata.finalizers.as_mut() else {
            return Ok(());
        };
        let before = finalizers.len();
        finalizers.retain(|finalizer| finalizer != FINALIZER);
        if finalizers.len() == before {
            return Ok(());
        }
        match api.replace(node, &PostParams::default(), &current).await {
            Ok(_) => return Ok(()),
            Err(error) if matches!(status_code(&error), Some(404)) => return Ok(()),
            Err(error) if matches!(status_code(&error), Some(409)) => {}
            Err(error) => return Err(error.into()),
        }
    }
    Err(StepError::Contended)
}

/// Deleting, with our finalizer.
pub fn ours(node: &Node) -> bool {
    node.metadata.deletion_timestamp.is_some() && has_finalizer(node)
}

pub fn has_finalizer(node: &Node) -> bool {
    node.metadata
        .finalizers
        .iter()
        .flatten()
        .any(|finalizer| finalizer == FINALIZER)
}

fn cordoned(node: &Node) -> bool {
    let spec = node.spec.as_ref();
    let unschedulable = spec.and_then(|spec| spec.unschedulable) == Some(true);
    let tainted = spec
        .and_then(|spec| spec.taints.as_deref())
        .is_some_and(|taints| {
            taints
                .iter()
                .any(|taint| taint.key == DISRUPTED_TAINT && taint.effect == "NoSchedule")
        });
    let excluded = node
        .metadata
        .labels
        .as_ref()
        .is_some_and(|labels| labels.contains_key(EXCLUDE_FROM_LOAD_BALANCERS));
    unschedulable && tainted && excluded
}

fn requested_at(node: &Node) -> Option<Timestamp> {
    node.metadata
        .annotations
        .as_ref()?
        .get(TERMINATE_REQUESTED)?
        .parse()
        .ok()
}

/// The PersistentVolumes behind the claims of `pods` (the pods the drain leaves on the node,
/// whose attachments stay).
async fn claimed_volumes(
    client: &kube::Client,
    pods: &[Arc<k8s_openapi::api::core::v1::Pod>],
) -> Result<HashSet<String>, StepError> {
    use k8s_openapi::api::core::v1::PersistentVolumeClaim;
    let mut volumes = HashSet::new();
    for pod in pods {
        let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), namespace);
        let names = pod
            .spec
            .iter()
            .flat_map(|spec| spec.volumes.iter().flatten())
            .filter_map(|volume| volume.persistent_volume_claim.as_ref())
            .map(|claim| claim.claim_name.clone());
        for name in names {
            if let Some(claim) = claims.get_opt(&name).await? {
                volumes.extend(claim.spec.and_then(|spec| spec.volume_name));
            }
        }
    }
    Ok(volumes)
}

#[derive(Debug, thiserror::Error)]
pub enum StepError {
    #[error(transparent)]
    Api(#[from] kube::Error),
    #[error("the node kept changing underneath; retrying")]
    Contended,
    #[error("a watch ended")]
    WatchEnded,
}

impl StepError {
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Api(_) => "api",
            Self::Contended => "conflict",
            Self::WatchEnded => "watch",
        }
    }
}
