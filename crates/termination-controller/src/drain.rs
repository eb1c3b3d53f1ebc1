//! Draining one node: tier by tier, each PodDisruptionBudget's pods through their queue, woken
//! by the node's pods (listed once, then watched from that list while the drain waits:
//! [`crate::node_pods`]), the budgets' status, the answers and the queues' timers.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, EvictParams, PostParams, Preconditions};
use nodegrace_core::k8s::api_errors::status_code;
use nodegrace_core::k8s::cached_node::CachedNode;
use nodegrace_core::k8s::events::{EventReport, object_reference};
use nodegrace_core::k8s::node_identity::NodeIdentity;
use nodegrace_core::k8s::nodes::node_reference;
use nodegrace_core::k8s::selectors::pdbs_for_pod;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::drain_rules::{NO_LABELS, NodeRules, Source};
use crate::explain::{budget_blocks, grouped};
use crate::handover::{Asked, Holder};
use crate::metrics::{CodeLabel, ReasonLabel};
use crate::node_pods::NodePods;
use crate::queues::{BudgetView, Outcome, Queue, QueueKey};
use crate::shared::Shared;
use crate::step::{Halt, Step};
use crate::tiers::{Disposition, Skip, Tier, disposition};
use crate::turns::Wake;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::lifecycle::v1alpha1::{Eviction, EvictionRequest};

/// The kubelet's default when a pod names no grace period.
const DEFAULT_GRACE: Duration = Duration::from_secs(30);
/// The shortest grace a deadline deletion gives.
const MIN_GRACE: Duration = Duration::from_secs(1);

/// What the drain is waiting for, for the node's `Terminating` condition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Waiting {
    DoNotEvict(String),
    Pods {
        tier: Tier,
        message: String,
    },
    /// Pods a NodeDrainRule (or their own label) says to wait for: never evicted.
    Completion(String),
}

/// Where in its tier a pod goes: by its drain rule's order, and pods waited for at the end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Group {
    Order(i32),
    Completion,
}

fn trim_pod(pod: &mut Pod) {
    pod.metadata.managed_fields = None;
    if let Some(status) = pod.status.as_mut() {
        status.container_statuses = None;
        status.init_container_statuses = None;
        status.conditions = None;
    }
    if let Some(spec) = pod.spec.as_mut() {
        spec.containers.clear();
        spec.init_containers = None;
    }
}

fn pod_name(pod: &Pod) -> String {
    pod.metadata.name.clone().unwrap_or_default()
}

fn pod_key(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

fn uid(pod: &Pod) -> String {
    pod.metadata.uid.clone().unwrap_or_default()
}

fn grace(pod: &Pod) -> Duration {
    pod.spec
        .as_ref()
        .and_then(|spec| spec.termination_grace_period_seconds)
        .map_or(DEFAULT_GRACE, |seconds| {
            Duration::from_secs(seconds.max(0).unsigned_abs())
        })
}

struct Answer {
    key: QueueKey,
    pod: Arc<Pod>,
    outcome: Outcome,
    /// The pod was handed to its eviction responders (an EvictionRequest), not evicted.
    handed: bool,
}

/// One node's drain.
pub struct Drain {
    shared: Arc<Shared>,
    node: NodeIdentity,
    deadline: Option<Timestamp>,
    /// Boxed: a drain started before the cordon waits in its task's state.
    pods: Box<NodePods>,
    /// The node's pods were listed this many times before the cordon ([`Drain::confirm`]).
    lists_before_cordon: u32,
    /// Pods (by UID) seen before a fresh read found the node still this Node object: they
    /// were bound to it, not to a namesake (a pod is bound only to a node that exists, and
    /// names are unique, so a pod of a namesake seen before the read means the read finds
    /// the namesake).
    confirmed: HashSet<String>,
    queues: HashMap<QueueKey, Queue>,
    evicted: HashSet<String>,
    /// Pods (by UID) this drain handed to their eviction responders (an EvictionRequest).
    requested: HashSet<String>,
    /// Our EvictionRequests (by name) being closed, and the responders (pod UID, name) whose
    /// missed heartbeat was told.
    closing: HashSet<String>,
    passed_over: HashSet<(String, String)>,
    deleted_at_deadline: HashSet<String>,
    left_announced: HashSet<String>,
    requests: JoinSet<Answer>,
    /// Deadline deletions: owned here, so a drain that stops (leadership lost) stops them too.
    deletions: JoinSet<()>,
    /// Tiers (and orders within them) whose evictions began, each announced once.
    started_tiers: HashSet<(Tier, i32)>,
}

impl Drop for Drain {
    fn drop(&mut self) {
        self.shared
            .metrics
            .queue_depth
            .set(self.node.uid(), HashMap::new());
    }
}

impl std::fmt::Debug for Drain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Drain")
            .field("node", &self.node)
            .field("evicted", &self.evicted.len())
            .finish_non_exhaustive()
    }
}

