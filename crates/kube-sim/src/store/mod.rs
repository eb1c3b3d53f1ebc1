//! The object store: every object as JSON, one global resourceVersion counter, and a bounded
//! history of changes so watches can resume from a version (or get 410 Gone when it is too old).
//!
//! One lock orders every write, which is what makes the resourceVersion global and watch event
//! order identical to commit order, as etcd gives the real API server.

mod bootstrap;
mod delete;
pub(crate) mod lifecycle_validation;
pub(crate) mod names;
mod omit_empty;
mod pod_defaults;
mod pods_by_node;
pub(crate) mod strategy;
pub mod timestamps;
pub(crate) mod validation;
mod workload_defaults;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ops::Bound;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use serde_json::Value;
use tokio::sync::broadcast;

pub use delete::{DeleteOptions, FOREGROUND_FINALIZER, ORPHAN_FINALIZER, Preconditions};

use crate::error::ApiError;
use crate::resources::{Registry, ResourceType};
use pods_by_node::PodsByNode;

/// (namespace, name); the namespace is empty for cluster-scoped objects.
pub type ObjectKey = (String, String);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeKind {
    Added,
    Modified,
    Deleted,
}

impl ChangeKind {
    pub fn as_watch_type(self) -> &'static str {
        match self {
            Self::Added => "ADDED",
            Self::Modified => "MODIFIED",
            Self::Deleted => "DELETED",
        }
    }
}

/// One committed change, as watches see it.
#[derive(Debug)]
pub struct Change {
    pub kind: ChangeKind,
    /// The collection (`group/plural`).
    pub collection: String,
    pub namespace: String,
    pub object: Arc<Value>,
    /// The object before a modification or deletion, so a filtered watch can tell an object
    /// leaving its set from one entering it (the watch cache keeps prevObject for the same
    /// reason), and a continued list can read the collection as it was.
    pub previous: Option<Arc<Value>>,
    pub resource_version: u64,
}

/// Which part of an object an update may change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// The main resource: status changes are ignored for kinds with a status subresource.
    Main,
    /// The status subresource: only status changes are kept.
    Status,
}

/// A consistent page of a list.
#[derive(Debug)]
pub struct Page {
    pub items: Vec<Arc<Value>>,
    /// The key of the last item when more matches follow it.
    pub next: Option<ObjectKey>,
    pub resource_version: u64,
}

/// What a deletion did.
#[derive(Debug, Clone)]
pub enum Deletion {
    /// The object is gone; this was its last state.
    Removed(Arc<Value>),
    /// The object stays, marked for deletion (finalizers, or a pod's graceful termination).
    Marked(Arc<Value>),
}

impl Deletion {
    pub fn object(&self) -> &Arc<Value> {
        match self {
            Self::Removed(object) | Self::Marked(object) => object,
        }
    }
}

/// A watch's starting point: the changes after its version, then the live feed.
#[derive(Debug)]
pub struct Subscription {
    pub backlog: Vec<Arc<Change>>,
    pub live: broadcast::Receiver<Arc<Change>>,
    pub resource_version: u64,
}

#[derive(Debug, Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    registry: Registry,
    state: Mutex<State>,
    changes: broadcast::Sender<Arc<Change>>,
    /// DefaultTolerationSeconds admission: what created pods get for not-ready/unreachable.
    default_toleration_seconds: AtomicI64,
}

#[derive(Debug)]
struct State {
    revision: u64,
    collections: HashMap<String, BTreeMap<ObjectKey, Arc<Value>>>,
    pods_by_node: PodsByNode,
    history: VecDeque<Arc<Change>>,
    history_limit: usize,
    /// Versions at or below this are no longer in the history.
    compacted: u64,
}

impl Default for Store {
    fn default() -> Self {
        Self::new(Registry::default(), 200_000)
    }
}

