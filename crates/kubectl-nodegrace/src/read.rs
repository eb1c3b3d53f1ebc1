//! Reading the cluster with whatever the user may read. What a 403 or a missing CRD keeps from
//! us becomes one line in [`Unread`], and the answer stands on the rest; only the nodes
//! themselves are required.

use std::fmt::Debug;

use anyhow::Context as _;
use kube::api::{ListParams, ObjectList};
use kube::{Api, Resource};
use nodegrace_core::k8s::api_errors::status_code;
use serde::de::DeserializeOwned;

/// One request, named as RBAC names it: the verb, the resource (`leases.coordination.k8s.io`)
/// and where (`in all namespaces`, `in namespace shop`, `named node-1`).
#[derive(Debug, Clone)]
pub struct Access {
    pub verb: &'static str,
    pub resource: String,
    pub scope: String,
}

impl Access {
    pub fn list<K: Resource<DynamicType = ()>>(scope: impl Into<String>) -> Self {
        Self {
            verb: "list",
            resource: resource_name::<K>(),
            scope: scope.into(),
        }
    }

    pub fn get<K: Resource<DynamicType = ()>>(scope: impl Into<String>) -> Self {
        Self {
            verb: "get",
            resource: resource_name::<K>(),
            scope: scope.into(),
        }
    }
}

impl std::fmt::Display for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {} {}", self.verb, self.resource, self.scope)
    }
}

/// `leases.coordination.k8s.io`, `nodes`: what a Role's rule names.
fn resource_name<K: Resource<DynamicType = ()>>() -> String {
    let plural = K::plural(&());
    let group = K::group(&());
    if group.is_empty() {
        plural.into_owned()
    } else {
        format!("{plural}.{group}")
    }
}

/// What could not be read, one line each, in the order met.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Unread(pub Vec<String>);

impl Unread {
    fn note(&mut self, line: String) {
        if !self.0.contains(&line) {
            self.0.push(line);
        }
    }

    pub fn extend(&mut self, other: Self) {
        for line in other.0 {
            self.note(line);
        }
    }
}

/// Why a required read failed, naming the permission when the server refused it.
pub fn required_failed(access: &Access, error: kube::Error) -> anyhow::Error {
    if status_code(&error) == Some(403) {
        anyhow::anyhow!(
            "forbidden to {access}: ask for `{}` on `{}` (docs/kubectl-nodegrace.md lists every \
             permission the plugin uses)",
            access.verb,
            access.resource
        )
    } else {
        anyhow::Error::new(error).context(format!(
            "{} {} {}",
            access.verb, access.resource, access.scope
        ))
    }
}

/// Lists, or notes why it could not: a 403 (the verb and resource to ask for) or a 404 (the
/// resource is not served: its CRD is not installed, `absent` says what that means).
pub async fn optional_list<K>(
    api: &Api<K>,
    params: &ListParams,
    access: &Access,
    absent: &str,
    unread: &mut Unread,
) -> anyhow::Result<Option<Vec<K>>>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    match api.list(params).await {
        Ok(ObjectList { items, .. }) => Ok(Some(items)),
        Err(error) => optional_failed(error, access, absent, unread).map(|()| None),
    }
}

/// Reads one object, or notes why it could not (see [`optional_list`]); `Ok(None)` as well when
/// it does not exist.
pub async fn optional_get<K>(
    api: &Api<K>,
    name: &str,
    access: &Access,
    unread: &mut Unread,
) -> anyhow::Result<Option<K>>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    match api.get_opt(name).await {
        Ok(found) => Ok(found),
        Err(error) => optional_failed(error, access, "", unread).map(|()| None),
    }
}

fn optional_failed(
    error: kube::Error,
    access: &Access,
    absent: &str,
    unread: &mut Unread,
) -> anyhow::Result<()> {
    match status_code(&error) {
        Some(403) => {
            unread.note(format!(
                "could not {access}: forbidden (ask for `{}` on `{}`); what it would tell is left out",
                access.verb, access.resource
            ));
            Ok(())
        }
        Some(404) if !absent.is_empty() => {
            unread.note(format!("{} is not served: {absent}", access.resource));
            Ok(())
        }
        _ => Err(error).with_context(|| access.to_string()),
    }
}
