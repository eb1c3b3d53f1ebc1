//! Watches: a chunked stream of `{"type": …, "object": …}` lines, from a resourceVersion (the
//! kept history is replayed) or from now (the current objects come first as ADDED), with
//! bookmarks, `timeoutSeconds`, and 410 Gone as an ERROR event for versions too old. A watch
//! list (`sendInitialEvents=true`, what client-go's reflectors send by default since 1.35), with
//! the `WatchList` feature gate on (off by default in 1.33), starts with the current objects as
//! ADDED and then a BOOKMARK annotated `k8s.io/initial-events-end`, which is when the client's
//! cache counts as synced.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::mpsc;

use super::render::{self, Rendering};
use super::{App, Query, objects, table};
use crate::error::{ApiError, Cause};
use crate::resources::ResourceType;
use crate::store::{Change, ChangeKind};

pub fn serve(
    app: &App,
    kind: &Arc<ResourceType>,
    namespace: Option<&str>,
    query: &Query,
    rendering: Rendering,
) -> Result<Response, ApiError> {
    // Subscribed first: a close of the watches from here on ends this one too, even one that
    // comes while its initial events are still being sent.
    let closed = app.faults.watches_closed();
    let matches = objects::filter(kind, query)?;
    let from = query.resource_version()?;
    let watch_list = initial_events(query, app.watch_list)?;
    let (initial, subscription) = if from == 0 || watch_list {
        let (objects, subscription) = app.store.snapshot_and_subscribe(kind, namespace);
        let initial: Vec<(ChangeKind, Arc<Value>)> = objects
            .into_iter()
            .filter(|o| matches(o))
            .map(|o| (ChangeKind::Added, o))
            .collect();
        (initial, subscription)
    } else {
        match app.store.subscribe(from) {
            Ok(subscription) => (Vec::new(), subscription),
            Err(gone) => return Ok(stream_response(error_event_stream(&gone))),
        }
    };
    let (sender, receiver) = mpsc::channel::<Bytes>(256);
    let watch = Watch {
        kind: Arc::clone(kind),
        namespace: namespace.map(str::to_owned),
        matches: Box::new(matches),
        filtered: query.get("labelSelector").is_some() || query.get("fieldSelector").is_some(),
        rendering,
        bookmarks: query
            .flag("allowWatchBookmarks")
            .then_some(app.bookmark_interval),
        timeout: query.timeout(),
        closed,
        initial_events_end: watch_list,
    };
    tokio::spawn(watch.run(initial, subscription, sender));
    let body = futures::stream::unfold(receiver, |mut receiver| async move {
        receiver
            .recv()
            .await
            .map(|chunk| (Ok::<_, Infallible>(chunk), receiver))
    });
    Ok(stream_response(Body::from_stream(body)))
}

/// Whether the watch sends its initial events then marks their end (apimachinery's
/// `validateWatchOptions`: either `sendInitialEvents` value needs
/// `resourceVersionMatch=NotOlderThan`, bookmarks, and the `WatchList` feature gate).
fn initial_events(query: &Query, watch_list: bool) -> Result<bool, ApiError> {
    let Some(send) = query.get("sendInitialEvents") else {
        return Ok(false);
    };
    let mut causes = Vec::new();
    if query.get("resourceVersionMatch") != Some("NotOlderThan") {
        causes.push(Cause::forbidden(
            "resourceVersionMatch",
            "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
        ));
    }
    if !watch_list {
        causes.push(Cause::forbidden(
            "sendInitialEvents",
            "sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled",
        ));
    }
    if !query.flag("allowWatchBookmarks") {
        causes.push(Cause::forbidden(
            "allowWatchBookmarks",
            "sendInitialEvents requires setting allowWatchBookmarks to true",
        ));
    }
    if !causes.is_empty() {
        return Err(ApiError::invalid("meta.k8s.io", "ListOptions", "", &causes));
    }
    Ok(matches!(send, "true" | "1"))
}