impl Drain {
    /// The drain of `node`, whose pods are read when it first needs them; `deleted` is when
    /// the node's deletion was asked.
    pub fn start(shared: Arc<Shared>, node: NodeIdentity, deleted: Option<Timestamp>) -> Self {
        let pods = Box::new(NodePods::new(
            Api::all(shared.client.clone()),
            node.name(),
            trim_pod,
        ));
        let deadline = shared
            .settings
            .drain_timeout
            .zip(deleted)
            .and_then(|(timeout, deleted)| {
                deleted
                    .checked_add(jiff::SignedDuration::try_from(timeout).ok()?)
                    .ok()
            });
        Self {
            shared,
            node,
            deadline,
            pods,
            lists_before_cordon: 0,
            confirmed: HashSet::new(),
            queues: HashMap::new(),
            evicted: HashSet::new(),
            requested: HashSet::new(),
            closing: HashSet::new(),
            passed_over: HashSet::new(),
            deleted_at_deadline: HashSet::new(),
            left_announced: HashSet::new(),
            requests: JoinSet::new(),
            deletions: JoinSet::new(),
            started_tiers: HashSet::new(),
        }
    }

    /// What the drain did, in a few words for the Event that releases the node.
    pub fn summary(&self) -> String {
        let mut said = if self.shared.handover.is_some() {
            format!(
                "drained: {} pod(s) handed to their eviction responders",
                self.requested.len()
            )
        } else {
            format!("drained: {} pod(s) evicted", self.evicted.len())
        };
        let deleted = self.deleted_at_deadline.len();
        if deleted > 0 {
            said = format!("{said}, {deleted} deleted at --drain-timeout");
        }
        said
    }

    /// Pods the drain leaves on the node (skipped ones, and those stuck terminating); their
    /// volumes may stay attached.
    pub fn left_alone(&self) -> Vec<Arc<Pod>> {
        let now = Timestamp::now();
        let stuck_after = self.shared.settings.stuck_terminating_after;
        let rules = self.rules();
        self.pods
            .state()
            .into_iter()
            .filter(|pod| {
                let rule = self.shared.drain_rule(&rules, pod);
                matches!(disposition(pod, now, &rule), Disposition::Skip(_))
                    || stuck_terminating(pod, stuck_after, now) == Stuck::Since
            })
            .collect()
    }

    /// Lists the node's pods; returns their UIDs, for [`Drain::confirm`].
    pub async fn listed(&mut self) -> Step<Vec<String>> {
        self.pods.listed().await?;
        Ok(self.pods.state().iter().map(|pod| uid(pod)).collect())
    }

    /// Pods (by UID) a fresh read of the node that began after they were listed found bound
    /// to this Node object: the cordon's read serves, and the drain needs no read of its own.
    pub fn confirm(&mut self, listed: Vec<String>) {
        self.confirmed.extend(listed);
        self.lists_before_cordon = self.pods.lists();
    }

    /// Whether the pods seen include every pod bound before the cordon. A list from before
    /// it may lack one bound just before it, which its watch (started only when the drain
    /// first waits) has not delivered yet. A list after the cordon has them, and so does a
    /// watch that delivered what this drain did after it (an eviction, a deletion): a watch
    /// delivers in order.
    fn seen_past_cordon(&self) -> bool {
        self.pods.lists() > self.lists_before_cordon
            || !self.evicted.is_empty()
            || !self.requested.is_empty()
            || !self.deleted_at_deadline.is_empty()
    }

    /// The node's pods as the cache holds them now, each confirmed by a fresh read to be bound
    /// to this Node object; [`Halt::NodeGone`] when the node is gone or replaced. The drain acts on this
    /// snapshot only: a pod the watch delivers after it waits for the next confirmation.
    async fn confirmed_pods(&mut self) -> Step<Vec<Arc<Pod>>> {
        self.pods.catch_up();
        let pods = self.pods.state();
        if pods.iter().any(|pod| !self.confirmed.contains(&uid(pod))) {
            self.node
                .read::<CachedNode>(&self.shared.client)
                .await?
                .ok_or(Halt::NodeGone)?;
            self.confirmed.extend(pods.iter().map(|pod| uid(pod)));
        }
        Ok(pods)
    }

