//! kube-sim's control endpoints (`/sim/v1`) as the explorer calls them, and what became of an
//! event.

use anyhow::Result;
use kube::Client;
use serde_json::Value;

/// What became of an event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Done(String),
    Skipped(String),
    Failed(String),
}

/// A call of one of kube-sim's `/sim/v1` paths; a 404 is a skip.
pub async fn sim_call(
    client: &Client,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> Result<Outcome> {
    let body = match body {
        Some(body) => serde_json::to_vec(&body)?,
        None => Vec::new(),
    };
    let request = http::Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json")
        .body(body)?;
    match client.request_text(request).await {
        Ok(_) => Ok(Outcome::Done(format!("{method} {path}"))),
        Err(kube::Error::Api(status)) if status.code == 404 => {
            Ok(Outcome::Skipped(format!("{path}: not found")))
        }
        Err(error) => Err(error.into()),
    }
}

/// A GET of one of kube-sim's `/sim/v1` paths, as text.
pub async fn sim_get(client: &Client, path: &str) -> Result<String> {
    let request = http::Request::get(path).body(Vec::new())?;
    Ok(client.request_text(request).await?)
}