impl Store {
    /// `history_limit` bounds how many changes a watch can resume across.
    pub fn new(registry: Registry, history_limit: usize) -> Self {
        // A watcher this far behind is dropped (and must re-list), as the real API server drops
        // watchers that cannot keep up.
        let (changes, _) = broadcast::channel(65_536);
        let store = Self {
            inner: Arc::new(Inner {
                registry,
                state: Mutex::new(State {
                    revision: 1,
                    collections: HashMap::new(),
                    pods_by_node: PodsByNode::default(),
                    history: VecDeque::new(),
                    history_limit: history_limit.max(1),
                    compacted: 1,
                }),
                changes,
                default_toleration_seconds: AtomicI64::new(300),
            }),
        };
        let namespaces = store.kind("", "namespaces");
        for namespace in ["default", "kube-system", "kube-public", "kube-node-lease"] {
            let object = serde_json::json!({"metadata": {"name": namespace}});
            store
                .create(&namespaces, None, object)
                .expect("the initial namespaces are valid");
        }
        bootstrap::bootstrap(&store);
        // The watch cache's window opens where its first list was taken, at the server's start:
        // a watch from an older version (`resourceVersion=1`) is too old, as on a real server.
        let mut state = store.lock();
        state.history.clear();
        state.compacted = state.revision;
        drop(state);
        store
    }

    /// Sets the `tolerationSeconds` the DefaultTolerationSeconds admission gives created pods
    /// for the not-ready and unreachable NoExecute taints (300 unless a test shortens it).
    pub fn set_default_toleration_seconds(&self, seconds: i64) {
        self.inner
            .default_toleration_seconds
            .store(seconds, Ordering::Relaxed);
    }

    pub fn registry(&self) -> &Registry {
        &self.inner.registry
    }