    /// Drains until every pod that must go is gone (`Ok`). `report` hears what it waits for.
    /// The node (by UID) gone or replaced ends it with [`Halt::NodeGone`]: the pods watched by
    /// name may be the namesake's now, so nothing more is sent.
    pub async fn run(
        &mut self,
        wake: &mut Wake<'_>,
        stop: &CancellationToken,
        mut report: impl FnMut(&Waiting),
    ) -> Step {
        tokio::select! {
            () = stop.cancelled() => return Err(Halt::Stopped),
            listed = self.pods.listed() => listed?,
        }
        loop {
            self.node.cached(&self.shared.nodes).ok_or(Halt::NodeGone)?;
            let pods = self.confirmed_pods().await?;
            if stop.is_cancelled() {
                return Err(Halt::Stopped);
            }
            let next_timer = match self.look(pods) {
                Look::Done if self.seen_past_cordon() => {
                    self.close_requests(|_| true).await;
                    return Ok(());
                }
                Look::Done => {
                    self.pods.list().await?;
                    continue;
                }
                Look::Wait { waiting, timer } => {
                    report(&waiting);
                    timer
                }
            };
            let sleep = nodegrace_core::timers::sleep_until_or_forever(next_timer);
            tokio::select! {
                () = stop.cancelled() => return Err(Halt::Stopped),
                changed = wake.changed() => if changed.is_err() { return Err(Halt::Stopped) },
                () = self.pods.changed() => {}
                Some(answer) = self.requests.join_next() => {
                    if let Ok(answer) = answer {
                        self.answered(answer);
                    }
                }
                Some(_) = self.deletions.join_next() => {}
                () = sleep => {}
            }
        }
    }

    /// The NodeDrainRules that apply on this node, by its labels as cached.
    fn rules(&self) -> NodeRules {
        let node = self.node.cached(&self.shared.nodes);
        let labels = node
            .as_ref()
            .and_then(|node| node.metadata.labels.as_ref())
            .unwrap_or(&NO_LABELS);
        NodeRules::for_node(&self.shared.drain_rules.state(), labels)
    }

    /// One look at the node's pods: sorted into tiers, the deadline's deletions made, then
    /// either a wait (do-not-evict pods, pods waited for) or the first tier's evictions sent.
    fn look(&mut self, pods: Vec<Arc<Pod>>) -> Look {
        let now = Instant::now();
        let wall = Timestamp::now();
        let present: HashSet<String> = pods.iter().map(|pod| uid(pod)).collect();
        let mut sorted = self.classify(pods, now, wall);
        let protected: HashSet<String> = sorted.protected.iter().map(|(pod, _)| uid(pod)).collect();
        self.close_unneeded(&present, &protected);
        if let Some(deadline) = self.deadline {
            let remaining = sorted
                .protected
                .iter()
                .map(|(pod, _)| pod)
                .chain(sorted.tiers.values().flatten());
            if let Some(next) =
                self.delete_at_deadline(remaining.cloned().collect(), deadline, wall)
            {
                sorted.timers.push(now + next);
            }
        }
        if let Some(wait) = sorted.wait(now, wall) {
            return wait;
        }
        // Past the wait, the first group is one to evict, if any is left.
        let Some((&(tier, Group::Order(order)), pods)) = sorted.tiers.iter().next() else {
            return Look::Done;
        };
        self.announce_tier(tier, order, pods, &sorted.sources);
        let left = sorted.tiers.values().map(Vec::len).sum::<usize>();
        let mut message = format!("{left} pod(s) left, draining {}", tier.label());
        let held = self.dispatch(pods, now, &mut sorted.timers);
        if !held.is_empty() {
            message.push('\n');
            message.push_str(&held);
        }
        Look::Wait {
            waiting: Waiting::Pods { tier, message },
            timer: sorted.timers.into_iter().min(),
        }
    }

    /// Sorts the node's pods: into tiers (by their drain rule's order, pods waited for at the
    /// end), do-not-evict pods apart, pods left alone out (announced once when they stay
    /// terminating); with the moments some pod's standing changes.
    fn classify(&mut self, pods: Vec<Arc<Pod>>, now: Instant, wall: Timestamp) -> Sorted {
        let rules = self.rules();
        let stuck_after = self.shared.settings.stuck_terminating_after;
        let mut sorted = Sorted::default();
        for pod in pods {
            match stuck_terminating(&pod, stuck_after, wall) {
                Stuck::Since => {
                    let since = pod
                        .metadata
                        .deletion_timestamp
                        .as_ref()
                        .map(|time| time.0.to_string())
                        .unwrap_or_default();
                    self.announce_left(
                        &pod,
                        &format!(
                            "it has been terminating since {since}, more than {}s \
                             (--stuck-terminating-after) past its deletion time",
                            stuck_after.as_secs()
                        ),
                    );
                    continue;
                }
                Stuck::From(at) => {
                    let wait = Duration::try_from(at.duration_since(wall)).unwrap_or_default();
                    sorted.timers.push(now + wait);
                }
                Stuck::No => {}
            }
            let rule = self.shared.drain_rule(&rules, &pod);
            let group = match disposition(&pod, wall, &rule) {
                Disposition::Skip(Skip::Terminal) if pod.metadata.deletion_timestamp.is_some() => {
                    // A pod this drain evicted has finished as it should: without finalizers
                    // its object only waits for the kubelet's last word, nothing to tell.
                    let held = pod
                        .metadata
                        .finalizers
                        .as_ref()
                        .is_some_and(|f| !f.is_empty());
                    let ours =
                        self.evicted.contains(&uid(&pod)) || self.requested.contains(&uid(&pod));
                    if held || !ours {
                        self.announce_left(&pod, "it has finished");
                    }
                    continue;
                }
                Disposition::Skip(_) => continue,
                Disposition::DoNotEvict { until } => {
                    sorted.protected.push((pod, until));
                    continue;
                }
                Disposition::WaitCompleted(tier) => (tier, Group::Completion),
                Disposition::Evict { tier, order } => (tier, Group::Order(order)),
            };
            sorted.sources.insert(uid(&pod), rule.source);
            sorted.tiers.entry(group).or_default().push(pod);
        }
        sorted
    }

