//! Fresh reads of the nodes (quorum LISTs by label selector, in trimmed pages), shared through
//! core's [`Fresh`]: each caller gets a read that began after it asked, never an older one, so
//! the nodes checking one budget at once — a rollout's pass grants a hundred, and each checks its budget before its
//! cordon — cost one or two reads between them, not one each. A read per node cost a rollout of
//! 5,000 nodes a LIST of 5,000 nodes per node: 5 GB of memory and most of its CPU.
//!
//! A read parses only what the budgets look at ([`BudgetFields`]): parsing whole Nodes (labels,
//! annotations, images, capacities, `managedFields`) to drop most of them was, after the reads
//! themselves, the largest cost of a rollout of thousands. And it keeps what it parsed as a
//! [`BudgetNode`], a third of a `Node`'s memory: the read of a pool of 5,000 held 15 MiB as
//! Nodes, the largest part of a rollout's heap after the watch cache.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use jiff::Timestamp;

use k8s_openapi::api::core::v1::{NodeCondition, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ListMeta, ObjectMeta, Time};
use kube::Api;
use kube::api::ListParams;
use nodegrace_core::fresh::Fresh;
use nodegrace_core::k8s::cached_node::{CachedNode, CachedNodeSpec, CachedNodeStatus};
use serde::Deserialize;

use crate::budget::NodeFacts;
use crate::member::Member;
use crate::nodes_read::NodesRead;

/// Nodes per page (client-go's informers list 500 at a time too).
const PAGE: u32 = 500;

/// One read's nodes, as the budgets read them.
pub type Nodes = Arc<NodesRead>;

pub struct FreshNodes {
    client: kube::Client,
    request: kube::core::Request,
    /// By label selector ("" for every node).
    reads: Mutex<HashMap<String, Arc<Fresh<Nodes>>>>,
}

impl std::fmt::Debug for FreshNodes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FreshNodes").finish_non_exhaustive()
    }
}

impl FreshNodes {
    pub fn new(api: Api<CachedNode>) -> Self {
        Self {
            request: kube::core::Request::new(api.resource_url()),
            client: api.into_client(),
            reads: Mutex::default(),
        }
    }

    /// The nodes `selector` selects ("" for every node) as the API server has them, read
    /// after this call began.
    pub async fn read(&self, selector: &str) -> Result<Nodes, kube::Error> {
        self.reads_of(selector).get(|| self.list(selector)).await
    }

    /// [`Self::read`], but joining a read some other caller begins within `within` rather than
    /// starting one at once ([`Fresh::get_joining`]): a check that can wait that long shares
    /// the granting pass's next read instead of adding one of its own.
    pub async fn read_joining(
        &self,
        selector: &str,
        within: Duration,
    ) -> Result<Nodes, kube::Error> {
        self.reads_of(selector)
            .get_joining(within, || self.list(selector))
            .await
    }

    fn reads_of(&self, selector: &str) -> Arc<Fresh<Nodes>> {
        Arc::clone(
            self.reads
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .entry(selector.to_owned())
                .or_default(),
        )
    }

    /// One consistent read, in pages (each of the first one's resourceVersion): a read of
    /// thousands of nodes holds one page's body at a time.
    async fn list(&self, selector: &str) -> Result<Nodes, kube::Error> {
        let mut params = ListParams::default().limit(PAGE);
        if !selector.is_empty() {
            params = params.labels(selector);
        }
        let mut nodes = Vec::new();
        loop {
            let mut request = self
                .request
                .list(&params)
                .map_err(kube::Error::BuildRequest)?;
            request.extensions_mut().insert("list");
            let page: Page = self.client.request(request).await?;
            nodes.extend(
                page.items
                    .into_iter()
                    .map(|node| Arc::new(BudgetNode::from(CachedNode::from(node)))),
            );
            match page.metadata.continue_.filter(|token| !token.is_empty()) {
                Some(token) => params = params.continue_token(&token),
                None => return Ok(Arc::new(NodesRead::new(nodes))),
            }
        }
    }
}

/// A page of a node LIST, parsed as far as the budgets read it.
#[derive(Deserialize)]
struct Page {
    metadata: ListMeta,
    items: Vec<BudgetFields>,
}

