//! One out-of-service node's cleanup: each pass reads the Node and its heartbeat Lease from the
//! API (never the cache), then force-deletes the pods that do not tolerate the taint, deletes
//! the VolumeAttachments no remaining pod uses, reports, and — with `--auto-untaint` — removes
//! the taint once the node is back and clean; a clean node this controller fenced is handed to
//! the fencer to be powered on again (`--recover-after-cleanup`). Passes are idempotent: a new
//! leader, or a pass after an error, simply does what is still to do.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, Pod, Taint};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use nodegrace_core::k8s::api_errors::{ApiErrorClass, classify_delete, status_code};
use nodegrace_core::k8s::events::{EventReport, object_reference};
use nodegrace_core::k8s::node_identity::{NodeIdentity, Updated};
use nodegrace_core::k8s::nodes::node_reference;
use nodegrace_core::k8s::pods::is_terminal;
use nodegrace_core::k8s::reporter::{ConditionGuard, Reporter};
use nodegrace_core::k8s::volumes::Staying;
use nodegrace_core::k8s::watched::{WatchCounters, Watched};
use serde_json::json;

use crate::api::{EXPECTED_EFFECT, NODE_LEASE_NAMESPACE, OUT_OF_SERVICE_TAINT};
use crate::conditions::Reason;
use crate::fence_mark::{Step, clear_mark, mark};
use crate::fencing::Fencer;
use crate::guard::{Evidence, Heartbeat};
use crate::qualify::{NodeStatus, PodVerdict, node_status, pod_verdict, ready_since};
use crate::shared::{PassError, Shared};
use crate::status::{Phase, after_cleanup, plural};
use nodegrace_core::fresh::Fresh;

const ACTION: &str = "OutOfServiceCleanup";
/// Force actions in flight at once for one node.
const CONCURRENCY: usize = 64;

/// The node as the API has it right now.
#[derive(Debug, Clone)]
struct LiveView {
    node: Option<Arc<Node>>,
    heartbeat: Heartbeat,
}

impl LiveView {
    fn status(&self) -> NodeStatus {
        self.node
            .as_deref()
            .map_or(NodeStatus::InService, node_status)
    }

    /// Whether force actions may go on: out of service, and no recent heartbeat when guarded.
    fn permits_force(&self, guarded: bool) -> bool {
        matches!(self.status(), NodeStatus::OutOfService(_))
            && !(guarded && matches!(self.heartbeat, Heartbeat::Recent { .. }))
    }
}

/// After a pass: stop looking after the node, or wait (for a change of its pods or anything
/// else, or at most this long).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Finished,
    Wait(Option<Duration>),
    /// Nothing is left to do until the node or its attachments change, or a pod is bound to it
    /// anew, which its pod watch need not stay open for (see [`NodeCleanup::close_pods`]): the
    /// node is clean, its last attachments are the attach-detach controller's to remove, or it
    /// is Ready and its taint is the operator's.
    Rest,
}

/// What was said already, so a pass that finds the same state says nothing new.
#[derive(Debug, Default)]
struct Said {
    effect_warned: bool,
    /// The guard is refusing (said once per stretch of refusals).
    refusing: bool,
    started: bool,
    done: bool,
    /// This cleanup saw the node tainted and NotReady: a later Ready means it came back.
    saw_out_of_service: bool,
    /// Pods (by UID) said to be held by another controller's finalizers.
    held: HashSet<String>,
}

#[derive(Debug)]
enum Deleted {
    Yes,
    AlreadyGone,
    /// The live read said the node no longer qualifies.
    Skipped,
}

pub struct NodeCleanup {
    shared: Arc<Shared>,
    /// The Node object this task looks after: a namesake registered under its name is
    /// another task's.
    node: NodeIdentity,
    /// The watch of the node's pods, while one is open.
    pods: Mutex<Option<Watched<Pod>>>,
    /// `--fence-after`: the fencing agent, which also powers a clean fenced node on again.
    fencer: Option<Arc<Fencer>>,
    live: Fresh<LiveView>,
    said: Mutex<Said>,
    /// Pods and VolumeAttachments (by UID) whose deletion the API server accepted: the watches
    /// lag behind our own writes, and each other object's change starts a pass that would
    /// delete them again.
    deleted: Mutex<HashSet<String>>,
}

impl std::fmt::Debug for NodeCleanup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeCleanup")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