    /// An Event when a tier (an order within it) begins its evictions.
    fn announce_tier(
        &mut self,
        tier: Tier,
        order: i32,
        pods: &[Arc<Pod>],
        sources: &HashMap<String, Source>,
    ) {
        if !self.started_tiers.insert((tier, order)) {
            return;
        }
        let mut rules: Vec<String> = pods
            .iter()
            .filter_map(|pod| sources.get(&uid(pod)))
            .filter(|source| **source != Source::Default)
            .map(ToString::to_string)
            .collect();
        rules.sort();
        rules.dedup();
        // A drain of one tier in the default order says nothing an operator needs: the
        // node's condition shows it, and its Event would cost every node of a rollout a
        // request. Orders by rule and later tiers are told.
        if self.started_tiers.len() == 1 && rules.is_empty() {
            return;
        }
        let by = if rules.is_empty() {
            String::new()
        } else {
            format!(" (order {order}: {})", rules.join(", "))
        };
        self.shared.reporter.event(EventReport::normal(
            node_reference(self.node.name()),
            "DrainingTier",
            "Drain",
            format!("Evicting {} {}{by}", pods.len(), tier.label()),
        ));
    }

    /// Sends what each of the tier's queues may send now (one eviction per PodDisruptionBudget
    /// queue, pods no budget covers up to --eviction-concurrency), and adds when the others
    /// wake to `timers`. Returns what holds the tier's pods, grouped.
    fn dispatch(&mut self, pods: &[Arc<Pod>], now: Instant, timers: &mut Vec<Instant>) -> String {
        let budgets = self.shared.pdbs.state();
        let mut pending: BTreeMap<QueueKey, Vec<Arc<Pod>>> = BTreeMap::new();
        let mut leaving: Vec<(String, String)> = Vec::new();
        // Pods with their responders: each holds its queue until it leaves.
        let mut handed: Vec<(String, String)> = Vec::new();
        let mut busy: HashSet<QueueKey> = HashSet::new();
        for pod in pods {
            if pod.metadata.deletion_timestamp.is_some() || self.evicted.contains(&uid(pod)) {
                // Who let it go, for the Warnings of the responders passed over on the way.
                self.holder(pod);
                leaving.push((pod_name(pod), "terminating".to_owned()));
                continue;
            }
            let covering = pdbs_for_pod(pod, budgets.iter().map(AsRef::as_ref));
            let key = QueueKey::of(pod, &covering);
            if let Some(mut holder) = self.holder(pod) {
                // The default evictor refused by a budget: say which budget, and why.
                if holder.contains(crate::handover::EVICTOR_REFUSED)
                    && let [pdb] = covering.as_slice()
                {
                    holder = format!("{holder}; {}", budget_blocks(pdb));
                }
                handed.push((pod_name(pod), holder));
                busy.insert(key);
                continue;
            }
            pending.entry(key).or_default().push(Arc::clone(pod));
        }
        let mut depth: HashMap<String, i64> = HashMap::new();
        let unbudgeted_in_flight = self
            .queues
            .iter()
            .filter(|(key, queue)| matches!(key, QueueKey::Unbudgeted { .. }) && queue.in_flight())
            .count()
            + busy
                .iter()
                .filter(|key| matches!(key, QueueKey::Unbudgeted { .. }))
                .count();
        let mut unbudgeted_slots = self
            .shared
            .settings
            .eviction_concurrency
            .saturating_sub(unbudgeted_in_flight);
        let mut blocked: Vec<(String, String)> = Vec::new();
        for (key, mut waiting) in pending {
            *depth.entry(key.label()).or_default() += waiting.len() as i64;
            waiting.sort_by_key(|pod| pod_name(pod));
            let budget = key
                .budget()
                .and_then(|(namespace, name)| self.shared.pdbs.get(Some(namespace), name));
            let view = budget.as_deref().map(BudgetView::of);
            let queue = self.queues.entry(key.clone()).or_default();
            let unbudgeted = matches!(key, QueueKey::Unbudgeted { .. });
            if busy.contains(&key) {
                // One pod of a budget with its responders at a time; its leaving wakes us.
            } else if queue.due(now, view.as_ref()) && (!unbudgeted || unbudgeted_slots > 0) {
                if unbudgeted {
                    unbudgeted_slots -= 1;
                }
                queue.sent();
                let pod = Arc::clone(&waiting[0]);
                let shared = Arc::clone(&self.shared);
                let key = key.clone();
                let node = (self.node.name().to_owned(), self.node.uid().to_owned());
                self.requests.spawn(async move {
                    let handed = shared.handover.is_some();
                    let outcome = if handed {
                        hand_over(&shared, &node, &pod).await
                    } else {
                        evict(&shared, &pod).await
                    };
                    Answer {
                        key,
                        pod,
                        outcome,
                        handed,
                    }
                });
            } else if let Some(at) = queue.wakes_at() {
                timers.push(at);
            }
            if queue.refusals() > 0
                || matches!(key, QueueKey::Budget { ref names, .. } if names.len() > 1)
            {
                let why = match (&key, budget.as_deref()) {
                    (QueueKey::Budget { names, .. }, _) if names.len() > 1 => format!(
                        "PDBs {} all cover it; the Eviction API refuses a pod with more than one budget",
                        names.join(", ")
                    ),
                    (_, Some(pdb)) => budget_blocks(pdb),
                    _ => "eviction refused; retrying".to_owned(),
                };
                blocked.extend(waiting.iter().map(|pod| (pod_name(pod), why.clone())));
            }
        }
        self.shared.metrics.queue_depth.set(self.node.uid(), depth);
        grouped(blocked.into_iter().chain(handed).chain(leaving))
    }

