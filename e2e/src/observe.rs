//! What the acts read to judge an outcome: logind's inhibitor list and the Node as the API
//! server has it.

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::{Node, NodeCondition};
use kube::{Api, Client};
use nodegrace_logind::Inhibitor;

use crate::node_host::NodeHost;

/// An inhibitor as a person reads it.
pub fn describe(lock: &Inhibitor) -> String {
    format!(
        "{} lock on {} by \"{}\" (pid {}): \"{}\"",
        lock.mode, lock.what, lock.who, lock.pid, lock.why
    )
}

pub async fn inhibitors(host: &NodeHost, mode: &str) -> Result<Vec<Inhibitor>> {
    let rows = host
        .logind()?
        .list_inhibitors()
        .await
        .with_context(|| format!("list {}'s inhibitors", host.name()))?;
    Ok(rows
        .into_iter()
        .filter(|row| row.3 == mode)
        .map(Inhibitor::from)
        .collect())
}

pub async fn node(client: &Client, name: &str) -> Result<Node> {
    Api::<Node>::all(client.clone())
        .get(name)
        .await
        .with_context(|| format!("read node {name}"))
}

pub async fn node_condition(
    client: &Client,
    node_name: &str,
    condition_type: &str,
) -> Result<Option<NodeCondition>> {
    Ok(node(client, node_name)
        .await?
        .status
        .and_then(|status| status.conditions)
        .unwrap_or_default()
        .into_iter()
        .find(|condition| condition.type_ == condition_type))
}

/// `kubectl` for one condition of a node.
pub fn condition_command(node: &str, condition_type: &str) -> String {
    format!(
        "kubectl get node {node} -o jsonpath='{{.status.conditions[?(@.type==\"{condition_type}\")]}}'"
    )
}

/// The body of `GET http://<address><path>` (a program's admin endpoint).
pub async fn http_get(address: &str, path: &str) -> Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(address)
        .await
        .with_context(|| format!("connect to {address}"))?;
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    Ok(response
        .split_once("\r\n\r\n")
        .map_or(String::new(), |(_, body)| body.to_owned()))
}
