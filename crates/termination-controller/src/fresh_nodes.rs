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

#[derive(Clone)]
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
