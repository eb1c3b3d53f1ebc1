//! Fresh reads of the nodes (quorum LISTs by label selector, in trimmed pages), shared: each
//! caller gets a read that began after it asked, never an older one, so the nodes checking one
//! budget at once — a rollout's pass grants a hundred, and each checks its budget before its
//! cordon — cost one or two reads between them, not one each. A read per node cost a rollout of
//! 5,000 nodes a LIST of 5,000 nodes per node: 5 GB of memory and most of its CPU.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::ListParams;
use nodegrace_core::k8s::nodes::trim_for_cache;

/// Nodes per page (client-go's informers list 500 at a time too).
const PAGE: u32 = 500;

/// One read's nodes, trimmed as the cache's are.
pub type Nodes = Arc<[Arc<Node>]>;

/// The last read of one selector; its lock is held while a read is under way.
type Slot = Arc<tokio::sync::Mutex<Option<Read>>>;

struct Read {
    began: Instant,
    nodes: Nodes,
}

pub struct FreshNodes {
    api: Api<Node>,
    /// By label selector ("" for every node).
    reads: Mutex<HashMap<String, Slot>>,
}

impl std::fmt::Debug for FreshNodes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FreshNodes").finish_non_exhaustive()
    }
}

impl FreshNodes {
    pub fn new(api: Api<Node>) -> Self {
        Self {
            api,
            reads: Mutex::default(),
        }
    }

    /// The nodes `selector` selects ("" for every node) as the API server has them, read
    /// after this call began.
    pub async fn read(&self, selector: &str) -> Result<Nodes, kube::Error> {
        let asked = Instant::now();
        let slot = Arc::clone(
            self.reads
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .entry(selector.to_owned())
                .or_default(),
        );
        let mut last = slot.lock().await;
        if let Some(read) = last.as_ref().filter(|read| read.began > asked) {
            return Ok(Arc::clone(&read.nodes));
        }
        let began = Instant::now();
        let nodes = self.list(selector).await?;
        *last = Some(Read {
            began,
            nodes: Arc::clone(&nodes),
        });
        Ok(nodes)
    }

    /// One consistent read, in pages (each of the first one's resourceVersion), each trimmed as
    /// the cache is: a read of thousands of nodes holds one page's bodies at a time.
    async fn list(&self, selector: &str) -> Result<Nodes, kube::Error> {
        let mut params = ListParams::default().limit(PAGE);
        if !selector.is_empty() {
            params = params.labels(selector);
        }
        let mut nodes = Vec::new();
        loop {
            let page = self.api.list(&params).await?;
            nodes.extend(page.items.into_iter().map(|mut node| {
                trim_for_cache(&mut node);
                Arc::new(node)
            }));
            match page.metadata.continue_.filter(|token| !token.is_empty()) {
                Some(token) => params = params.continue_token(&token),
                None => return Ok(nodes.into()),
            }
        }
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

    /// Callers that asked while a read was under way share the next read; none gets a read
    /// that began before it asked.
    #[tokio::test]
    async fn callers_share_the_first_read_that_began_after_they_asked() {
        let sim = kube_sim::cluster::Cluster::new(3).start().await.unwrap();
        let lists = Lists {
            count: Arc::default(),
            gate: Arc::new(Semaphore::new(0)),
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
}
