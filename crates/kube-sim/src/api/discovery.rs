//! Discovery: `/version`, `/api`, `/apis` and per-group resource lists, in the legacy
//! (non-aggregated) form that kubectl and kube-rs fall back to.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::resources::Registry;

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

const VERBS: [&str; 8] = [
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

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
            "verbs": VERBS,
        });
        if !kind.short_names.is_empty() {
            resource["shortNames"] = json!(kind.short_names);
        }
        if !kind.categories.is_empty() {
            resource["categories"] = json!(kind.categories);
        }
        resources.push(resource);
        if kind.has_status {
            resources.push(json!({
                "name": format!("{}/status", kind.plural),
                "singularName": "",
                "namespaced": kind.namespaced,
                "kind": kind.kind,
                "verbs": ["get", "patch", "update"],
            }));
        }
        if kind.group.is_empty() && kind.plural == "pods" {
            resources.push(json!({
                "name": "pods/eviction",
                "singularName": "",
                "namespaced": true,
                "group": "policy",
                "version": "v1",
                "kind": "Eviction",
                "verbs": ["create"],
            }));
        }
    }
    let group_version = if group.is_empty() {
        version.to_owned()
    } else {
        format!("{group}/{version}")
    };
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": resources})
}
