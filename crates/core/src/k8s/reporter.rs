//! Telling the cluster off the critical path: node conditions, node taints and Events are
//! queued and written by a worker of their own, so a slow or rate-limited API server never
//! delays what the program is doing (holding or releasing an inhibitor, terminating pods).
//!
//! Writes that fail for a transient reason (no answer, 409, 429, 5xx) are retried every second
//! until they land; ones the server will never accept (403, 422, …) are logged and dropped.
//! Events are written in order, one object each. For a condition (per node and type) and a
//! taint (per node and key) only the latest wish counts: a newer one replaces a pending older
//! one. A repeat of a paced Event series ([`EventReport::in_paced_series`]) written less than
//! [`SERIES_PACE`] ago waits out the rest of it, joined by the repeats after it: one count-up
//! per series per pace, as client-go's event broadcaster updates a series on a heartbeat
//! (every 30 minutes there) rather than per repeat; a rollout's thousands of waiting nodes
//! were otherwise a write each. Other series (a failure retried on its backoff) count each
//! repeat as it comes. The worker takes in what was queued before every write, and writes taints and
//! conditions ahead of the Events waiting: a rollout's backlog of Events (thousands, seconds
//! behind) once held every condition back until its nodes were gone. At most
//! [`MAX_WAITING_EVENTS`] Events wait: one more is dropped, and the log says when the queue
//! filled and how many it dropped once it has room again, as client-go's broadcaster drops what
//! its full queue cannot take; an outage's tens of thousands of pod Events once held their
//! memory until written. When every [`Reporter`] is dropped, what is still pending gets
//! [`FLUSH_WINDOW`] to land.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{Node, Taint};
use kube::Api;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::api_errors::{ApiErrorClass, classify_write};
pub use super::conditions::ConditionGuard;
use super::conditions::{ConditionSpec, upsert_conditions_of};
use super::events::{EventPublisher, EventReport};
use super::node_identity::NodeIdentity;
use super::taints::{add_taint, remove_taint};
use crate::error_chain::Chain;

/// How long a failed write waits before it is tried again.
pub const RETRY_PAUSE: Duration = Duration::from_secs(1);
/// How long pending writes keep being retried after the program dropped its reporters.
pub const FLUSH_WINDOW: Duration = Duration::from_secs(5);
/// The least time between two writes of one Event series: its count is at most this late.
pub const SERIES_PACE: Duration = Duration::from_secs(30);
/// How many Events may wait to be written: a few MiB at most. Ten times what client-go's
/// broadcaster queues: a 5,000-node rollout's Events (two a node, written one at a time) wait
/// by the thousand, and at 1,000 nine in ten of them were dropped.
pub const MAX_WAITING_EVENTS: usize = 10_000;

/// Where the writes go: the API server, or a recorder in tests.
pub trait ReportSink: Send + Sync + 'static {
    fn event<'a>(&'a self, event: &'a EventReport) -> BoxFuture<'a, Result<(), kube::Error>>;
    /// Every pending condition of one node, in one write where the sink can; with a `uid`,
    /// only on that Node object.
    fn conditions<'a>(
        &'a self,
        node: &'a ConditionTarget,
        conditions: &'a [(ConditionSpec, ConditionGuard)],
    ) -> BoxFuture<'a, Result<(), kube::Error>>;
    fn taint<'a>(
        &'a self,
        node: &'a str,
        taint: &'a Taint,
        present: bool,
    ) -> BoxFuture<'a, Result<(), kube::Error>>;
}

/// The API server as a [`ReportSink`].
#[derive(Debug, Clone)]
pub struct ApiSink {
    pub nodes: Api<Node>,
    pub events: EventPublisher,
}

impl ApiSink {
    /// Writes as `program`, Events reported by `instance` (the node or pod it runs as).
    pub fn new(client: kube::Client, program: &str, instance: &str) -> Self {
        Self {
            nodes: Api::all(client.clone()),
            events: EventPublisher::new(client, program, instance),
        }
    }
}

impl ReportSink for ApiSink {
    fn event<'a>(&'a self, event: &'a EventReport) -> BoxFuture<'a, Result<(), kube::Error>> {
        self.events.publish(event).boxed()
    }

