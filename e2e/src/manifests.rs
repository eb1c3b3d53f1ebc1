//! Objects from YAML (the demo's workloads, a chart rendered by helm) created in the cluster the
//! way `kubectl create -f` would: each kind resolved through API discovery.

use anyhow::{Context, Result, anyhow};
use kube::api::{DynamicObject, PostParams};
use kube::core::GroupVersionKind;
use kube::discovery::{Scope, pinned_kind};
use kube::{Api, Client};
use serde::Deserialize;
use serde_json::Value;

/// Every non-empty document of a multi-document YAML stream.
pub fn parse_documents(yaml: &str) -> Result<Vec<Value>> {
    serde_yaml_ng::Deserializer::from_str(yaml)
        .map(Value::deserialize)
        .filter(|document| !matches!(document, Ok(Value::Null)))
        .collect::<Result<_, _>>()
        .context("parse YAML")
}

pub fn kind_of(object: &Value) -> &str {
    object["kind"].as_str().unwrap_or_default()
}

pub fn name_of(object: &Value) -> &str {
    object["metadata"]["name"].as_str().unwrap_or_default()
}

/// `Kind/name`, as kubectl prints an object.
pub fn describe(object: &Value) -> String {
    format!("{}/{}", kind_of(object), name_of(object))
}

/// `Kind/name, Kind/name, …`
pub fn describe_all<'a>(objects: impl IntoIterator<Item = &'a Value>) -> String {
    objects
        .into_iter()
        .map(describe)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Creates `object`, in `namespace` unless it names its own; returns what the server stored.
pub async fn create(client: &Client, object: &Value, namespace: &str) -> Result<Value> {
    let (group, version) = match object["apiVersion"].as_str().unwrap_or_default() {
        api_version if api_version.contains('/') => api_version
            .split_once('/')
            .map(|(g, v)| (g.to_owned(), v.to_owned()))
            .unwrap_or_default(),
        version => (String::new(), version.to_owned()),
    };
    let gvk = GroupVersionKind::gvk(&group, &version, kind_of(object));
    let (resource, capabilities) = pinned_kind(client, &gvk)
        .await
        .with_context(|| format!("the cluster does not serve {}", describe(object)))?;
    let api: Api<DynamicObject> = match capabilities.scope {
        Scope::Cluster => Api::all_with(client.clone(), &resource),
        Scope::Namespaced => Api::namespaced_with(
            client.clone(),
            object["metadata"]["namespace"]
                .as_str()
                .unwrap_or(namespace),
            &resource,
        ),
    };
    let typed: DynamicObject = serde_json::from_value(object.clone())
        .with_context(|| format!("{} is not a Kubernetes object", describe(object)))?;
    let created = api
        .create(&PostParams::default(), &typed)
        .await
        .map_err(|error| anyhow!("create {}: {error}", describe(object)))?;
    Ok(serde_json::to_value(created)?)
}

/// Creates the namespace unless it exists, as `helm install --create-namespace` does.
pub async fn ensure_namespace(client: &Client, name: &str) -> Result<()> {
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    if namespaces.get_opt(name).await?.is_none() {
        namespaces
            .create(
                &PostParams::default(),
                &serde_json::from_value(serde_json::json!({"metadata": {"name": name}}))?,
            )
            .await?;
    }
    Ok(())
}
