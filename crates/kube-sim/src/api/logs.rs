//! `pods/{name}/log`: a container's log as plain text, with the kubelet's parameters
//! (`container`, `previous`, `tailLines`, `limitBytes`, `follow`) and its 400 answers
//! (pkg/registry/core/pod/strategy.go, LogLocation; the kubelet's GetContainerLogs).

use std::convert::Infallible;
use std::path::PathBuf;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use super::{App, Query};
use crate::error::ApiError;

/// How often a followed log is looked at for more output.
const FOLLOW_POLL: Duration = Duration::from_millis(100);

pub fn serve(app: &App, namespace: &str, name: &str, query: &Query) -> Result<Response, ApiError> {
    let pods = app.store.kind("", "pods");
    let pod = app.store.get(&pods, Some(namespace), name)?;
    let container = container_name(&pod, name, query.get("container"))?;
    let uid = pod["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let previous = query.flag("previous");
    let path = if previous {
        app.logs.previous(&uid, &container)
    } else {
        app.logs.current(&uid, &container)
    };
    let status = container_status(&pod, &container);
    let state = &status["state"];
    if previous && !path.exists() {
        return Err(ApiError::bad_request(format!(
            "previous terminated container \"{container}\" in pod \"{name}\" not found"
        )));
    }
    if !previous && !state["running"].is_object() && !state["terminated"].is_object() {
        let reason = state["waiting"]["reason"]
            .as_str()
            .unwrap_or("ContainerCreating");
        return Err(ApiError::bad_request(format!(
            "container \"{container}\" in pod \"{name}\" is waiting to start: {reason}"
        )));
    }
    let tail = query
        .get("tailLines")
        .map(|n| number(n, "tailLines"))
        .transpose()?;
    let limit = query
        .get("limitBytes")
        .map(|n| number(n, "limitBytes"))
        .transpose()?;
    let written = std::fs::read(&path).unwrap_or_default();
    let mut shown = tail_lines(&written, tail);
    if let Some(limit) = limit {
        shown.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
    }
    let follow = query.flag("follow") && !previous && state["running"].is_object();
    if !follow {
        return Ok(text_response(Body::from(shown)));
    }
    let follower = Follower {
        app: app.clone(),
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        uid,
        container,
        path,
        offset: written.len() as u64,
    };
    let first = Bytes::from(shown);
    let stream = futures::stream::unfold(
        (Some(first), Some(follower)),
        |(first, follower)| async move {
            if let Some(first) = first {
                return Some((Ok::<_, Infallible>(first), (None, follower)));
            }
            let mut follower = follower?;
            let (chunk, more) = follower.next_chunk().await;
            Some((Ok(chunk), (None, more.then_some(follower))))
        },
    );
    Ok(text_response(Body::from_stream(stream)))
}

fn text_response(body: Body) -> Response {
    (StatusCode::OK, [(header::CONTENT_TYPE, "text/plain")], body).into_response()
}

fn number(value: &str, name: &str) -> Result<u64, ApiError> {
    value.parse::<u64>().map_err(|_| {
        ApiError::bad_request(format!(
            "{name}: Invalid value: \"{value}\": must be a non-negative integer"
        ))
    })
}

/// The container asked for, or the only one; the kubelet refuses to guess among several.
fn container_name(pod: &Value, name: &str, asked: Option<&str>) -> Result<String, ApiError> {
    let names: Vec<&str> = pod["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["name"].as_str())
        .collect();
    match asked {
        Some(asked) if names.contains(&asked) => Ok(asked.to_owned()),
        Some(asked) => Err(ApiError::bad_request(format!(
            "container {asked} is not valid for pod {name}"
        ))),
        None if names.len() == 1 => Ok(names[0].to_owned()),
        None => Err(ApiError::bad_request(format!(
            "a container name must be specified for pod {name}, choose one of: [{}]",
            names.join(" ")
        ))),
    }
}

fn container_status<'a>(pod: &'a Value, container: &str) -> &'a Value {
    pod["status"]["containerStatuses"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|s| s["name"] == container)
        .unwrap_or(&Value::Null)
}

/// The last `tail` lines of `log` (all of it without a count).
fn tail_lines(log: &[u8], tail: Option<u64>) -> Vec<u8> {
    let Some(tail) = tail else {
        return log.to_vec();
    };
    let body = log.strip_suffix(b"\n").unwrap_or(log);
    let mut newlines = 0;
    for (index, byte) in body.iter().enumerate().rev() {
        if *byte == b'\n' {
            newlines += 1;
            if newlines == tail {
                return log[index + 1..].to_vec();
            }
        }
    }
    if tail == 0 { Vec::new() } else { log.to_vec() }
}

/// Follows a running container's log until the container has ended and all is sent.
struct Follower {
    app: App,
    namespace: String,
    name: String,
    uid: String,
    container: String,
    path: PathBuf,
    offset: u64,
}

impl Follower {
    fn container_running(&self) -> bool {
        let pods = self.app.store.kind("", "pods");
        self.app
            .store
            .get(&pods, Some(&self.namespace), &self.name)
            .is_ok_and(|pod| {
                pod["metadata"]["uid"] == self.uid.as_str()
                    && container_status(&pod, &self.container)["state"]["running"].is_object()
            })
    }

    fn read_more(&mut self) -> Vec<u8> {
        use std::io::{Read, Seek, SeekFrom};
        let mut more = Vec::new();
        if let Ok(mut file) = std::fs::File::open(&self.path)
            && file.seek(SeekFrom::Start(self.offset)).is_ok()
            && file.read_to_end(&mut more).is_ok()
        {
            self.offset += more.len() as u64;
        }
        more
    }

    /// The next output, and whether more may follow.
    async fn next_chunk(&mut self) -> (Bytes, bool) {
        loop {
            // Judged before reading, so output written just before the end is not lost.
            let running = self.container_running();
            let more = self.read_more();
            if !more.is_empty() {
                return (Bytes::from(more), true);
            }
            if !running {
                return (Bytes::new(), false);
            }
            tokio::time::sleep(FOLLOW_POLL).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_counts_lines_from_the_end() {
        let log = b"a\nb\nc\n";
        assert_eq!(tail_lines(log, None), log.to_vec());
        assert_eq!(tail_lines(log, Some(2)), b"b\nc\n".to_vec());
        assert_eq!(tail_lines(log, Some(5)), log.to_vec());
        assert_eq!(tail_lines(log, Some(0)), Vec::<u8>::new());
    }

    #[test]
    fn several_containers_need_a_name() {
        let pod = serde_json::json!({"spec": {"containers": [{"name": "a"}, {"name": "b"}]}});
        let error = container_name(&pod, "p", None).unwrap_err();
        assert!(error.message.contains("choose one of: [a b]"), "{error:?}");
        assert_eq!(container_name(&pod, "p", Some("b")).unwrap(), "b");
        assert!(container_name(&pod, "p", Some("c")).is_err());
    }
}