    fn conditions<'a>(
        &'a self,
        node: &'a ConditionTarget,
        conditions: &'a [(ConditionSpec, ConditionGuard)],
    ) -> BoxFuture<'a, Result<(), kube::Error>> {
        upsert_conditions_of(&self.nodes, &node.name, node.uid.as_deref(), conditions)
            .map(|written| written.map(drop))
            .boxed()
    }

    fn taint<'a>(
        &'a self,
        node: &'a str,
        taint: &'a Taint,
        present: bool,
    ) -> BoxFuture<'a, Result<(), kube::Error>> {
        async move {
            if present {
                add_taint(&self.nodes, node, taint).await.map(drop)
            } else {
                remove_taint(&self.nodes, node, taint).await.map(drop)
            }
        }
        .boxed()
    }
}

/// Resolves when a queued write has landed, was given up, or was replaced by a newer one.
#[derive(Debug)]
pub struct Landed(oneshot::Receiver<()>);

impl Landed {
    pub async fn wait(self) {
        // A dropped sender means given up or superseded: either way there is nothing to wait for.
        let _ = self.0.await;
    }
}

/// The Node a condition is meant for: by name (a node agent, which is that node whatever
/// its object), or one Node object (a controller, whose write must never land on a namesake).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ConditionTarget {
    pub name: String,
    pub uid: Option<String>,
}

#[derive(Debug)]
struct ConditionWrite {
    node: ConditionTarget,
    condition: ConditionSpec,
    guard: ConditionGuard,
}

#[derive(Debug)]
struct TaintWrite {
    node: String,
    taint: Taint,
    present: bool,
    landed: oneshot::Sender<()>,
}

#[derive(Debug)]
enum Write {
    Event(EventReport),
    Condition(ConditionWrite),
    Taint(TaintWrite),
    /// Drop the node's pending conditions and taints; said done once taken in, which is
    /// never while a write is under way.
    Forget(String, oneshot::Sender<()>),
}

/// The worker's end. A program awaits it after its work, so what it queued last (a
/// completion Event) is written before the process exits; the wait is bounded by
/// [`FLUSH_WINDOW`] once every [`Reporter`] is gone.
#[derive(Debug)]
pub struct Flushed(JoinHandle<()>);

impl Flushed {
    pub async fn wait(self) {
        // A reporter clone kept alive elsewhere would hold the worker open: bound the wait.
        let _ = tokio::time::timeout(FLUSH_WINDOW + RETRY_PAUSE, self.0).await;
    }
}

/// Queues writes for the worker. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Reporter {
    sender: mpsc::UnboundedSender<Write>,
}

impl Reporter {
    /// Starts the worker; it ends once every clone is dropped and the pending writes have
    /// landed or [`FLUSH_WINDOW`] has passed.
    pub fn start(sink: impl ReportSink) -> (Self, Flushed) {
        let (sender, receiver) = mpsc::unbounded_channel();
        let worker = tokio::spawn(work(sink, receiver));
        (Self { sender }, Flushed(worker))
    }

    pub fn event(&self, event: EventReport) {
        self.send(Write::Event(event));
    }

    /// Sets a condition on whatever Node has the name: for the node agents, which are that
    /// node.
    pub fn condition(&self, node: &str, condition: ConditionSpec, guard: ConditionGuard) {
        let node = ConditionTarget {
            name: node.to_owned(),
            uid: None,
        };
        self.send(Write::Condition(ConditionWrite {
            node,
            condition,
            guard,
        }));
    }

    /// Sets a condition on this Node object only: the read and the patch both carry its UID,
    /// so a namesake registered meanwhile, even between the two, is never written.
    pub fn condition_of(
        &self,
        node: &NodeIdentity,
        condition: ConditionSpec,
        guard: ConditionGuard,
    ) {
        let node = ConditionTarget {
            name: node.name().to_owned(),
            uid: Some(node.uid().to_owned()),
        };
        self.send(Write::Condition(ConditionWrite {
            node,
            condition,
            guard,
        }));
    }