    /// Who holds `pod`, when the drain handed it to its eviction responders; a Warning, once,
    /// for each responder passed over for a missed heartbeat.
    fn holder(&mut self, pod: &Pod) -> Option<String> {
        let handover = self.shared.handover.clone()?;
        if handover.open_for(pod).is_none() && !self.requested.contains(&uid(pod)) {
            return None;
        }
        let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
        let Some(eviction) = handover.eviction_of(namespace, &uid(pod)) else {
            return Some(
                "eviction requested; waiting for the evictionrequest-controller".to_owned(),
            );
        };
        let holder = Holder::of(&eviction);
        self.tell_passed_over(&eviction, &holder);
        Some(holder.describe())
    }

    /// A Warning on the pod, once per responder, for each one passed over for a missed
    /// heartbeat: seen while the pod waits, as it leaves, or when its request is closed.
    fn tell_passed_over(&mut self, eviction: &Eviction, holder: &Holder) {
        let Some(target) = eviction.spec.target.pod.as_ref() else {
            return;
        };
        let namespace = eviction.metadata.namespace.clone().unwrap_or_default();
        for responder in &holder.passed_over {
            if !self
                .passed_over
                .insert((target.uid.clone(), responder.clone()))
            {
                continue;
            }
            let pod = ObjectReference {
                api_version: Some("v1".to_owned()),
                kind: Some("Pod".to_owned()),
                name: Some(target.name.clone()),
                namespace: Some(namespace.clone()),
                uid: Some(target.uid.clone()),
                ..ObjectReference::default()
            };
            self.shared.reporter.event(EventReport::warning(
                pod,
                "ResponderPassedOver",
                "Drain",
                format!(
                    "Eviction responder {responder} of pod {namespace}/{} missed its heartbeat \
                     deadline; the eviction passed to {}",
                    target.name,
                    holder.responder.as_deref().unwrap_or("no one")
                ),
            ));
        }
    }

    /// Closes (in the background) our requests of this node whose pod is no longer on it, or
    /// is protected by do-not-evict now.
    fn close_unneeded(&mut self, present: &HashSet<String>, protected: &HashSet<String>) {
        let Some(handover) = self.shared.handover.clone() else {
            return;
        };
        for request in handover.of_node(self.node.uid()) {
            let target = request
                .spec
                .target
                .pod
                .as_ref()
                .map(|pod| pod.uid.clone())
                .unwrap_or_default();
            let name = request.metadata.name.clone().unwrap_or_default();
            if (present.contains(&target) && !protected.contains(&target))
                || !self.closing.insert(name)
            {
                continue;
            }
            let namespace = request.metadata.namespace.as_deref().unwrap_or_default();
            if let Some(eviction) = handover.eviction_of(namespace, &target) {
                self.tell_passed_over(&eviction, &Holder::of(&eviction));
            }
            self.requested.remove(&target);
            let shared = Arc::clone(&self.shared);
            let handover = handover.clone();
            self.deletions.spawn(async move {
                crate::handover::close(&shared.client, &shared.metrics, &handover, &request).await;
            });
        }
    }