fn stream_response(body: Body) -> Response {
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "application/json"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

fn error_event_stream(error: &ApiError) -> Body {
    let line = json!({"type": "ERROR", "object": error.to_status()});
    Body::from(format!("{line}\n"))
}

struct Watch {
    kind: Arc<ResourceType>,
    namespace: Option<String>,
    matches: Box<dyn Fn(&Value) -> bool + Send>,
    /// With selectors, objects can enter and leave the watched set.
    filtered: bool,
    rendering: Rendering,
    bookmarks: Option<Duration>,
    timeout: Option<Duration>,
    closed: tokio::sync::watch::Receiver<u64>,
    /// A watch list: a bookmark marks the end of the initial events.
    initial_events_end: bool,
}

impl Watch {
    fn line(&self, kind: &str, object: &Arc<Value>) -> Bytes {
        let object = match self.rendering {
            Rendering::Table if kind != "BOOKMARK" => {
                let revision = object["metadata"]["resourceVersion"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                table::table(&self.kind, std::slice::from_ref(object), &revision, None)
            }
            Rendering::Metadata => render::partial(object),
            _ => (**object).clone(),
        };
        let mut line =
            serde_json::to_vec(&json!({"type": kind, "object": object})).unwrap_or_default();
        line.push(b'\n');
        Bytes::from(line)
    }

    fn concerns(&self, change: &Change) -> bool {
        change.collection == self.kind.key()
            && self
                .namespace
                .as_deref()
                .is_none_or(|namespace| namespace == change.namespace)
    }

    /// The event to send for a change. With selectors, an object entering the selected set is
    /// ADDED and one leaving it DELETED, judged on its state before and after the change, as the
    /// watch cache does (apiserver/pkg/storage/cacher/cache_watcher.go, convertToWatchEvent).
    fn event_for(&self, change: &Change) -> Option<&'static str> {
        if !self.filtered {
            return Some(change.kind.as_watch_type());
        }
        let (before, now) = match change.kind {
            ChangeKind::Added => (false, (self.matches)(&change.object)),
            ChangeKind::Modified => (
                change
                    .previous
                    .as_deref()
                    .is_some_and(|p| (self.matches)(p)),
                (self.matches)(&change.object),
            ),
            ChangeKind::Deleted => ((self.matches)(&change.object), false),
        };
        match (before, now) {
            (false, true) => Some("ADDED"),
            (true, true) => Some("MODIFIED"),
            (true, false) => Some("DELETED"),
            (false, false) => None,
        }
    }

    async fn run(
        mut self,
        initial: Vec<(ChangeKind, Arc<Value>)>,
        subscription: crate::store::Subscription,
        sender: mpsc::Sender<Bytes>,
    ) {
        let mut seen = subscription.resource_version;
        for (kind, object) in &initial {
            if sender
                .send(self.line(kind.as_watch_type(), object))
                .await
                .is_err()
            {
                return;
            }
        }
        if self.initial_events_end {
            let marker = Arc::new(json!({
                "kind": self.kind.kind,
                "apiVersion": self.kind.api_version(),
                "metadata": {
                    "resourceVersion": seen.to_string(),
                    "annotations": {"k8s.io/initial-events-end": "true"},
                },
            }));
            if sender.send(self.line("BOOKMARK", &marker)).await.is_err() {
                return;
            }
        }
        let mut live = subscription.live;
        let backlog = subscription.backlog;
        for change in &backlog {
            seen = seen.max(change.resource_version);
            if self.concerns(change)
                && let Some(event) = self.event_for(change)
                && sender.send(self.line(event, &change.object)).await.is_err()
            {
                return;
            }
        }
        let deadline = self
            .timeout
            .map(|timeout| tokio::time::Instant::now() + timeout);
        let mut bookmark =
            tokio::time::interval(self.bookmarks.unwrap_or(Duration::from_secs(3600)));
        bookmark.tick().await;
        loop {
            let until_deadline = async {
                match deadline {
                    Some(deadline) => tokio::time::sleep_until(deadline).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = until_deadline => return,
                () = sender.closed() => return,
                // The generation only grows: any change since the subscription is a close.
                _ = self.closed.changed() => return,
                _ = bookmark.tick(), if self.bookmarks.is_some() => {
                    let marker = Arc::new(json!({
                        "kind": self.kind.kind,
                        "apiVersion": self.kind.api_version(),
                        "metadata": {"resourceVersion": seen.to_string()},
                    }));
                    if sender.send(self.line("BOOKMARK", &marker)).await.is_err() {
                        return;
                    }
                }
                received = live.recv() => match received {
                    Ok(change) => {
                        if change.resource_version <= seen {
                            continue;
                        }
                        seen = change.resource_version;
                        if self.concerns(&change)
                            && let Some(event) = self.event_for(&change)
                            && sender.send(self.line(event, &change.object)).await.is_err()
                        {
                            return;
                        }
                    }
                    // Too slow to keep up, or the store is gone: end the watch; the client
                    // resumes from its last version.
                    Err(RecvError::Lagged(_) | RecvError::Closed) => return,
                },
            }
        }
    }
}