    /// Adds (`present`) or removes the taint with `taint`'s key and effect.
    pub fn taint(&self, node: &str, taint: Taint, present: bool) -> Landed {
        let (landed, receiver) = oneshot::channel();
        self.send(Write::Taint(TaintWrite {
            node: node.to_owned(),
            taint,
            present,
            landed,
        }));
        Landed(receiver)
    }

    /// Drops the conditions and taints still pending for `node` (its Events stay: they tell
    /// what happened and outlive it). For a program about to let the Node object go: a write
    /// that lands after that lands on a namesake, or is a wasted read. The worker writes one
    /// thing at a time and takes the forgetting in between two writes, so once the returned
    /// [`Landed`] resolves no write of the node is under way either: a write that read the
    /// Node by name before it went can no longer land on a namesake after it. Await it before
    /// the write that lets the Node go.
    pub fn forget_node(&self, node: &str) -> Landed {
        let (taken, receiver) = oneshot::channel();
        self.send(Write::Forget(node.to_owned(), taken));
        Landed(receiver)
    }

    fn send(&self, write: Write) {
        // The worker outlives every sender, so the send cannot fail while `self` exists.
        let _ = self.sender.send(write);
    }
}

#[derive(Default)]
struct Pending {
    taints: VecDeque<TaintWrite>,
    /// Per node, the latest wish per condition type, written together.
    conditions: BTreeMap<ConditionTarget, Vec<(ConditionSpec, ConditionGuard)>>,
    events: VecDeque<EventReport>,
    /// Series repeats waiting out [`SERIES_PACE`] (by series key), each with when it is due.
    paced: HashMap<String, (EventReport, Instant)>,
    /// When each series was last written, for as long as that bears on the next repeat.
    series_written: HashMap<String, Instant>,
    /// Writes of the current attempt that must be tried again after the pause; newer wishes
    /// and forgotten nodes take them out as they do the pending ones.
    retry_taints: Vec<TaintWrite>,
    retry_conditions: Vec<(ConditionTarget, Vec<(ConditionSpec, ConditionGuard)>)>,
    /// Events dropped since the queue was last short of full.
    dropped_events: u64,
}

impl Pending {
    fn is_empty(&self) -> bool {
        !self.writable() && self.paced.is_empty()
    }

    /// Whether something waits to be written now (not a paced repeat, which waits its time).
    fn writable(&self) -> bool {
        !(self.taints.is_empty() && self.conditions.is_empty() && self.events.is_empty())
    }

    /// When the earliest paced series repeat falls due.
    fn next_paced(&self) -> Option<Instant> {
        self.paced.values().map(|(_, due)| *due).min()
    }

    /// Queues the paced repeats due by `now` (all of them when the program is stopping).
    fn release_paced(&mut self, now: Instant, stopping: bool) {
        let due: Vec<String> = self
            .paced
            .iter()
            .filter(|(_, (_, due))| stopping || *due <= now)
            .map(|(key, _)| key.clone())
            .collect();
        for key in due {
            if let Some((event, _)) = self.paced.remove(&key) {
                self.events.push_back(event);
            }
        }
    }

    /// A paced series' repeat is held while its series was written less than [`SERIES_PACE`]
    /// ago.
    fn pace(&mut self, event: EventReport) -> Option<EventReport> {
        let Some(key) = event.series.clone().filter(|_| event.paced) else {
            return Some(event);
        };
        if let Some((held, _)) = self.paced.get_mut(&key) {
            held.occurrences = held.occurrences.saturating_add(event.occurrences);
            return None;
        }
        let now = Instant::now();
        self.series_written
            .retain(|_, written| now.duration_since(*written) < SERIES_PACE);
        match self.series_written.get(&key) {
            Some(written) => {
                self.paced.insert(key, (event, *written + SERIES_PACE));
                None
            }
            None => Some(event),
        }
    }