/// Only what the decisions read is cached.
fn trim_pod(pod: &mut Pod) {
    pod.metadata.managed_fields = None;
    pod.metadata.annotations = None;
    if let Some(status) = pod.status.as_mut() {
        status.container_statuses = None;
        status.init_container_statuses = None;
        status.conditions = None;
    }
}

impl NodeCleanup {
    /// The cleanup of `node`; its pod watch opens with the first [`Self::pods`].
    pub fn new(shared: Arc<Shared>, node: NodeIdentity, fencer: Option<Arc<Fencer>>) -> Self {
        Self {
            shared,
            node,
            pods: Mutex::default(),
            fencer,
            live: Fresh::default(),
            said: Mutex::default(),
            deleted: Mutex::default(),
        }
    }

    /// The watch of the pods bound to the node (and only those), opened if it is not open.
    pub fn pods(&self) -> Watched<Pod> {
        let mut pods = self.pods.lock().unwrap_or_else(PoisonError::into_inner);
        pods.get_or_insert_with(|| {
            Watched::start_trimmed(
                Api::all(self.shared.client.clone()),
                watcher::Config::default().fields(&format!("spec.nodeName={}", self.node.name())),
                WatchCounters::default(),
                trim_pod,
            )
        })
        .clone()
    }

    /// Closes the pod watch once the caller's clones are gone too. A zone outage leaves
    /// hundreds of nodes clean and tainted for hours: each open watch holds an HTTP/1.1
    /// connection of its own, its buffers grown by the first LIST, about 100 KiB a node.
    /// The deletions the watch has seen through are forgotten with it.
    pub fn close_pods(&self) {
        let Some(pods) = self
            .pods
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        else {
            return;
        };
        let present: HashSet<String> = pods.state().iter().filter_map(|pod| pod.uid()).collect();
        let attachments: HashSet<String> = self
            .attachments()
            .iter()
            .filter_map(|attachment| attachment.uid())
            .collect();
        self.deleted
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|uid| present.contains(uid) || attachments.contains(uid));
    }

    pub fn shared(&self) -> &Shared {
        &self.shared
    }

    fn said(&self) -> std::sync::MutexGuard<'_, Said> {
        self.said.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn reporter(&self) -> &Reporter {
        &self.shared.reporter
    }

    fn report(&self, phase: &Phase) {
        let guard = if *phase == Phase::TaintRemoved {
            // Clearing never adds a condition where this controller never wrote one.
            ConditionGuard::OnlyExisting
        } else {
            ConditionGuard::Always
        };
        self.reporter()
            .condition_of(&self.node, phase.condition(), guard);
    }

    fn node_event(&self, warning: bool, reason: Reason, note: String) {
        let reference = node_reference(self.node.name());
        let event = if warning {
            EventReport::warning(reference, reason.as_str(), ACTION, note)
        } else {
            EventReport::normal(reference, reason.as_str(), ACTION, note)
        };
        self.reporter().event(event);
    }

    /// A read of the Node and its Lease that began after the caller asked.
    async fn read_live(&self) -> Result<LiveView, PassError> {
        self.live
            .get(|| async {
                // A namesake reads as gone: this task's node is.
                let node = self.node.read(&self.shared.client).await.map_err(|error| {
                    PassError::api(format!("read node {}", self.node.name()), error)
                })?;
                let heartbeat = if self.shared.settings.liveness_guard && node.is_some() {
                    self.shared
                        .heartbeats
                        .read(
                            &self.shared.client,
                            self.node.name(),
                            self.shared.settings.guard_window,
                        )
                        .await
                        .map_err(|error| {
                            PassError::api(
                                format!("read lease {NODE_LEASE_NAMESPACE}/{}", self.node.name()),
                                error,
                            )
                        })?
                } else {
                    Heartbeat::Silent
                };
                Ok(LiveView {
                    node: node.map(Arc::new),
                    heartbeat,
                })
            })
            .await
    }

    /// One pass over the node; see the module comment.
    pub async fn pass(&self) -> Result<Outcome, PassError> {
        let view = self.read_live().await?;
        match view.status() {
            NodeStatus::InService => {
                self.shared.taint_clock.forget(self.node.name());
                if let Some(node) = &view.node {
                    self.report(&Phase::TaintRemoved);
                    self.forget_fence(node).await?;
                }
                Ok(Outcome::Finished)
            }
            NodeStatus::TaintedButReady(taint) => self.ready_again(&view, &taint).await,
            NodeStatus::OutOfService(taint) => self.clean(&view, &taint).await,
        }
    }

    async fn clean(&self, view: &LiveView, taint: &Taint) -> Result<Outcome, PassError> {
        self.said().saw_out_of_service = true;
        self.warn_of_effect(taint);
        if self.shared.settings.liveness_guard
            && let Heartbeat::Recent { evidence, left } = view.heartbeat
        {
            return Ok(self.refuse(evidence, left));
        }
        self.said().refusing = false;
        let now = Timestamp::now();
        let since = self.taint_since(view, taint, now);
        let Sorted {
            victims,
            mut staying,
            next_due,
        } = self.sort(taint, since, now);
        self.say_cleaning(taint, victims.len(), self.attachments().len());
        let deleted = self.force_delete_all(victims, taint).await;
        if deleted.skipped {
            // The node changed under us: the next pass starts from what it is now.
            return Ok(Outcome::Wait(Some(Duration::ZERO)));
        }
        // A pod whose deletion failed keeps its volumes in use until it is gone.
        staying.extend(deleted.failed);
        let detach = self.detach_unused(&staying).await;
        if let Some(error) = deleted.first_error {
            return Err(if deleted.progressed {
                PassError::Partial(Box::new(error))
            } else {
                error
            });
        }
        let left = detach?;
        if let Some(due) = next_due {
            self.report(&Phase::Cleaning {
                pods: staying.iter().filter(|pod| !is_terminal(pod)).count(),
                attachments: left,
            });
            let wait =
                Duration::try_from(due.duration_since(Timestamp::now())).unwrap_or(Duration::ZERO);
            return Ok(Outcome::Wait(Some(wait)));
        }
        if left > 0 {
            self.report(&Phase::Cleaning {
                pods: 0,
                attachments: left,
            });
            return Ok(Outcome::Rest);
        }
        self.done(view).await
    }

    /// Once per cleanup: a taint whose effect is not `NoExecute` is cleaned up anyway.
    fn warn_of_effect(&self, taint: &Taint) {
        if taint.effect == EXPECTED_EFFECT
            || std::mem::replace(&mut self.said().effect_warned, true)
        {
            return;
        }
        self.node_event(
            true,
            Reason::OutOfServiceTaintEffect,
            format!(
                "The {OUT_OF_SERVICE_TAINT} taint has effect {}; {EXPECTED_EFFECT} is expected \
                 (it also evicts and keeps new pods off). Cleaning up anyway.",
                taint.effect
            ),
        );
    }

    /// The node's pods by what the taint means for each now.
    fn sort(&self, taint: &Taint, since: Timestamp, now: Timestamp) -> Sorted {
        let mut sorted = Sorted::default();
        for pod in self.pods().state() {
            match pod_verdict(&pod, taint, since, now) {
                PodVerdict::ForceDelete if self.deleted_by_us(pod.uid()) => {}
                PodVerdict::ForceDelete => sorted.victims.push(pod),
                PodVerdict::ForceDeleteAt(due) => {
                    sorted.next_due = Some(sorted.next_due.map_or(due, |next| next.min(due)));
                    sorted.staying.push(pod);
                }
                PodVerdict::Tolerated => sorted.staying.push(pod),
                PodVerdict::Released => self.tell_held(&pod),
            }
        }
        sorted
    }

    /// The condition while pods are to be force-deleted, and the Event when the cleanup
    /// starts. Without pods to delete the pass ends at once and says what is left itself: a
    /// condition here would count every attachment and the end of the pass only those still
    /// to go, and each write of the two wakes the next pass (out-of-service-gc wrote a node
    /// about 200 times in 10 s so, found by invariant 13's count of Node writes).
    fn say_cleaning(&self, taint: &Taint, pods: usize, attachments: usize) {
        if pods == 0 && attachments == 0 {
            return;
        }
        if pods > 0 {
            self.report(&Phase::Cleaning { pods, attachments });
        }
        if std::mem::replace(&mut self.said().started, true) {
            return;
        }
        self.node_event(
            false,
            Reason::OutOfServiceCleanupStarted,
            format!(
                "Node is out of service ({}) and not ready: force-deleting {pods} {} that do not \
                 tolerate the taint and detaching {attachments} {}",
                describe(taint),
                plural(pods, "pod", "pods"),
                plural(attachments, "volume", "volumes"),
            ),
        );
    }

    async fn force_delete_all(&self, victims: Vec<Arc<Pod>>, taint: &Taint) -> ForceDeleted {
        let results: Vec<(Arc<Pod>, Result<Deleted, PassError>)> = futures::stream::iter(victims)
            .map(|pod| async move {
                let result = self.force_delete(&pod, taint).await;
                (pod, result)
            })
            .buffer_unordered(CONCURRENCY)
            .collect()
            .await;
        let mut outcome = ForceDeleted::default();
        for (pod, result) in results {
            match result {
                Ok(Deleted::Yes | Deleted::AlreadyGone) => {
                    self.remember_deleted(pod.uid());
                    outcome.progressed = true;
                }
                Ok(Deleted::Skipped) => outcome.skipped = true,
                Err(error) => {
                    outcome.failed.push(pod);
                    outcome.first_error.get_or_insert(error);
                }
            }
        }
        outcome
    }

    /// Nothing left that must go: said once, and a fenced machine is recovered.
    async fn done(&self, view: &LiveView) -> Result<Outcome, PassError> {
        let auto_untaint = self.shared.settings.auto_untaint;
        self.report(&Phase::Done { auto_untaint });
        if !std::mem::replace(&mut self.said().done, true) {
            self.node_event(
                false,
                Reason::OutOfServiceCleanupDone,
                format!(
                    "No pod that does not tolerate the taint and no volume attachment of one is \
                     left; {}",
                    after_cleanup(auto_untaint)
                ),
            );
        }
        match (&self.fencer, view.node.as_deref()) {
            (Some(fencer), Some(node)) => Ok(fencer
                .recover(&self.shared, &self.node, node)
                .await?
                .map_or(Outcome::Rest, |wait| Outcome::Wait(Some(wait)))),
            _ => Ok(Outcome::Rest),
        }
    }

    /// What is left from before the node turned Ready (at `ready`): the pods that have to go
    /// and were bound before, and the attachments of before that no pod on the node now keeps
    /// — judged by the rule that decided during the cleanup what stays (`Staying`), so the
    /// volume of a pod that tolerates the taint is not waited for: it was never to go.
    async fn left_from_before(
        &self,
        view: &LiveView,
        taint: &Taint,
        ready: Option<Timestamp>,
    ) -> Result<(usize, usize), PassError> {
        let before = |created: Option<&Time>| match (created, ready) {
            (Some(created), Some(ready)) => created.0 <= ready,
            _ => true,
        };
        let now = Timestamp::now();
        let since = self.taint_since(view, taint, now);
        // A pod already released (force-deleted, finished, kept only by another's finalizer)
        // is done with, as the cleanup counted it: it holds the taint no more than it held
        // the cleanup.
        let (left, staying): (Vec<Arc<Pod>>, Vec<Arc<Pod>>) =
            self.pods().state().into_iter().partition(|pod| {
                matches!(
                    pod_verdict(pod, taint, since, now),
                    PodVerdict::ForceDelete | PodVerdict::ForceDeleteAt(_)
                ) && before(pod.metadata.creation_timestamp.as_ref())
            });
        let attachments = self.attachments();
        if attachments.is_empty() {
            return Ok((left.len(), 0));
        }
        let unfinished: Vec<Arc<Pod>> = staying
            .into_iter()
            .filter(|pod| !is_terminal(pod))
            .collect();
        let in_use = Staying::of(&self.shared.client, &unfinished)
            .await
            .map_err(|error| PassError::api("read the claims of the pods that stay", error))?;
        let attachments_left = attachments
            .iter()
            .filter(|va| before(va.metadata.creation_timestamp.as_ref()) && !in_use.keeps(va))
            .count();
        Ok((left.len(), attachments_left))
    }

    /// The taint went by someone else's hand (an operator's, without `--auto-untaint`): the
    /// fence it stood for is over, and no longer counts against `--max-fenced`. A fence still
    /// under way has no taint yet and is left to the fencer.
    async fn forget_fence(&self, node: &Node) -> Result<(), PassError> {
        if mark(node).is_none_or(|found| found.step == Step::Fencing) {
            return Ok(());
        }
        self.node
            .update(&self.shared.client, |current| {
                let over = matches!(node_status(current), NodeStatus::InService)
                    && mark(current).is_some_and(|found| found.step != Step::Fencing);
                over && clear_mark(current)
            })
            .await
            .map_err(|error| {
                PassError::update(
                    format!("clear the fence of node {}", self.node.name()),
                    error,
                )
            })?;
        Ok(())
    }

    /// Since when `taint` counts on the node as `view` read it.
    fn taint_since(&self, view: &LiveView, taint: &Taint, now: Timestamp) -> Timestamp {
        view.node
            .as_deref()
            .map_or(now, |node| self.shared.taint_clock.since(node, taint, now))
    }

    fn refuse(&self, evidence: Evidence, left: Duration) -> Outcome {
        let now = Timestamp::now();
        let until = now.checked_add(left).unwrap_or(Timestamp::MAX);
        let why = evidence.explain(now);
        let message = format!(
            "Not force-deleting or detaching anything before {}: {why} (or set \
             --liveness-guard=false).",
            until.round(jiff::Unit::Second).unwrap_or(until)
        );
        if !std::mem::replace(&mut self.said().refusing, true) {
            self.shared.metrics.refusals.inc();
            tracing::warn!(node = %self.node.name(), ?evidence, %until, "cleanup refused: the node may still be alive");
            self.node_event(true, Reason::OutOfServiceCleanupRefused, message.clone());
        }
        self.report(&Phase::Refused(message));
        Outcome::Wait(Some(left))
    }

    /// The node's VolumeAttachments, from the cache.
    fn attachments(&self) -> Vec<Arc<VolumeAttachment>> {
        self.shared
            .attachments
            .state()
            .into_iter()
            .filter(|va| va.spec.node_name == self.node.name())
            .collect()
    }

    /// Status patch, then delete, of one pod, each behind a fresh read of the node.
    async fn force_delete(&self, pod: &Pod, taint: &Taint) -> Result<Deleted, PassError> {
        let (namespace, name) = (pod.namespace().unwrap_or_default(), pod.name_any());
        let uid = pod.uid().unwrap_or_default();
        if !self
            .read_live()
            .await?
            .permits_force(self.shared.settings.liveness_guard)
        {
            self.shared.metrics.stale_skips.inc();
            tracing::info!(node = %self.node.name(), pod = %format!("{namespace}/{name}"), %uid, "not force-deleting: the node no longer qualifies");
            return Ok(Deleted::Skipped);
        }
        let pods: Api<Pod> = Api::namespaced(self.shared.client.clone(), &namespace);
        let what = |verb: &str| format!("{verb} pod {namespace}/{name}");
        if !is_terminal(pod) {
            let message = format!(
                "nodegrace out-of-service-gc: node {} is out of service ({}) and not ready",
                self.node.name(),
                describe(taint)
            );
            // The uid makes the patch fail rather than mark a namesake that replaced the pod.
            let patch = json!({
                "metadata": {"uid": uid},
                "status": {
                    "phase": "Failed",
                    "conditions": [{
                        "type": "DisruptionTarget",
                        "status": "True",
                        "reason": Reason::DeletionByOutOfServiceGC.as_str(),
                        "message": message,
                        "lastTransitionTime": Timestamp::now().to_string(),
                    }],
                },
            });
            if let Err(error) = pods
                .patch_status(&name, &PatchParams::default(), &Patch::Strategic(patch))
                .await
            {
                match status_code(&error) {
                    Some(404) => return Ok(Deleted::AlreadyGone),
                    // 422 on the uid: a namesake stands there now; ours is gone.
                    Some(409 | 422) if !self.still_there(&pods, &name, &uid).await? => {
                        return Ok(Deleted::AlreadyGone);
                    }
                    _ => return Err(PassError::api(what("mark failed"), error)),
                }
            }
        }
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: Some(uid.clone()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match pods.delete(&name, &params).await {
            Ok(_) => {
                self.shared.metrics.pods_force_deleted.inc();
                tracing::info!(node = %self.node.name(), pod = %format!("{namespace}/{name}"), %uid, "force-deleted");
                self.reporter().event(EventReport::warning(
                    object_reference(pod),
                    Reason::ForceDeleted.as_str(),
                    ACTION,
                    format!(
                        "Force-deleted: node {} is out of service ({}) and not ready, so its \
                         kubelet cannot finish the pod",
                        self.node.name(),
                        describe(taint)
                    ),
                ));
                Ok(Deleted::Yes)
            }
            Err(error) if classify_delete(&error) == ApiErrorClass::Gone => {
                Ok(Deleted::AlreadyGone)
            }
            Err(error) => Err(PassError::api(what("delete"), error)),
        }
    }

    fn deleted_by_us(&self, uid: Option<String>) -> bool {
        uid.is_some_and(|uid| {
            self.deleted
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .contains(&uid)
        })
    }

    fn remember_deleted(&self, uid: Option<String>) {
        if let Some(uid) = uid {
            self.deleted
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(uid);
        }
    }

    /// Says once per pod that its object outlives its forced deletion, and whose finalizers
    /// keep it: deleting it again would change nothing (a pass per change would loop).
    fn tell_held(&self, pod: &Pod) {
        if !self.said().held.insert(pod.uid().unwrap_or_default()) {
            return;
        }
        let finalizers = pod.finalizers().join(", ");
        tracing::info!(node = %self.node.name(), pod = %format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any()), %finalizers, "force-deleted, held by finalizers");
        self.reporter().event(EventReport::normal(
            object_reference(pod),
            Reason::ForceDeletedHeldByFinalizers.as_str(),
            ACTION,
            format!(
                "Force-deleted and marked Failed; the object stays until its finalizers \
                 ({finalizers}) are removed by whoever set them. No kubelet runs it, so its \
                 volumes are detached."
            ),
        ));
    }

    async fn still_there(&self, pods: &Api<Pod>, name: &str, uid: &str) -> Result<bool, PassError> {
        let current = pods
            .get_opt(name)
            .await
            .map_err(|error| PassError::api(format!("read pod {name}"), error))?;
        Ok(current.is_some_and(|pod| pod.uid().as_deref() == Some(uid)))
    }

    /// Deletes the node's VolumeAttachments whose volume no staying pod uses; returns how many
    /// of those still exist (detaching ones included). An attachment a staying pod keeps is not
    /// left to do: it stays, by the same rule that kept it.
    async fn detach_unused(&self, staying: &[Arc<Pod>]) -> Result<usize, PassError> {
        let attachments = self.attachments();
        if attachments.is_empty() {
            return Ok(0);
        }
        let unfinished: Vec<Arc<Pod>> = staying
            .iter()
            .filter(|pod| !is_terminal(pod))
            .cloned()
            .collect();
        let in_use = Staying::of(&self.shared.client, &unfinished)
            .await
            .map_err(|error| PassError::api("read the claims of the pods that stay", error))?;
        let api: Api<VolumeAttachment> = Api::all(self.shared.client.clone());
        let mut gone = 0;
        let mut kept = 0;
        for attachment in &attachments {
            if attachment.metadata.deletion_timestamp.is_some()
                || self.deleted_by_us(attachment.uid())
            {
                continue;
            }
            let volume = attachment.spec.source.persistent_volume_name.clone();
            if in_use.keeps(attachment) {
                kept += 1;
                continue;
            }
            if !self
                .read_live()
                .await?
                .permits_force(self.shared.settings.liveness_guard)
            {
                self.shared.metrics.stale_skips.inc();
                return Ok(attachments.len() - gone - kept);
            }
            let name = attachment.name_any();
            let params = DeleteParams {
                preconditions: attachment.uid().map(|uid| Preconditions {
                    uid: Some(uid),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            match api.delete(&name, &params).await {
                Ok(_) => {
                    self.remember_deleted(attachment.uid());
                    self.shared.metrics.volumes_force_detached.inc();
                    tracing::info!(node = %self.node.name(), attachment = %name, volume = ?volume, "force-detached");
                    self.node_event(
                        false,
                        Reason::VolumeForceDetached,
                        format!(
                            "Deleted VolumeAttachment {name} (volume {}): no pod on this \
                             out-of-service node uses it",
                            volume.as_deref().unwrap_or("inline")
                        ),
                    );
                }
                Err(error) if classify_delete(&error) == ApiErrorClass::Gone => {
                    self.remember_deleted(attachment.uid());
                    gone += 1;
                }
                Err(error) => {
                    return Err(PassError::api(
                        format!("delete VolumeAttachment {name}"),
                        error,
                    ));
                }
            }
        }
        Ok(attachments.len() - gone - kept)
    }

    /// The node is tainted and Ready: nothing is forced. With `--auto-untaint`, the taint goes
    /// once the node came back (it was seen out of service, or turned Ready after the taint was
    /// added) and nothing from before is left.
    async fn ready_again(&self, view: &LiveView, taint: &Taint) -> Result<Outcome, PassError> {
        let Some(node) = view.node.as_deref() else {
            return Ok(Outcome::Finished);
        };
        if !self.shared.settings.auto_untaint {
            self.report(&Phase::Pending(
                "The node is Ready: nothing is force-deleted from a Ready node. Remove the \
                 out-of-service taint once it is clean."
                    .to_owned(),
            ));
            return Ok(Outcome::Rest);
        }
        let since = ready_since(node);
        // Seen down by this cleanup, or Ready since after the taint (times have whole seconds:
        // a node back within the second it was tainted needs the first), or powered on by a
        // recovery, which only a node seen down and cleaned gets. The last is written on the
        // Node, so it outlives this worker: a kubelet whose final Ready landed just after the
        // fence keeps that transition time through the power-on, and a new leader never saw
        // the node down.
        let recovering = mark(node).is_some_and(|found| found.step == Step::Recovering);
        let came_back = self.said().saw_out_of_service
            || recovering
            || matches!((&taint.time_added, since), (Some(added), Some(since)) if since > added.0);
        if !came_back {
            self.report(&Phase::Pending(
                "The node is Ready and has not been seen down since the taint was added; the \
                 taint stays until an operator removes it."
                    .to_owned(),
            ));
            return Ok(Outcome::Rest);
        }
        let (pods_left, attachments_left) = self.left_from_before(view, taint, since).await?;
        if pods_left > 0 || attachments_left > 0 {
            self.report(&Phase::Pending(format!(
                "The node is Ready again; waiting for {pods_left} {} and {attachments_left} \
                 volume {} from before to go before removing the taint",
                plural(pods_left, "pod", "pods"),
                plural(attachments_left, "attachment", "attachments"),
            )));
            return Ok(Outcome::Wait(None));
        }
        // Decided on the version being written: still Ready, still tainted (and the update
        // writes this very Node, never a namesake).
        let fence = mark(node);
        let removed = self
            .node
            .update(&self.shared.client, |current| {
                if !matches!(node_status(current), NodeStatus::TaintedButReady(_)) {
                    return false;
                }
                if let Some(spec) = current.spec.as_mut() {
                    let taints = spec.taints.take().unwrap_or_default();
                    let kept: Vec<Taint> = taints
                        .into_iter()
                        .filter(|t| t.key != OUT_OF_SERVICE_TAINT)
                        .collect();
                    spec.taints = (!kept.is_empty()).then_some(kept);
                }
                // A fence confirmed the outage that ends here; the next one needs its own.
                clear_mark(current);
                true
            })
            .await
            .map_err(|error| {
                PassError::update(
                    format!("remove the taint from node {}", self.node.name()),
                    error,
                )
            })?;
        if !matches!(removed, Updated::Written(_)) {
            return Ok(Outcome::Wait(Some(Duration::ZERO)));
        }
        self.shared.metrics.taints_removed.inc();
        tracing::info!(node = %self.node.name(), "out-of-service taint removed");
        self.node_event(
            false,
            Reason::OutOfServiceTaintRemoved,
            format!(
                "Removed the out-of-service taint ({}): the node is Ready again and nothing \
                 bound to it before is left",
                describe(taint)
            ),
        );
        self.report(&Phase::TaintRemoved);
        if let (Some(fencer), Some(fence)) = (&self.fencer, fence) {
            fencer.recovered(&self.shared, &self.node, fence);
        }
        Ok(Outcome::Finished)
    }
}

/// The node's pods, sorted by a pass.
#[derive(Default)]
struct Sorted {
    victims: Vec<Arc<Pod>>,
    staying: Vec<Arc<Pod>>,
    /// When the first `tolerationSeconds` runs out.
    next_due: Option<Timestamp>,
}

/// What the force-deletions of a pass came to.
#[derive(Default)]
struct ForceDeleted {
    progressed: bool,
    /// The node changed under a deletion: it was not sent.
    skipped: bool,
    /// The pods whose deletion failed.
    failed: Vec<Arc<Pod>>,
    first_error: Option<PassError>,
}

fn describe(taint: &Taint) -> String {
    match taint.value.as_deref() {
        Some(value) if !value.is_empty() => format!("{}={value}:{}", taint.key, taint.effect),
        _ => format!("{}:{}", taint.key, taint.effect),
    }
}