/// What the budgets read of a Node ([`Member`]); serde skips the rest of each object
/// unparsed.
#[derive(Deserialize)]
struct BudgetFields {
    metadata: Metadata,
    spec: Option<Spec>,
    status: Option<Status>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Metadata {
    name: Option<String>,
    uid: Option<String>,
    labels: Option<BTreeMap<String, String>>,
    creation_timestamp: Option<Time>,
    deletion_timestamp: Option<Time>,
    finalizers: Option<Vec<String>>,
}

#[derive(Deserialize)]
struct Spec {
    taints: Option<Vec<Taint>>,
}

#[derive(Deserialize)]
struct Status {
    conditions: Option<Vec<Condition>>,
}

#[derive(Deserialize)]
struct Condition {
    #[serde(rename = "type")]
    type_: String,
    status: String,
}

impl From<BudgetFields> for CachedNode {
    fn from(node: BudgetFields) -> Self {
        let metadata = node.metadata;
        Self {
            metadata: ObjectMeta {
                name: metadata.name,
                uid: metadata.uid,
                labels: metadata.labels,
                creation_timestamp: metadata.creation_timestamp,
                deletion_timestamp: metadata.deletion_timestamp,
                finalizers: metadata.finalizers,
                ..ObjectMeta::default()
            },
            spec: node.spec.map(|spec| CachedNodeSpec {
                taints: spec.taints,
                ..CachedNodeSpec::default()
            }),
            status: node.status.map(|status| CachedNodeStatus {
                // The budgets read readiness alone: a pass then finds it at the first look.
                conditions: status.conditions.map(|conditions| {
                    conditions
                        .into_iter()
                        .filter(|condition| condition.type_ == "Ready")
                        .map(|condition| NodeCondition {
                            type_: condition.type_,
                            status: condition.status,
                            ..NodeCondition::default()
                        })
                        .collect()
                }),
            }),
        }
    }
}

/// A node as the budgets read it ([`Member`]): under 1 KiB with its labels, where the whole
/// `Node` it is made from held 3 KiB.
#[derive(Debug, Clone, PartialEq)]
pub struct BudgetNode {
    name: String,
    uid: Option<String>,
    labels: BTreeMap<String, String>,
    created: Option<Timestamp>,
    deletion_asked: Option<Timestamp>,
    ready: bool,
    awaits_grants: bool,
    disrupting: bool,
}

impl From<CachedNode> for BudgetNode {
    fn from(node: CachedNode) -> Self {
        let NodeFacts {
            ready,
            awaits_grants,
            disrupting,
            ..
        } = node.facts();
        let (created, deletion_asked) = (node.created(), node.deletion_asked());
        let metadata = node.metadata;
        Self {
            name: metadata.name.unwrap_or_default(),
            uid: metadata.uid,
            labels: metadata.labels.unwrap_or_default(),
            created,
            deletion_asked,
            ready,
            awaits_grants,
            disrupting,
        }
    }
}

impl Member for BudgetNode {
    fn facts(&self) -> NodeFacts<'_> {
        NodeFacts {
            name: &self.name,
            labels: &self.labels,
            ready: self.ready,
            deleting: self.deletion_asked.is_some(),
            awaits_grants: self.awaits_grants,
            disrupting: self.disrupting,
        }
    }

    fn uid(&self) -> Option<&str> {
        self.uid.as_deref()
    }

    fn created(&self) -> Option<Timestamp> {
        self.created
    }

    fn deletion_asked(&self) -> Option<Timestamp> {
        self.deletion_asked
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::{Context, Poll};

    use futures::future::BoxFuture;
    use kube::config::{KubeConfigOptions, Kubeconfig};
    use tokio::sync::Semaphore;

    use super::*;

    /// Counts the LISTs of nodes and holds each until `gate` gives a permit.
    #[derive(Clone)]
    struct Lists {
        count: Arc<AtomicUsize>,
        gate: Arc<Semaphore>,
    }

    impl<S> tower::Layer<S> for Lists {
        type Service = Held<S>;
        fn layer(&self, inner: S) -> Held<S> {
            Held {
                inner,
                lists: self.clone(),
            }
        }
    }

    #[derive(Clone)]
    struct Held<S> {
        inner: S,
        lists: Lists,
    }

    impl<S, B> tower::Service<http::Request<B>> for Held<S>
    where
        S: tower::Service<http::Request<B>>,
        S::Future: Send + 'static,
    {
        type Response = S::Response;
        type Error = S::Error;
        type Future = BoxFuture<'static, Result<S::Response, S::Error>>;

        fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
            self.inner.poll_ready(cx)
        }

        fn call(&mut self, request: http::Request<B>) -> Self::Future {
            let listing = request.uri().path() == "/api/v1/nodes";
            if listing {
                self.lists.count.fetch_add(1, Ordering::SeqCst);
            }
            let gate = Arc::clone(&self.lists.gate);
            let response = self.inner.call(request);
            Box::pin(async move {
                if listing {
                    gate.acquire().await.expect("the gate stays open").forget();
                }
                response.await
            })
        }
    }