    /// Closes this node's requests that `which` picks, and waits for it.
    async fn close_requests(&mut self, which: impl Fn(&EvictionRequest) -> bool) {
        let Some(handover) = self.shared.handover.clone() else {
            return;
        };
        for request in handover.of_node(self.node.uid()) {
            if which(&request) {
                crate::handover::close(
                    &self.shared.client,
                    &self.shared.metrics,
                    &handover,
                    &request,
                )
                .await;
            }
        }
    }

    fn answered(&mut self, answer: Answer) {
        let Answer {
            key,
            pod,
            outcome,
            handed: answer_handed,
        } = answer;
        let budget = key
            .budget()
            .and_then(|(namespace, name)| self.shared.pdbs.get(Some(namespace), name));
        let view = budget.as_deref().map(BudgetView::of);
        let Some(queue) = self.queues.get_mut(&key) else {
            return;
        };
        let warn = queue.answered(
            &outcome,
            Instant::now(),
            view.as_ref(),
            self.shared.settings.eviction_backoff,
            rand::random::<f64>(),
        );
        let refusals = queue.refusals();
        match outcome {
            Outcome::Evicted if answer_handed => self.handed_over(&pod),
            Outcome::Evicted => {
                self.evicted.insert(uid(&pod));
                self.shared
                    .metrics
                    .pods_drained
                    .get_or_create(&ReasonLabel { reason: "evicted" })
                    .inc();
                self.shared.reporter.event(EventReport::normal(
                    object_reference(pod.as_ref()),
                    "Evicted",
                    "Evict",
                    format!("Evicted: node {} is being terminated", self.node.name()),
                ));
            }
            Outcome::Refused { .. } if warn => {
                let why = budget.as_deref().map_or_else(
                    || "its budget allows no disruption".to_owned(),
                    budget_blocks,
                );
                let note = format!(
                    "Eviction of {} refused {refusals} times in a row: {why}",
                    pod_key(&pod)
                );
                self.shared.reporter.event(EventReport::warning(
                    object_reference(pod.as_ref()),
                    "EvictionBlocked",
                    "Evict",
                    note.clone(),
                ));
                self.shared.reporter.event(EventReport::warning(
                    node_reference(self.node.name()),
                    "EvictionBlocked",
                    "Drain",
                    note,
                ));
            }
            Outcome::MultipleBudgets if warn => {
                let note = format!(
                    "Pod {} is covered by PodDisruptionBudgets {}: the Eviction API refuses it \
                     until only one covers it; retrying every {}s",
                    pod_key(&pod),
                    key.label(),
                    crate::queues::MISCONFIGURED_RETRY.as_secs()
                );
                self.shared.reporter.event(EventReport::warning(
                    object_reference(pod.as_ref()),
                    "EvictionMisconfigured",
                    "Evict",
                    note.clone(),
                ));
                self.shared.reporter.event(EventReport::warning(
                    node_reference(self.node.name()),
                    "EvictionMisconfigured",
                    "Drain",
                    note,
                ));
            }
            _ => {}
        }
    }

    /// A pod's EvictionRequest exists: the pod is its responders' now.
    fn handed_over(&mut self, pod: &Pod) {
        self.requested.insert(uid(pod));
        self.shared
            .metrics
            .pods_drained
            .get_or_create(&ReasonLabel {
                reason: "handed-over",
            })
            .inc();
        self.shared.reporter.event(EventReport::normal(
            object_reference(pod),
            "EvictionRequested",
            "Evict",
            format!(
                "Eviction requested from its responders (EvictionRequest {}): node {} is being \
                 terminated",
                uid(pod),
                self.node.name()
            ),
        ));
    }