    /// Queues `event`, or drops it when [`MAX_WAITING_EVENTS`] already wait.
    fn queue_event(&mut self, event: EventReport) {
        if self.events.len() < MAX_WAITING_EVENTS {
            self.events.push_back(event);
            if self.dropped_events > 0 {
                tracing::warn!(
                    dropped = std::mem::take(&mut self.dropped_events),
                    "Events were dropped while the queue was full"
                );
            }
            return;
        }
        if self.dropped_events == 0 {
            tracing::warn!(
                waiting = MAX_WAITING_EVENTS,
                reason = %event.reason,
                "Events come faster than the API server takes them: dropping new ones until the queue has room"
            );
        }
        self.dropped_events += 1;
    }

    fn add(&mut self, write: Write) {
        match write {
            Write::Event(event) => {
                // A repeat of a series still waiting to be written joins it: one write, a
                // larger count.
                let waiting = event.series.as_ref().and_then(|key| {
                    self.events
                        .iter_mut()
                        .find(|queued| queued.series.as_ref() == Some(key))
                });
                match waiting {
                    Some(queued) => {
                        queued.occurrences = queued.occurrences.saturating_add(event.occurrences);
                    }
                    None => {
                        if let Some(event) = self.pace(event) {
                            self.queue_event(event);
                        }
                    }
                }
            }
            Write::Condition(new) => {
                let wishes = self.conditions.entry(new.node).or_default();
                wishes.retain(|(old, _)| old.type_ != new.condition.type_);
                wishes.push((new.condition, new.guard));
            }
            // A replaced taint wish drops its sender: its waiter resolves.
            Write::Taint(new) => {
                let older =
                    |old: &TaintWrite| old.node == new.node && old.taint.key == new.taint.key;
                self.taints.retain(|old| !older(old));
                self.retry_taints.retain(|old| !older(old));
                self.taints.push_back(new);
            }
            Write::Forget(node, taken) => {
                // A rollout forgets each of its thousands of nodes while the others' conditions
                // wait: a look at the node's own range, not at every node's.
                let first = ConditionTarget {
                    name: node.clone(),
                    uid: None,
                };
                let forgotten: Vec<ConditionTarget> = self
                    .conditions
                    .range(first..)
                    .map(|(target, _)| target)
                    .take_while(|target| target.name == node)
                    .cloned()
                    .collect();
                for target in forgotten {
                    self.conditions.remove(&target);
                }
                self.taints.retain(|old| old.node != node);
                self.retry_conditions.retain(|(old, _)| old.name != node);
                self.retry_taints.retain(|old| old.node != node);
                let _ = taken.send(());
            }
        }
    }

    /// One attempt at everything pending, one write at a time, taking in what was queued
    /// since before each: taints first (they keep pods away), then each node's conditions,
    /// then Events in order up to the first that must be retried. Taken in before each write,
    /// a forgotten node's conditions are dropped before they can land on a namesake, and a
    /// backlog of Events never holds back a taint or a condition queued behind it.
    async fn attempt(&mut self, sink: &impl ReportSink, writes: &mut Writes) {
        let mut events_blocked = false;
        loop {
            writes.take_queued(self);
            if let Some(write) = self.taints.pop_front() {
                let result = sink.taint(&write.node, &write.taint, write.present).await;
                if keep_after(result, "taint", &write.taint.key) {
                    self.retry_taints.push(write);
                } else {
                    let _ = write.landed.send(());
                }
            } else if let Some((node, wishes)) = self.conditions.pop_first() {
                let result = sink.conditions(&node, &wishes).await;
                if keep_after(result, "conditions", &node.name) {
                    self.retry_conditions.push((node, wishes));
                }
            } else if let Some(event) = self.events.front().filter(|_| !events_blocked) {
                let result = sink.event(event).await;
                if keep_after(result, "Event", &event.reason) {
                    events_blocked = true;
                } else if let Some(key) = self
                    .events
                    .pop_front()
                    .filter(|event| event.paced)
                    .and_then(|event| event.series)
                {
                    self.series_written.insert(key, Instant::now());
                }
            } else {
                break;
            }
        }
        self.taints.extend(self.retry_taints.drain(..));
        for (node, old) in std::mem::take(&mut self.retry_conditions) {
            let wishes = self.conditions.entry(node).or_default();
            let newer: Vec<_> = std::mem::take(wishes);
            wishes.extend(
                old.into_iter()
                    .filter(|(old, _)| !newer.iter().any(|(new, _)| new.type_ == old.type_)),
            );
            wishes.extend(newer);
        }
    }

