//! Which resource a request path names (the API server's RequestInfo and its routing):
//! group, version, resource, namespace, name and subresource, and the events.k8s.io view of
//! core Events.

use std::sync::Arc;

use super::{App, event_view};
use crate::error::ApiError;
use crate::resources::ResourceType;
use crate::store::Store;

/// What a request path names.
#[derive(Debug)]
pub(super) enum Target {
    Version,
    OpenApiV2,
    ApiVersions,
    ApiGroups,
    ResourceList {
        group: String,
        version: String,
    },
    Collection {
        kind: Arc<ResourceType>,
        namespace: Option<String>,
    },
    Object {
        kind: Arc<ResourceType>,
        namespace: Option<String>,
        name: String,
        sub: Option<String>,
    },
}

/// The core Event target behind a request to the events.k8s.io view (see event_view.rs).
pub(super) fn event_view_target(app: &App, target: &Target) -> Option<Target> {
    let core = || app.store.kind("", "events");
    match target {
        Target::Collection { kind, namespace } if event_view::is_view(kind) => {
            Some(Target::Collection {
                kind: core(),
                namespace: namespace.clone(),
            })
        }
        Target::Object {
            kind,
            namespace,
            name,
            sub,
        } if event_view::is_view(kind) => Some(Target::Object {
            kind: core(),
            namespace: namespace.clone(),
            name: name.clone(),
            sub: sub.clone(),
        }),
        _ => None,
    }
}

pub(super) fn parse_target(store: &Store, path: &str) -> Result<Target, ApiError> {
    let segments: Vec<&str> = path
        .trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    let not_found = || ApiError {
        code: 404,
        reason: "NotFound",
        message: "the server could not find the requested resource".to_owned(),
        details: None,
    };
    let (group, version, rest) = match segments.as_slice() {
        ["version"] => return Ok(Target::Version),
        ["openapi", "v2"] => return Ok(Target::OpenApiV2),
        ["api"] => return Ok(Target::ApiVersions),
        ["apis"] => return Ok(Target::ApiGroups),
        ["api", version, rest @ ..] => ("", *version, rest),
        ["apis", group, version, rest @ ..] => (*group, *version, rest),
        _ => return Err(not_found()),
    };
    let registry = store.registry();
    let find = |plural: &str| registry.find(group, version, plural);
    if rest.is_empty() {
        if registry
            .all()
            .iter()
            .any(|k| k.group == group && k.version == version)
        {
            return Ok(Target::ResourceList {
                group: group.to_owned(),
                version: version.to_owned(),
            });
        }
        return Err(not_found());
    }
    // namespaces/{ns}/{plural}[/{name}[/{sub}]] when {plural} is a namespaced kind.
    if let ["namespaces", namespace, plural, tail @ ..] = rest
        && let Some(kind) = find(plural).filter(|k| k.namespaced)
    {
        let namespace = Some((*namespace).to_owned());
        return match tail {
            [] => Ok(Target::Collection { kind, namespace }),
            [name] => Ok(Target::Object {
                kind,
                namespace,
                name: (*name).to_owned(),
                sub: None,
            }),
            [name, sub] => Ok(Target::Object {
                kind,
                namespace,
                name: (*name).to_owned(),
                sub: Some((*sub).to_owned()),
            }),
            _ => Err(not_found()),
        };
    }
    let kind = find(rest[0]).ok_or_else(not_found)?;
    match &rest[1..] {
        [] => Ok(Target::Collection {
            kind,
            namespace: None,
        }),
        [name] if !kind.namespaced => Ok(Target::Object {
            kind,
            namespace: None,
            name: (*name).to_owned(),
            sub: None,
        }),
        [name, sub] if !kind.namespaced => Ok(Target::Object {
            kind,
            namespace: None,
            name: (*name).to_owned(),
            sub: Some((*sub).to_owned()),
        }),
        _ => Err(not_found()),
    }
}