    /// A built-in kind by group and plural (any served version).
    pub fn kind(&self, group: &str, plural: &str) -> Arc<ResourceType> {
        self.registry()
            .find_any_version(group, plural)
            .unwrap_or_else(|| panic!("{group}/{plural} is not a served resource"))
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.inner
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The current global resourceVersion.
    pub fn revision(&self) -> u64 {
        self.lock().revision
    }

    pub fn get(
        &self,
        kind: &ResourceType,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<Arc<Value>, ApiError> {
        stored(&self.lock(), kind, &object_key(namespace, name))
    }

    /// Up to `limit` objects (0 = no limit) matching `filter`, in (namespace, name) order,
    /// starting after `after`.
    pub fn list(
        &self,
        kind: &ResourceType,
        namespace: Option<&str>,
        after: Option<&ObjectKey>,
        limit: usize,
        filter: &dyn Fn(&Value) -> bool,
    ) -> Page {
        let state = self.lock();
        let start = match (after, namespace) {
            (Some(after), _) => Bound::Excluded(after.clone()),
            (None, Some(namespace)) => Bound::Included((namespace.to_owned(), String::new())),
            (None, None) => Bound::Unbounded,
        };
        let objects = state
            .collections
            .get(&kind.key())
            .into_iter()
            .flat_map(|objects| objects.range((start.clone(), Bound::Unbounded)));
        page(objects, namespace, limit, filter, state.revision)
    }

    /// [`Self::list`] of the pods bound to `node`, read from the node's index rather than a
    /// scan of every pod.
    pub fn list_pods_on_node(
        &self,
        node: &str,
        namespace: Option<&str>,
        limit: usize,
        filter: &dyn Fn(&Value) -> bool,
    ) -> Page {
        let state = self.lock();
        let Some(pods) = state.collections.get(POD_COLLECTION) else {
            return page(std::iter::empty(), namespace, limit, filter, state.revision);
        };
        let on_node = state
            .pods_by_node
            .on(node)
            .skip_while(|key| namespace.is_some_and(|namespace| key.0.as_str() < namespace))
            .filter_map(|key| pods.get_key_value(key));
        page(on_node, namespace, limit, filter, state.revision)
    }

    /// The pods bound to `node` (for the simulated node controllers and kubelets).
    pub fn pods_on_node(&self, node: &str) -> Vec<Arc<Value>> {
        self.list_pods_on_node(node, None, 0, &|_| true).items
    }

    /// [`Self::list`] as the collection was at `revision`: the next page of a list begun then.
    /// As etcd reads a continued list at its first page's revision, every page of one list
    /// is of one moment, and a watch from that revision misses nothing; a list whose revision
    /// the history no longer reaches back to is gone (410), as after etcd's compaction.
    pub fn list_at(
        &self,
        kind: &ResourceType,
        namespace: Option<&str>,
        after: &ObjectKey,
        limit: usize,
        filter: &dyn Fn(&Value) -> bool,
        revision: u64,
    ) -> Result<Page, ApiError> {
        let state = self.lock();
        if revision < state.compacted {
            return Err(ApiError::gone(CONTINUE_TOO_OLD));
        }
        let collection = kind.key();
        // Each object changed since `revision`, as it was then: its first change since holds
        // it (none for one created since). Walked from the newest, so the first is kept.
        let mut then: BTreeMap<ObjectKey, Option<Arc<Value>>> = BTreeMap::new();
        for change in state
            .history
            .iter()
            .rev()
            .take_while(|change| change.resource_version > revision)
            .filter(|change| change.collection == collection)
        {
            let name = change.object["metadata"]["name"]
                .as_str()
                .unwrap_or_default();
            then.insert(
                (change.namespace.clone(), name.to_owned()),
                change.previous.clone(),
            );
        }
        let start = || (Bound::Excluded(after.clone()), Bound::Unbounded);
        let unchanged = state
            .collections
            .get(&collection)
            .into_iter()
            .flat_map(|objects| objects.range(start()))
            .filter(|(key, _)| !then.contains_key(*key));
        let restored = then
            .range(start())
            .filter_map(|(key, object)| object.as_ref().map(|object| (key, object)));
        Ok(page(
            merged(unchanged, restored),
            namespace,
            limit,
            filter,
            revision,
        ))
    }

    /// How many objects of the collection (in `namespace`, when given) follow `last`: for a
    /// list of every namespace, the collection's size less the `returned` items of the pages so
    /// far, as the pages do not look at the rest.
    pub fn count_after(
        &self,
        kind: &ResourceType,
        namespace: Option<&str>,
        last: &ObjectKey,
        returned: u64,
    ) -> u64 {
        let state = self.lock();
        let Some(objects) = state.collections.get(&kind.key()) else {
            return 0;
        };
        match namespace {
            None => (objects.len() as u64).saturating_sub(returned),
            Some(namespace) => objects
                .range((Bound::Excluded(last.clone()), Bound::Unbounded))
                .take_while(|(key, _)| key.0 == namespace)
                .count() as u64,
        }
    }

    pub fn create(
        &self,
        kind: &ResourceType,
        namespace: Option<&str>,
        object: Value,
    ) -> Result<Arc<Value>, ApiError> {
        let mut state = self.lock();
        let (key, object) = self.prepare_create(&state, kind, namespace, object)?;
        Ok(self.commit(&mut state, kind, key, ChangeKind::Added, object))
    }

    /// A create judged as `create` judges it (defaults, validation, a namesake's 409) but not
    /// stored: the object as it would be, without a resourceVersion (a dry run).
    pub fn create_dry_run(
        &self,
        kind: &ResourceType,
        namespace: Option<&str>,
        object: Value,
    ) -> Result<Value, ApiError> {
        let state = self.lock();
        Ok(self.prepare_create(&state, kind, namespace, object)?.1)
    }

    fn prepare_create(
        &self,
        state: &State,
        kind: &ResourceType,
        namespace: Option<&str>,
        object: Value,
    ) -> Result<(ObjectKey, Value), ApiError> {
        let namespace = namespace.unwrap_or_default();
        if kind.namespaced {
            check_namespace_open(state, namespace)?;
        }
        let mut object = object;
        let context = strategy::CreateContext {
            priority_of_class: &|class| priority_of_class(state, class),
            account_automount: &|namespace, name| account_automount(state, namespace, name),
            default_toleration_seconds: self
                .inner
                .default_toleration_seconds
                .load(Ordering::Relaxed),
        };
        strategy::prepare_create(kind, namespace, &mut object, &context)?;
        let name = object["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let key = (namespace.to_owned(), name.clone());
        if state
            .collections
            .get(&kind.key())
            .is_some_and(|objects| objects.contains_key(&key))
        {
            return Err(ApiError::already_exists(&kind.group, &kind.plural, &name));
        }
        Ok((key, object))
    }

    /// Replaces an object with what `change` makes of the current one, atomically. A
    /// `metadata.resourceVersion` in the result must match the stored one (409 otherwise); an
    /// unchanged result writes nothing.
    pub fn update(
        &self,
        kind: &ResourceType,
        namespace: Option<&str>,
        name: &str,
        part: Part,
        change: impl FnOnce(&Value) -> Result<Value, ApiError>,
    ) -> Result<Arc<Value>, ApiError> {
        let mut state = self.lock();
        let key = object_key(namespace, name);
        let current = stored(&state, kind, &key)?;
        let mut updated = change(&current)?;
        let asked_version = updated["metadata"]["resourceVersion"]
            .as_str()
            .unwrap_or_default();
        if !asked_version.is_empty() && asked_version != current["metadata"]["resourceVersion"] {
            return Err(ApiError::stale(&kind.group, &kind.plural, name));
        }
        strategy::prepare_update(kind, &current, &mut updated, part)?;
        if strip_version(&updated) == strip_version(&current) {
            return Ok(current);
        }
        if delete::ready_to_remove(&updated) {
            return Ok(self.remove(&mut state, kind, key, &updated));
        }
        Ok(self.commit(&mut state, kind, key, ChangeKind::Modified, updated))
    }

    /// Deletes following the real API server's rules (see [`delete`]).
    pub fn delete(
        &self,
        kind: &ResourceType,
        namespace: Option<&str>,
        name: &str,
        options: &DeleteOptions,
    ) -> Result<Deletion, ApiError> {
        let mut state = self.lock();
        let key = object_key(namespace, name);
        let current = stored(&state, kind, &key)?;
        options.preconditions.check(kind, name, &current)?;
        match delete::plan(kind, &current, options) {
            delete::Plan::Remove => Ok(Deletion::Removed(
                self.remove(&mut state, kind, key, &current),
            )),
            delete::Plan::Mark(marked) => {
                if marked == *current {
                    return Ok(Deletion::Marked(current));
                }
                Ok(Deletion::Marked(self.commit(
                    &mut state,
                    kind,
                    key,
                    ChangeKind::Modified,
                    marked,
                )))
            }
        }
    }

    /// Starts a watch after `resource_version` (0 = from now). Fails with 410 Gone when the
    /// history no longer reaches back that far.
    pub fn subscribe(&self, resource_version: u64) -> Result<Subscription, ApiError> {
        let state = self.lock();
        let live = self.inner.changes.subscribe();
        if resource_version == 0 {
            return Ok(Subscription {
                backlog: Vec::new(),
                live,
                resource_version: state.revision,
            });
        }
        if resource_version < state.compacted {
            return Err(ApiError::gone(format!(
                "too old resource version: {resource_version} ({})",
                state.compacted
            )));
        }
        let backlog = state
            .history
            .iter()
            .filter(|change| change.resource_version > resource_version)
            .cloned()
            .collect();
        Ok(Subscription {
            backlog,
            live,
            resource_version: state.revision,
        })
    }

    /// The collection's current objects in `namespace` (all if `None`) and a live feed starting
    /// right after them, taken atomically: what a watch from "now" needs for its initial
    /// ADDED events.
    pub fn snapshot_and_subscribe(
        &self,
        kind: &ResourceType,
        namespace: Option<&str>,
    ) -> (Vec<Arc<Value>>, Subscription) {
        let state = self.lock();
        let live = self.inner.changes.subscribe();
        let objects = state
            .collections
            .get(&kind.key())
            .map(|objects| {
                objects
                    .iter()
                    .filter(|(key, _)| namespace.is_none_or(|namespace| key.0 == namespace))
                    .map(|(_, object)| Arc::clone(object))
                    .collect()
            })
            .unwrap_or_default();
        (
            objects,
            Subscription {
                backlog: Vec::new(),
                live,
                resource_version: state.revision,
            },
        )
    }

    /// Forgets the whole change history, as etcd compaction does: every watch resuming from an
    /// older version gets 410 Gone.
    pub fn compact(&self) {
        let mut state = self.lock();
        state.history.clear();
        // A watch from the current version misses nothing: only older ones are too old.
        state.compacted = state.revision;
    }

    /// The collection's objects in one go (for controllers and benchmarks).
    pub fn all(&self, kind: &ResourceType) -> Vec<Arc<Value>> {
        self.list(kind, None, None, 0, &|_| true).items
    }

    fn commit(
        &self,
        state: &mut State,
        kind: &ResourceType,
        key: ObjectKey,
        change: ChangeKind,
        mut object: Value,
    ) -> Arc<Value> {
        state.revision += 1;
        let revision = state.revision;
        object["metadata"]["resourceVersion"] = Value::String(revision.to_string());
        let object = Arc::new(object);
        let previous = state
            .collections
            .entry(kind.key())
            .or_default()
            .insert(key.clone(), Arc::clone(&object));
        if kind.is_core_pods() {
            state
                .pods_by_node
                .record(&key, previous.as_deref(), Some(&object));
        }
        self.record(
            state,
            kind,
            key.0,
            change,
            (Arc::clone(&object), previous),
            revision,
        );
        if kind.group == "apiextensions.k8s.io" {
            self.registry().add_crd(&object);
        }
        object
    }

    fn remove(
        &self,
        state: &mut State,
        kind: &ResourceType,
        key: ObjectKey,
        last: &Value,
    ) -> Arc<Value> {
        state.revision += 1;
        let revision = state.revision;
        let previous = state
            .collections
            .get_mut(&kind.key())
            .and_then(|objects| objects.remove(&key));
        if kind.is_core_pods() {
            state.pods_by_node.record(&key, previous.as_deref(), None);
        }
        let mut last = last.clone();
        last["metadata"]["resourceVersion"] = Value::String(revision.to_string());
        let last = Arc::new(last);
        self.record(
            state,
            kind,
            key.0,
            ChangeKind::Deleted,
            (Arc::clone(&last), previous),
            revision,
        );
        if kind.group == "apiextensions.k8s.io" {
            self.registry().remove_crd(&last);
        }
        last
    }

    fn record(
        &self,
        state: &mut State,
        kind: &ResourceType,
        namespace: String,
        change: ChangeKind,
        (object, previous): (Arc<Value>, Option<Arc<Value>>),
        revision: u64,
    ) {
        let change = Arc::new(Change {
            kind: change,
            collection: kind.key(),
            namespace,
            object,
            previous,
            resource_version: revision,
        });
        if state.history.len() == state.history_limit
            && let Some(dropped) = state.history.pop_front()
        {
            // A watch from the dropped version still misses nothing (cacher: older than the
            // oldest event kept, less one, is too old).
            state.compacted = dropped.resource_version;
        }
        state.history.push_back(Arc::clone(&change));
        // No receivers is fine: nobody is watching.
        let _ = self.inner.changes.send(change);
    }
}

/// The store key of core/v1 pods ([`ResourceType::key`]).
const POD_COLLECTION: &str = "/pods";

/// What a continue token from before the history's start gets (the etcd3 store's words).
const CONTINUE_TOO_OLD: &str = "The provided continue parameter is too old to display a \
    consistent list result. You can start a new list without the continue parameter.";

/// Up to `limit` of `objects` (in key order, from where the page starts) matching `filter`,
/// within `namespace` if given.
fn page<'a>(
    objects: impl Iterator<Item = (&'a ObjectKey, &'a Arc<Value>)>,
    namespace: Option<&str>,
    limit: usize,
    filter: &dyn Fn(&Value) -> bool,
    resource_version: u64,
) -> Page {
    let mut items = Vec::new();
    let mut next = None;
    let mut last_key: Option<&ObjectKey> = None;
    for (key, object) in objects {
        if namespace.is_some_and(|namespace| key.0 != namespace) {
            break;
        }
        if !filter(object) {
            continue;
        }
        if limit > 0 && items.len() == limit {
            next = last_key.cloned();
            break;
        }
        items.push(Arc::clone(object));
        last_key = Some(key);
    }
    Page {
        items,
        next,
        resource_version,
    }
}

/// Two key-ordered sequences of distinct keys as one.
fn merged<'a>(
    left: impl Iterator<Item = (&'a ObjectKey, &'a Arc<Value>)>,
    right: impl Iterator<Item = (&'a ObjectKey, &'a Arc<Value>)>,
) -> impl Iterator<Item = (&'a ObjectKey, &'a Arc<Value>)> {
    let (mut left, mut right) = (left.peekable(), right.peekable());
    std::iter::from_fn(move || match (left.peek(), right.peek()) {
        (Some((l, _)), Some((r, _))) if r < l => right.next(),
        (Some(_), _) => left.next(),
        (None, _) => right.next(),
    })
}

fn stored(state: &State, kind: &ResourceType, key: &ObjectKey) -> Result<Arc<Value>, ApiError> {
    state
        .collections
        .get(&kind.key())
        .and_then(|objects| objects.get(key))
        .cloned()
        .ok_or_else(|| ApiError::not_found(&kind.group, &kind.plural, &key.1))
}

fn object_key(namespace: Option<&str>, name: &str) -> ObjectKey {
    (namespace.unwrap_or_default().to_owned(), name.to_owned())
}

fn strip_version(object: &Value) -> Value {
    let mut object = object.clone();
    if let Some(metadata) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        metadata.remove("resourceVersion");
    }
    object
}