    /// Deletes pods whose time has come under the drain deadline: at `deadline − grace`, with
    /// the grace cut to the time left (≥ 1 s). Returns when the next one is due.
    fn delete_at_deadline(
        &mut self,
        pods: Vec<Arc<Pod>>,
        deadline: Timestamp,
        now: Timestamp,
    ) -> Option<Duration> {
        let mut next: Option<Duration> = None;
        for pod in pods {
            if self.deleted_at_deadline.contains(&uid(&pod)) {
                continue;
            }
            let left = Duration::try_from(deadline.duration_since(now)).unwrap_or_default();
            let grace = grace(&pod);
            if let Some(due_in) = left.checked_sub(grace).filter(|due_in| !due_in.is_zero()) {
                next = Some(next.map_or(due_in, |next| next.min(due_in)));
                continue;
            }
            let cut = left.max(MIN_GRACE);
            self.deleted_at_deadline.insert(uid(&pod));
            let shared = Arc::clone(&self.shared);
            let node = self.node.name().to_owned();
            let request = self
                .shared
                .handover
                .as_ref()
                .and_then(|handover| Some((handover.clone(), handover.open_for(&pod)?)));
            self.deletions.spawn(async move {
                // The responders stop before the pod goes without them.
                if let Some((handover, request)) = request {
                    crate::handover::close(&shared.client, &shared.metrics, &handover, &request)
                        .await;
                }
                delete_now(&shared, &node, &pod, cut).await;
            });
        }
        next
    }

    /// An Event, once per pod, that a pod being deleted no longer holds the drain although
    /// its object is still there (finalizers, or no kubelet to confirm its end).
    fn announce_left(&mut self, pod: &Pod, why: &str) {
        if !self.left_announced.insert(uid(pod)) {
            return;
        }
        let finalizers = pod.metadata.finalizers.as_deref().unwrap_or_default();
        let stays = if finalizers.is_empty() {
            "its object may stay until its node is gone".to_owned()
        } else {
            format!(
                "its object stays until its finalizers ({}) are removed",
                finalizers.join(", ")
            )
        };
        self.shared.reporter.event(EventReport::warning(
            node_reference(self.node.name()),
            "PodLeftTerminating",
            "Drain",
            format!(
                "Pod {} no longer holds the drain: {why}; {stays}",
                pod_key(pod)
            ),
        ));
    }
}

/// Whether a pod is stuck terminating: its deletionTimestamp (deletion plus grace) is `after`
/// or more in the past.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stuck {
    No,
    /// Terminating; stuck from this moment on if it is still there.
    From(Timestamp),
    Since,
}

pub fn stuck_terminating(pod: &Pod, after: Duration, now: Timestamp) -> Stuck {
    let Some(deleted) = pod.metadata.deletion_timestamp.as_ref() else {
        return Stuck::No;
    };
    let from = jiff::SignedDuration::try_from(after)
        .ok()
        .and_then(|after| deleted.0.checked_add(after).ok())
        .unwrap_or(Timestamp::MAX);
    if from <= now {
        Stuck::Since
    } else {
        Stuck::From(from)
    }
}

/// What one look at the pods found.
enum Look {
    Done,
    Wait {
        waiting: Waiting,
        timer: Option<Instant>,
    },
}

/// The node's pods as one look sorts them.
#[derive(Default)]
struct Sorted {
    /// Pods to evict or wait for, by tier and group, in drain order.
    tiers: BTreeMap<(Tier, Group), Vec<Arc<Pod>>>,
    /// Which drain rule each of them follows (by pod UID).
    sources: HashMap<String, Source>,
    /// do-not-evict pods, with when their protection ends (none: never).
    protected: Vec<(Arc<Pod>, Option<Timestamp>)>,
    /// When some pod's standing changes by time alone.
    timers: Vec<Instant>,
}

impl Sorted {
    /// The wait before any eviction, if one holds the drain: do-not-evict pods (Karpenter's
    /// rule: none starts while one is there), or the first tier's pods a drain rule says to
    /// wait for.
    fn wait(&mut self, now: Instant, wall: Timestamp) -> Option<Look> {
        if !self.protected.is_empty() {
            let wakes = self.protected.iter().filter_map(|(_, until)| *until).min();
            if let Some(until) = wakes {
                let wait = Duration::try_from(until.duration_since(wall)).unwrap_or_default();
                self.timers.push(now + wait);
            }
            let message = grouped(self.protected.iter().map(|(pod, until)| {
                let why = match until {
                    None => {
                        "nodegrace.io/do-not-evict; the node waits until they are gone".to_owned()
                    }
                    Some(until) => format!("nodegrace.io/do-not-evict until {until}"),
                };
                (pod_name(pod), why)
            }));
            return Some(self.wait_for(Waiting::DoNotEvict(message)));
        }
        let (_, pods) = self
            .tiers
            .iter()
            .next()
            .filter(|((_, group), _)| *group == Group::Completion)?;
        let message = grouped(pods.iter().map(|pod| {
            let source = self
                .sources
                .get(&uid(pod))
                .map_or_else(String::new, ToString::to_string);
            (
                pod_name(pod),
                format!("{source}: WaitCompleted; the drain waits for them to finish"),
            )
        }));
        Some(self.wait_for(Waiting::Completion(message)))
    }