    fn abandon(&self) {
        let lost = self.taints.len()
            + self.conditions.values().map(Vec::len).sum::<usize>()
            + self.events.len()
            + self.paced.len();
        tracing::error!(
            lost,
            "the API server did not take the last writes before the program stopped"
        );
    }
}

/// Whether a write must be tried again.
fn keep_after(result: Result<(), kube::Error>, what: &str, name: &str) -> bool {
    let Err(error) = result else { return false };
    match classify_write(&error) {
        ApiErrorClass::Retry => {
            tracing::warn!(error = %Chain(&error), what, name, "cannot write; retrying");
            true
        }
        ApiErrorClass::Final | ApiErrorClass::Gone => {
            tracing::error!(error = %Chain(&error), what, name, "the API server refused a write; giving it up");
            false
        }
    }
}

/// The worker's end of the queue, and whether every [`Reporter`] is gone.
struct Writes {
    receiver: mpsc::UnboundedReceiver<Write>,
    closed: bool,
}

impl Writes {
    /// Moves what is queued now into `pending`, without waiting.
    fn take_queued(&mut self, pending: &mut Pending) {
        loop {
            match self.receiver.try_recv() {
                Ok(write) => pending.add(write),
                Err(mpsc::error::TryRecvError::Empty) => return,
                Err(mpsc::error::TryRecvError::Disconnected) => {
                    self.closed = true;
                    return;
                }
            }
        }
    }
}

