//! Events the simulated components record about pods, shaped as client-go's legacy recorder
//! writes them (core/v1, `<object>.<unix nanos in hex>`), so `kubectl describe pod` shows the
//! usual history: Scheduled, Pulled, Created, Started, Killing.

use serde_json::{Value, json};

use crate::store::Store;
use crate::store::timestamps::now_rfc3339;

/// Who records an event: the component and the host it runs on.
#[derive(Debug, Clone, Copy)]
pub struct Source<'a> {
    pub component: &'a str,
    pub host: Option<&'a str>,
}

/// Records a Normal event about `pod`, optionally about one of its containers.
pub fn record(
    store: &Store,
    source: Source<'_>,
    pod: &Value,
    container: Option<&str>,
    reason: &str,
    message: &str,
) {
    write(store, source, pod, container, "Normal", reason, message);
}

/// Records a Warning event about `pod`.
pub fn warn(store: &Store, source: Source<'_>, pod: &Value, reason: &str, message: &str) {
    write(store, source, pod, None, "Warning", reason, message);
}

fn write(
    store: &Store,
    source: Source<'_>,
    pod: &Value,
    container: Option<&str>,
    type_: &str,
    reason: &str,
    message: &str,
) {
    let meta = &pod["metadata"];
    let namespace = meta["namespace"].as_str().unwrap_or("default");
    let pod_name = meta["name"].as_str().unwrap_or_default();
    let nanos = jiff::Timestamp::now().as_nanosecond();
    let now = now_rfc3339();
    let mut involved = json!({
        "kind": "Pod",
        "namespace": namespace,
        "name": pod_name,
        "uid": meta["uid"],
        "apiVersion": "v1",
        "resourceVersion": meta["resourceVersion"],
    });
    if let Some(container) = container {
        involved["fieldPath"] = json!(format!("spec.containers{{{container}}}"));
    }
    let mut source_json = json!({"component": source.component});
    if let Some(host) = source.host {
        source_json["host"] = json!(host);
    }
    let event = json!({
        "metadata": {"name": format!("{pod_name}.{nanos:x}")},
        "involvedObject": involved,
        "reason": reason,
        "message": message,
        "source": source_json,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
        "type": type_,
        "reportingComponent": source.component,
        "reportingInstance": source.host.unwrap_or_default(),
    });
    // Best effort, as the recorder is: a namespace being deleted refuses new content.
    let _ = store.create(&store.kind("", "events"), Some(namespace), event);
}