    fn wait_for(&mut self, waiting: Waiting) -> Look {
        Look::Wait {
            waiting,
            timer: std::mem::take(&mut self.timers).into_iter().min(),
        }
    }
}

fn preconditions(pod: &Pod) -> Preconditions {
    Preconditions {
        uid: pod.metadata.uid.clone(),
        resource_version: None,
    }
}

/// One eviction: through the shared limiter, with the pod's UID as precondition (a namesake
/// created since is never evicted by mistake).
async fn evict(shared: &Shared, pod: &Pod) -> Outcome {
    shared.eviction_limiter.until_ready().await;
    let api: Api<Pod> = Api::namespaced(
        shared.evictions.clone(),
        pod.metadata.namespace.as_deref().unwrap_or_default(),
    );
    let params = EvictParams {
        delete_options: Some(DeleteParams {
            preconditions: Some(preconditions(pod)),
            ..DeleteParams::default()
        }),
        post_options: PostParams::default(),
    };
    let result = api.evict(&pod_name(pod), &params).await;
    let code = match &result {
        Ok(_) => "201".to_owned(),
        Err(error) => {
            status_code(error).map_or_else(|| "error".to_owned(), |code| code.to_string())
        }
    };
    tracing::debug!(pod = pod_key(pod), code, "eviction answered");
    shared
        .metrics
        .eviction_requests
        .get_or_create(&CodeLabel { code })
        .inc();
    match result {
        Ok(_) => Outcome::Evicted,
        Err(kube::Error::Api(status)) => match status.code {
            404 | 409 => Outcome::Gone,
            429 => Outcome::Refused {
                retry_after: status
                    .details
                    .as_ref()
                    .map(|details| details.retry_after_seconds)
                    .filter(|seconds| *seconds > 0)
                    .map(|seconds| Duration::from_secs(u64::from(seconds))),
            },
            500 if status.message.contains("more than one PodDisruptionBudget") => {
                Outcome::MultipleBudgets
            }
            _ => {
                tracing::warn!(
                    pod = pod_key(pod),
                    code = status.code,
                    message = status.message,
                    "eviction failed"
                );
                shared.metrics.error("evict");
                Outcome::Failed
            }
        },
        Err(error) => {
            tracing::warn!(pod = pod_key(pod), error = %nodegrace_core::error_chain::Chain(&error), "eviction failed");
            shared.metrics.error("evict");
            Outcome::Failed
        }
    }
}

/// Hands `pod` to its eviction responders for the drain of `node` (name, UID).
async fn hand_over(shared: &Shared, node: &(String, String), pod: &Pod) -> Outcome {
    shared.eviction_limiter.until_ready().await;
    let asked = crate::handover::request(
        &shared.client,
        &shared.metrics,
        (node.0.as_str(), node.1.as_str()),
        pod,
    )
    .await;
    tracing::debug!(pod = pod_key(pod), ?asked, "eviction requested");
    match asked {
        Asked::Requested => Outcome::Evicted,
        Asked::Gone => Outcome::Gone,
        Asked::Failed => Outcome::Failed,
    }
}

/// The drain deadline's delete: no budget asked, grace cut short; retried until it lands or
/// the pod is gone.
async fn delete_now(shared: &Shared, node: &str, pod: &Pod, grace: Duration) {
    let api: Api<Pod> = Api::namespaced(
        shared.client.clone(),
        pod.metadata.namespace.as_deref().unwrap_or_default(),
    );
    let params = DeleteParams {
        grace_period_seconds: Some(u32::try_from(grace.as_secs()).unwrap_or(u32::MAX).max(1)),
        preconditions: Some(preconditions(pod)),
        ..DeleteParams::default()
    };
    let mut failures = 0;
    loop {
        match api.delete(&pod_name(pod), &params).await {
            Ok(_) => break,
            Err(error) if matches!(status_code(&error), Some(404 | 409)) => return,
            Err(error) => {
                failures += 1;
                shared.metrics.error("delete");
                tracing::warn!(pod = pod_key(pod), error = %nodegrace_core::error_chain::Chain(&error), "deleting at the drain deadline failed; retrying");
                tokio::time::sleep(shared.settings.eviction_backoff.delay(failures)).await;
            }
        }
    }
    shared
        .metrics
        .pods_drained
        .get_or_create(&ReasonLabel {
            reason: "drain-deadline",
        })
        .inc();
    let note = format!(
        "Deleted with a {}s grace period: node {node}'s drain deadline (--drain-timeout) is \
         reached, budgets and do-not-evict no longer hold it",
        grace.as_secs()
    );
    shared.reporter.event(EventReport::warning(
        object_reference(pod),
        "DrainDeadline",
        "Delete",
        note,
    ));
}
