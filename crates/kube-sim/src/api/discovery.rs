//! Discovery: `/version`, `/api`, `/apis` and per-group resource lists, in the aggregated form
//! (apidiscovery.k8s.io/v2) that kubectl and kube-rs ask for first, and the legacy form.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::resources::{Registry, ResourceType};

pub fn version() -> Value {
    json!({
        "major": "1",
        "minor": "33",
        "gitVersion": "v1.33.0-kube-sim",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "go1.24",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}

pub fn api_versions() -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}],
    })
}

pub fn api_groups(registry: &Registry) -> Value {
    let mut groups: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for kind in registry.all() {
        if kind.group.is_empty() {
            continue;
        }
        let versions = groups.entry(kind.group.clone()).or_default();
        if !versions.contains(&kind.version) {
            versions.push(kind.version.clone());
        }
    }
    let groups: Vec<Value> = groups
        .into_iter()
        .map(|(group, versions)| {
            let versions: Vec<Value> = versions
                .iter()
                .map(|v| json!({"groupVersion": format!("{group}/{v}"), "version": v}))
                .collect();
            json!({"name": group, "versions": versions, "preferredVersion": versions[0]})
        })
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

fn scope(kind: &ResourceType) -> &'static str {
    if kind.namespaced {
        "Namespaced"
    } else {
        "Cluster"
    }
}

pub fn resource_list(registry: &Registry, group: &str, version: &str) -> Value {
    let mut resources = Vec::new();
    for kind in registry
        .all()
        .iter()
        .filter(|k| k.group == group && k.version == version)
    {
        let mut resource = json!({
            "name": kind.plural,
            "singularName": kind.singular,
            "namespaced": kind.namespaced,
            "kind": kind.kind,
            "verbs": kind.verbs(),
        });
        if !kind.short_names.is_empty() {
            resource["shortNames"] = json!(kind.short_names);
        }
        if !kind.categories.is_empty() {
            resource["categories"] = json!(kind.categories);
        }
        resources.push(resource);
        for sub in kind.subresources() {
            let mut entry = json!({
                "name": format!("{}/{}", kind.plural, sub.name),
                "singularName": "",
                "namespaced": kind.namespaced,
                "kind": kind.kind,
                "verbs": sub.verbs,
            });
            if let Some((group, version, response)) = sub.response {
                entry["group"] = json!(group);
                entry["version"] = json!(version);
                entry["kind"] = json!(response);
            }
            resources.push(entry);
        }
    }
    let group_version = if group.is_empty() {
        version.to_owned()
    } else {
        format!("{group}/{version}")
    };
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": resources})
}

/// The aggregated discovery version a client asked for in its Accept header
/// (`application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList`), in its order of
/// preference; `None` for the legacy documents.
pub fn aggregated_wanted(accept: &str) -> Option<&'static str> {
    accept.split(',').find_map(|media| {
        let params: Vec<&str> = media.split(';').map(str::trim).collect();
        let has = |p: &str| params.contains(&p);
        if !(has("g=apidiscovery.k8s.io") && has("as=APIGroupDiscoveryList")) {
            return None;
        }
        if has("v=v2") {
            Some("v2")
        } else if has("v=v2beta1") {
            Some("v2beta1")
        } else {
            None
        }
    })
}

/// The Content-Type of an aggregated discovery answer (clients check it to tell the two forms
/// apart).
pub fn aggregated_content_type(version: &str) -> String {
    format!("application/json;g=apidiscovery.k8s.io;v={version};as=APIGroupDiscoveryList")
}

/// A group's versions in preference order, each with its resources.
type Versions = Vec<(String, Vec<Value>)>;

/// Aggregated discovery (apiserver/pkg/endpoints/discovery/aggregated): every group, version and
/// resource in one document; `/api` holds the core group, `/apis` all others.
pub fn aggregated(registry: &Registry, core: bool, version: &str) -> Value {
    let mut groups: BTreeMap<String, Versions> = BTreeMap::new();
    for kind in registry.all() {
        if kind.group.is_empty() != core {
            continue;
        }
        let versions = groups.entry(kind.group.clone()).or_default();
        let index = versions
            .iter()
            .position(|(v, _)| *v == kind.version)
            .unwrap_or_else(|| {
                versions.push((kind.version.clone(), Vec::new()));
                versions.len() - 1
            });
        versions[index].1.push(aggregated_resource(&kind));
    }
    let items: Vec<Value> = groups
        .into_iter()
        .map(|(group, versions)| {
            let mut metadata = json!({"creationTimestamp": null});
            if !group.is_empty() {
                metadata["name"] = json!(group);
            }
            let versions: Vec<Value> = versions
                .into_iter()
                .map(|(version, resources)| {
                    json!({"version": version, "resources": resources, "freshness": "Current"})
                })
                .collect();
            json!({"metadata": metadata, "versions": versions})
        })
        .collect();
    json!({
        "kind": "APIGroupDiscoveryList",
        "apiVersion": format!("apidiscovery.k8s.io/{version}"),
        "metadata": {},
        "items": items,
    })
}

fn aggregated_resource(kind: &ResourceType) -> Value {
    let mut resource = json!({
        "resource": kind.plural,
        "responseKind": {"group": kind.group, "version": kind.version, "kind": kind.kind},
        "scope": scope(kind),
        "singularResource": kind.singular,
        "verbs": kind.verbs(),
    });
    if !kind.short_names.is_empty() {
        resource["shortNames"] = json!(kind.short_names);
    }
    if !kind.categories.is_empty() {
        resource["categories"] = json!(kind.categories);
    }
    let subresources: Vec<Value> = kind
        .subresources()
        .iter()
        .map(|sub| {
            let (group, version, response) = sub.response.unwrap_or((
                kind.group.as_str(),
                kind.version.as_str(),
                kind.kind.as_str(),
            ));
            json!({
                "subresource": sub.name,
                "responseKind": {"group": group, "version": version, "kind": response},
                "verbs": sub.verbs,
            })
        })
        .collect();
    if !subresources.is_empty() {
        resource["subresources"] = json!(subresources);
    }
    resource
}