    /// Reads of a three-node kube-sim, each LIST counted and held until one of `permits`.
    async fn counted_reads(permits: usize) -> (kube_sim::KubeSim, Lists, Arc<FreshNodes>) {
        let sim = kube_sim::cluster::Cluster::new(3).start().await.unwrap();
        let lists = Lists {
            count: Arc::default(),
            gate: Arc::new(Semaphore::new(permits)),
        };
        let kubeconfig = Kubeconfig::read_from(sim.kubeconfig_path()).unwrap();
        let config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .unwrap();
        let client = kube::client::ClientBuilder::try_from(config)
            .unwrap()
            .with_layer(&lists)
            .build();
        let fresh = Arc::new(FreshNodes::new(Api::all(client)));
        (sim, lists, fresh)
    }

    /// A node parsed for the budgets gives every budget fact the whole Node gives.
    #[test]
    fn the_budgets_read_the_same_of_a_node_parsed_for_them() {
        let value = serde_json::json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {
                "name": "node-1", "uid": "u-1", "resourceVersion": "42",
                "creationTimestamp": "2026-11-23T09:00:00Z",
                "deletionTimestamp": "2026-11-23T10:00:00Z",
                "labels": {"pool": "a", "zone": "z1"},
                "annotations": {"note": "x"},
                "finalizers": [crate::api::FINALIZER, "other/x"],
                "managedFields": [{"manager": "kubelet", "operation": "Update"}],
            },
            "spec": {"unschedulable": true, "podCIDR": "10.0.0.0/24", "taints": [
                {"key": crate::api::DISRUPTED_TAINT, "effect": "NoSchedule"},
                {"key": "k", "value": "v", "effect": "NoExecute", "timeAdded": "2026-11-23T09:30:00Z"},
            ]},
            "status": {
                "conditions": [
                    {"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory"},
                    {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "ok",
                        "lastHeartbeatTime": "2026-11-23T09:59:00Z"},
                ],
                "capacity": {"cpu": "4"},
                "images": [{"names": ["registry/a:1"], "sizeBytes": 1}],
                "nodeInfo": {"kubeletVersion": "v1.33.0"},
            },
        });
        let whole: CachedNode = serde_json::from_value(value.clone()).unwrap();
        let page: Page = serde_json::from_value(serde_json::json!({
            "metadata": {"resourceVersion": "42"}, "items": [value],
        }))
        .unwrap();
        let parsed = page
            .items
            .into_iter()
            .map(|node| BudgetNode::from(CachedNode::from(node)))
            .next()
            .unwrap();
        assert_eq!(parsed.facts(), whole.facts());
        assert_eq!(parsed.uid(), whole.uid());
        assert_eq!(parsed.created(), whole.created());
        assert_eq!(parsed.deletion_asked(), whole.deletion_asked());
        assert_eq!(parsed, BudgetNode::from(whole));
    }

    /// Callers that asked while a read was under way share the next read; none gets a read
    /// that began before it asked.
    #[tokio::test]
    async fn callers_share_the_first_read_that_began_after_they_asked() {
        let (_sim, lists, fresh) = counted_reads(0).await;
        let read = |fresh: &Arc<FreshNodes>| {
            let fresh = Arc::clone(fresh);
            tokio::spawn(async move { fresh.read("").await.map(|nodes| nodes.len()) })
        };

        let first = read(&fresh);
        while lists.count.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        // Asked while the first read is held under way: it is too old for them.
        let (second, third) = (read(&fresh), read(&fresh));
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        lists.gate.add_permits(100);
        for caller in [first, second, third] {
            assert_eq!(caller.await.unwrap().unwrap(), 3);
        }
        assert_eq!(
            lists.count.load(Ordering::SeqCst),
            2,
            "one read for the two who waited"
        );

        assert_eq!(fresh.read("").await.unwrap().len(), 3);
        assert_eq!(
            lists.count.load(Ordering::SeqCst),
            3,
            "a later caller reads anew"
        );
    }

    /// A caller that can wait shares the next read another caller begins within its window,
    /// and reads on its own once the window has passed with none.
    #[tokio::test]
    async fn a_caller_that_can_wait_rides_on_the_next_read_begun() {
        let (_sim, lists, fresh) = counted_reads(100).await;
        let joining = {
            let fresh = Arc::clone(&fresh);
            tokio::spawn(async move {
                fresh
                    .read_joining("", Duration::from_secs(600))
                    .await
                    .map(|nodes| nodes.len())
            })
        };
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert_eq!(lists.count.load(Ordering::SeqCst), 0, "it waits to join");
        assert_eq!(fresh.read("").await.unwrap().len(), 3);
        assert_eq!(joining.await.unwrap().unwrap(), 3);
        assert_eq!(
            lists.count.load(Ordering::SeqCst),
            1,
            "one read for the two"
        );

        let alone = fresh
            .read_joining("", Duration::from_millis(20))
            .await
            .unwrap();
        assert_eq!(alone.len(), 3);
        assert_eq!(
            lists.count.load(Ordering::SeqCst),
            2,
            "with no read begun in its window it reads on its own"
        );
    }
}