fn check_namespace_open(state: &State, namespace: &str) -> Result<(), ApiError> {
    if namespace.is_empty() {
        return Err(ApiError::bad_request(
            "the namespace of the object does not match the namespace on the request",
        ));
    }
    let found = state
        .collections
        .get("/namespaces")
        .and_then(|namespaces| namespaces.get(&(String::new(), namespace.to_owned())));
    match found {
        None => Err(ApiError::not_found("", "namespaces", namespace)),
        Some(ns) if ns["metadata"]["deletionTimestamp"].is_string() => {
            Err(ApiError::forbidden(format!(
                "unable to create new content in namespace {namespace} because it is being terminated"
            )))
        }
        Some(_) => Ok(()),
    }
}

fn account_automount(state: &State, namespace: &str, name: &str) -> Option<bool> {
    state
        .collections
        .get("/serviceaccounts")
        .and_then(|accounts| accounts.get(&(namespace.to_owned(), name.to_owned())))
        .and_then(|account| account["automountServiceAccountToken"].as_bool())
}

fn priority_of_class(state: &State, class: &str) -> Option<i64> {
    match class {
        "system-node-critical" => Some(2_000_001_000),
        "system-cluster-critical" => Some(2_000_000_000),
        _ => state
            .collections
            .get("scheduling.k8s.io/priorityclasses")
            .and_then(|classes| classes.get(&(String::new(), class.to_owned())))
            .and_then(|class| class["value"].as_i64()),
    }
}