async fn work(sink: impl ReportSink, receiver: mpsc::UnboundedReceiver<Write>) {
    let mut writes = Writes {
        receiver,
        closed: false,
    };
    let mut pending = Pending::default();
    let mut flush_deadline: Option<Instant> = None;
    loop {
        if writes.closed && flush_deadline.is_none() {
            flush_deadline = Some(Instant::now() + FLUSH_WINDOW);
            // The program is stopping: its last counts go now, not a pace later.
            pending.release_paced(Instant::now(), true);
        }
        if flush_deadline.is_some() && pending.is_empty() {
            return;
        }
        if flush_deadline.is_some_and(|deadline| Instant::now() >= deadline) {
            pending.abandon();
            return;
        }
        let retrying = pending.writable();
        let paced = pending.next_paced();
        tokio::select! {
            write = writes.receiver.recv(), if !writes.closed => {
                match write {
                    Some(write) => pending.add(write),
                    None => writes.closed = true,
                }
            }
            () = tokio::time::sleep(RETRY_PAUSE), if retrying => {}
            () = crate::timers::sleep_until_or_forever(paced) => {}
        }
        pending.release_paced(Instant::now(), false);
        pending.attempt(&sink, &mut writes).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    use crate::k8s::nodes::node_reference;

    /// Records writes; answers each with the next scripted status (200 once the script ends).
    #[derive(Clone, Default)]
    struct Recorder {
        script: Arc<Mutex<VecDeque<u16>>>,
        written: Arc<Mutex<Vec<String>>>,
        attempts: Arc<Mutex<usize>>,
        /// How long each write takes to answer.
        latency: Duration,
    }

    impl Recorder {
        fn scripted(codes: &[u16]) -> Self {
            let recorder = Self::default();
            recorder.script.lock().unwrap().extend(codes);
            recorder
        }

        fn slow(latency: Duration) -> Self {
            Self {
                latency,
                ..Self::default()
            }
        }

        fn answer(&self, what: String) -> BoxFuture<'static, Result<(), kube::Error>> {
            *self.attempts.lock().unwrap() += 1;
            let code = self.script.lock().unwrap().pop_front().unwrap_or(200);
            let latency = self.latency;
            let result = if code == 200 {
                self.written.lock().unwrap().push(what);
                Ok(())
            } else {
                Err(kube::Error::Api(
                    kube::core::Status::failure("no", "x")
                        .with_code(code)
                        .boxed(),
                ))
            };
            async move {
                tokio::time::sleep(latency).await;
                result
            }
            .boxed()
        }

        fn written(&self) -> Vec<String> {
            self.written.lock().unwrap().clone()
        }
    }

    impl ReportSink for Recorder {
        fn event<'a>(&'a self, event: &'a EventReport) -> BoxFuture<'a, Result<(), kube::Error>> {
            let times = match event.occurrences {
                1 => String::new(),
                many => format!(" x{many}"),
            };
            self.answer(format!("event {}{times}", event.reason))
        }
        fn conditions<'a>(
            &'a self,
            node: &'a ConditionTarget,
            conditions: &'a [(ConditionSpec, ConditionGuard)],
        ) -> BoxFuture<'a, Result<(), kube::Error>> {
            let written: Vec<String> = conditions
                .iter()
                .map(|(condition, _)| format!("{} {}", condition.type_, condition.status))
                .collect();
            let uid = node
                .uid
                .as_deref()
                .map(|uid| format!("@{uid}"))
                .unwrap_or_default();
            self.answer(format!(
                "conditions {}{uid} {}",
                node.name,
                written.join(" ")
            ))
        }
        fn taint<'a>(
            &'a self,
            node: &'a str,
            taint: &'a Taint,
            present: bool,
        ) -> BoxFuture<'a, Result<(), kube::Error>> {
            self.answer(format!("taint {node} {} {present}", taint.key))
        }
    }

    fn event(reason: &str) -> EventReport {
        EventReport::normal(node_reference("n1"), reason, "Test", "note")
    }

    fn taint(key: &str) -> Taint {
        Taint {
            key: key.to_owned(),
            effect: "NoSchedule".to_owned(),
            ..Taint::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn events_stay_in_order_across_a_transient_failure_and_refusals_are_dropped() {
        let sink = Recorder::scripted(&[503, 503, 200, 200, 403, 200]);
        let (reporter, worker) = Reporter::start(sink.clone());
        reporter.event(event("First"));
        reporter.event(event("Second"));
        reporter.event(event("Refused"));
        reporter.event(event("Fourth"));
        drop(reporter);
        worker.wait().await;
        assert_eq!(
            sink.written(),
            ["event First", "event Second", "event Fourth"]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn only_the_latest_condition_and_taint_wish_is_written() {
        let sink = Recorder::scripted(&[503]);
        let (reporter, worker) = Reporter::start(sink.clone());
        let add = reporter.taint("n1", taint("k"), true);
        // The first attempt fails; both wishes are replaced before the retry.
        add.wait().await;
        reporter.condition(
            "n1",
            ConditionSpec::new("C", "True", "R", "m"),
            ConditionGuard::Always,
        );
        reporter.condition(
            "n1",
            ConditionSpec::new("C", "False", "R", "m"),
            ConditionGuard::Always,
        );
        let remove = reporter.taint("n1", taint("k"), false);
        remove.wait().await;
        drop(reporter);
        worker.wait().await;
        let written = sink.written();
        assert!(
            written.contains(&"taint n1 k false".to_owned()),
            "{written:?}"
        );
        assert!(
            written.contains(&"conditions n1 C False".to_owned()),
            "{written:?}"
        );
        assert!(
            !written.iter().any(|write| write.contains("C True")),
            "{written:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_nodes_conditions_go_in_one_write_and_a_forgotten_nodes_are_never_written() {
        let sink = Recorder::default();
        let (reporter, worker) = Reporter::start(sink.clone());
        // The worker first runs when this test awaits: everything below is pending at once.
        // n20 sorts right after n2's wishes: forgetting n2 leaves it.
        for (node, type_) in [("n1", "A"), ("n2", "A"), ("n1", "B"), ("n20", "A")] {
            reporter.condition(
                node,
                ConditionSpec::new(type_, "True", "R", "m"),
                ConditionGuard::Always,
            );
        }
        reporter.condition_of(
            &NodeIdentity::new("n2", "u1"),
            ConditionSpec::new("B", "True", "R", "m"),
            ConditionGuard::Always,
        );
        reporter.forget_node("n2");
        // After the forgetting, a wish for the name is a new one (a namesake's).
        reporter.condition_of(
            &NodeIdentity::new("n2", "u2"),
            ConditionSpec::new("C", "True", "R", "m"),
            ConditionGuard::Always,
        );
        drop(reporter);
        worker.wait().await;
        assert_eq!(
            sink.written(),
            [
                "conditions n1 A True B True",
                "conditions n2@u2 C True",
                "conditions n20 A True"
            ]
        );
    }

    fn wish(reporter: &Reporter, node: &str, type_: &str) {
        reporter.condition(
            node,
            ConditionSpec::new(type_, "True", "R", "m"),
            ConditionGuard::Always,
        );
    }

    /// The window of a write that read the Node by name before it went: forgetting the node
    /// is done only once that write is over, so the caller lets the Node go after it.
    #[tokio::test(start_paused = true)]
    async fn forgetting_a_node_is_done_only_after_its_write_under_way() {
        let sink = Recorder::slow(Duration::from_millis(10));
        let (reporter, worker) = Reporter::start(sink.clone());
        let started = Instant::now();
        wish(&reporter, "n1", "A");
        tokio::time::sleep(Duration::from_millis(5)).await;
        assert_eq!(sink.written(), ["conditions n1 A True"], "under way");
        reporter.forget_node("n1").wait().await;
        assert!(
            started.elapsed() >= Duration::from_millis(10),
            "forgotten {:?} after the write began, before it ended",
            started.elapsed()
        );
        // Nothing pending: forgetting an idle node is done at once.
        let idle = Instant::now();
        reporter.forget_node("n2").wait().await;
        assert_eq!(idle.elapsed(), Duration::ZERO);
        drop(reporter);
        worker.wait().await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_node_forgotten_while_another_write_is_under_way_has_nothing_written_after() {
        let sink = Recorder::slow(Duration::from_millis(10));
        let (reporter, worker) = Reporter::start(sink.clone());
        for node in ["n1", "n2", "n3"] {
            wish(&reporter, node, "A");
        }
        // n1's write is under way: the Node n3 is let go meanwhile.
        tokio::time::sleep(Duration::from_millis(5)).await;
        reporter.forget_node("n3");
        drop(reporter);
        worker.wait().await;
        assert_eq!(
            sink.written(),
            ["conditions n1 A True", "conditions n2 A True"]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_write_of_a_node_forgotten_meanwhile_is_not_retried() {
        let sink = Recorder::scripted(&[503]);
        let (reporter, worker) = Reporter::start(sink.clone());
        wish(&reporter, "n1", "A");
        let tainted = reporter.taint("n1", taint("k"), true);
        reporter.forget_node("n1");
        // The forgetting came after the first attempt took the writes: it still holds them.
        tainted.wait().await;
        drop(reporter);
        worker.wait().await;
        assert!(sink.written().is_empty(), "{:?}", sink.written());
    }

    #[tokio::test(start_paused = true)]
    async fn taints_and_conditions_go_before_a_backlog_of_events() {
        let sink = Recorder::slow(Duration::from_millis(10));
        let (reporter, worker) = Reporter::start(sink.clone());
        for index in 0..50 {
            reporter.event(event(&format!("E{index}")));
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
        wish(&reporter, "n1", "A");
        let _ = reporter.taint("n1", taint("k"), true);
        drop(reporter);
        worker.wait().await;
        let written = sink.written();
        let at = |what: &str| written.iter().position(|write| write == what);
        assert_eq!(at("taint n1 k true"), Some(3), "{written:?}");
        assert_eq!(at("conditions n1 A True"), Some(4), "{written:?}");
        assert_eq!(written.len(), 52, "{written:?}");
        assert_eq!(at("event E49"), Some(51), "{written:?}");
    }

    /// An outage's burst of Events beyond what may wait is dropped, not held in memory until
    /// written; once the queue has room it takes Events again.
    #[tokio::test(start_paused = true)]
    async fn events_beyond_the_waiting_limit_are_dropped() {
        let sink = Recorder::slow(Duration::from_millis(1));
        let (reporter, worker) = Reporter::start(sink.clone());
        for index in 0..MAX_WAITING_EVENTS + 50 {
            reporter.event(event(&format!("E{index}")));
        }
        // Written at 1 ms each, the queue has drained by then.
        tokio::time::sleep(Duration::from_secs(12)).await;
        reporter.event(event("After"));
        drop(reporter);
        worker.wait().await;
        let written = sink.written();
        assert_eq!(
            written.len(),
            MAX_WAITING_EVENTS + 1,
            "{:?}",
            written.last()
        );
        let last_kept = format!("event E{}", MAX_WAITING_EVENTS - 1);
        assert_eq!(written[MAX_WAITING_EVENTS - 1], last_kept);
        assert_eq!(written[MAX_WAITING_EVENTS], "event After");
    }

    /// A thousand nodes that begin to wait at once are a few writes of one Event's count, not
    /// a thousand Events.
    #[tokio::test(start_paused = true)]
    async fn repeats_of_a_series_waiting_together_are_one_write() {
        let sink = Recorder::slow(Duration::from_millis(10));
        let (reporter, worker) = Reporter::start(sink.clone());
        reporter.event(event("Before"));
        for _ in 0..1000 {
            reporter.event(event("Waiting").in_series("budget/Waiting"));
        }
        reporter.event(event("Other").in_series("other"));
        reporter.event(event("Waiting").in_series("budget/Waiting"));
        drop(reporter);
        worker.wait().await;
        assert_eq!(
            sink.written(),
            ["event Before", "event Waiting x1001", "event Other"]
        );
    }

    /// Nodes that begin to wait one after another, each after the last write, are one
    /// count-up of their paced series per [`SERIES_PACE`]; other Events are not held; the
    /// count held when the program stops is written as it stops.
    #[tokio::test(start_paused = true)]
    async fn repeats_of_a_series_after_its_write_wait_out_the_pace_together() {
        let sink = Recorder::default();
        let (reporter, worker) = Reporter::start(sink.clone());
        let written = |count: usize| {
            let sink = sink.clone();
            async move {
                while sink.written().len() < count {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        };
        let waiting = || event("Waiting").in_paced_series("budget/Waiting");
        reporter.event(waiting());
        written(1).await;
        let first_written = Instant::now();
        for _ in 0..5 {
            reporter.event(waiting());
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        reporter.event(event("Failed").in_series("n1/Failed"));
        written(2).await;
        reporter.event(event("Failed").in_series("n1/Failed"));
        reporter.event(event("Unpaced"));
        written(4).await;
        assert_eq!(
            sink.written(),
            [
                "event Waiting",
                "event Failed",
                "event Failed",
                "event Unpaced"
            ]
        );
        written(5).await;
        assert!(
            first_written.elapsed() >= SERIES_PACE,
            "the count-up came {:?} after the first write",
            first_written.elapsed()
        );
        assert_eq!(sink.written()[4], "event Waiting x5");
        reporter.event(waiting());
        reporter.event(waiting());
        drop(reporter);
        worker.wait().await;
        assert_eq!(sink.written().len(), 6);
        assert_eq!(sink.written()[5], "event Waiting x2");
    }

    #[tokio::test(start_paused = true)]
    async fn the_worker_ends_when_dropped_and_gives_up_after_the_flush_window() {
        let idle = Recorder::default();
        let (reporter, worker) = Reporter::start(idle.clone());
        drop(reporter);
        worker.wait().await;
        assert_eq!(
            *idle.attempts.lock().unwrap(),
            0,
            "nothing to write, nothing tried"
        );

        let down = Recorder::scripted(&[503; 1000]);
        let (reporter, worker) = Reporter::start(down.clone());
        reporter.event(event("Lost"));
        let start = Instant::now();
        drop(reporter);
        worker.wait().await;
        let attempts = *down.attempts.lock().unwrap();
        assert!(
            start.elapsed() <= FLUSH_WINDOW + RETRY_PAUSE,
            "{:?}",
            start.elapsed()
        );
        // One try per pause, no spinning.
        assert!(
            attempts <= 1 + (FLUSH_WINDOW.as_secs() as usize) + 1,
            "{attempts} attempts"
        );
        assert!(down.written().is_empty());
    }
}
