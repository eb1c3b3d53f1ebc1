//! The RBAC authorizer (plugin/pkg/auth/authorizer/rbac/rbac.go and its rule matching in
//! pkg/apis/rbac/v1/evaluation_helpers.go): a request is allowed when a ClusterRoleBinding, or
//! a RoleBinding in the request's namespace, binds one of the user's names to a role with a
//! rule covering it. system:masters is allowed everything, as the real server's
//! privileged-group authorizer in front of RBAC does. Aggregated roles are not assembled.

use serde_json::Value;

use crate::json::strings;

use super::User;
use super::attributes::{Attributes, Request, Resource};
use crate::error::ApiError;
use crate::store::Store;

const RBAC: &str = "rbac.authorization.k8s.io";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    /// Why: the binding that allowed it, or the bindings naming missing roles ("" otherwise).
    pub reason: String,
}

pub fn authorize(store: &Store, user: &User, attributes: &Attributes) -> Decision {
    if user.is_master() {
        return Decision {
            allowed: true,
            reason: String::new(),
        };
    }
    let mut missing = Vec::new();
    let cluster_bindings = store.all(&store.kind(RBAC, "clusterrolebindings"));
    for binding in &cluster_bindings {
        if let Some(reason) = binding_allows(store, binding, "", user, attributes, &mut missing) {
            return Decision {
                allowed: true,
                reason,
            };
        }
    }
    if let Request::Resource(resource) = &attributes.kind
        && !resource.namespace.is_empty()
    {
        let bindings = store.kind(RBAC, "rolebindings");
        let in_namespace = store
            .list(&bindings, Some(&resource.namespace), None, 0, &|_| true)
            .items;
        for binding in &in_namespace {
            if let Some(reason) = binding_allows(
                store,
                binding,
                &resource.namespace,
                user,
                attributes,
                &mut missing,
            ) {
                return Decision {
                    allowed: true,
                    reason,
                };
            }
        }
    }
    Decision {
        allowed: false,
        reason: if missing.is_empty() {
            String::new()
        } else {
            format!("RBAC: {}", missing.join(", "))
        },
    }
}

/// Why `binding` allows the request (`None`: it does not); a role it names that does not exist
/// goes to `missing`, as the real authorizer reports those.
fn binding_allows(
    store: &Store,
    binding: &Value,
    namespace: &str,
    user: &User,
    attributes: &Attributes,
    missing: &mut Vec<String>,
) -> Option<String> {
    let subjects = binding["subjects"].as_array()?;
    let subject = subjects
        .iter()
        .find(|subject| subject_matches(subject, namespace, user))?;
    let role_kind = binding["roleRef"]["kind"].as_str().unwrap_or_default();
    let role_name = binding["roleRef"]["name"].as_str().unwrap_or_default();
    let role = match role_kind {
        "ClusterRole" => store.get(&store.kind(RBAC, "clusterroles"), None, role_name),
        "Role" if !namespace.is_empty() => {
            store.get(&store.kind(RBAC, "roles"), Some(namespace), role_name)
        }
        _ => return None,
    };
    let Ok(role) = role else {
        let qualified = if role_kind == "Role" {
            "roles.rbac.authorization.k8s.io"
        } else {
            "clusterroles.rbac.authorization.k8s.io"
        };
        missing.push(format!("{qualified} \"{role_name}\" not found"));
        return None;
    };
    let covered = role["rules"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|rule| rule_allows(rule, attributes));
    covered.then(|| {
        let binding_name = binding["metadata"]["name"].as_str().unwrap_or_default();
        let binding_kind = if namespace.is_empty() {
            "ClusterRoleBinding".to_owned()
        } else {
            format!("RoleBinding \"{namespace}/")
        };
        let binding = if namespace.is_empty() {
            format!("{binding_kind} \"{binding_name}\"")
        } else {
            format!("{binding_kind}{binding_name}\"")
        };
        let subject_kind = subject["kind"].as_str().unwrap_or_default();
        let subject_name = match subject_kind {
            "ServiceAccount" => format!(
                "\"{}/{}\"",
                subject["namespace"].as_str().filter(|n| !n.is_empty()).unwrap_or(namespace),
                subject["name"].as_str().unwrap_or_default()
            ),
            _ => format!("\"{}\"", subject["name"].as_str().unwrap_or_default()),
        };
        format!("RBAC: allowed by {binding} of {role_kind} \"{role_name}\" to {subject_kind} {subject_name}")
    })
}

fn subject_matches(subject: &Value, namespace: &str, user: &User) -> bool {
    let name = subject["name"].as_str().unwrap_or_default();
    match subject["kind"].as_str() {
        Some("User") => user.name == name,
        Some("Group") => user.groups.iter().any(|group| group == name),
        Some("ServiceAccount") => {
            let account_namespace = subject["namespace"]
                .as_str()
                .filter(|n| !n.is_empty())
                .unwrap_or(namespace);
            !account_namespace.is_empty()
                && user.name == super::service_account_username(account_namespace, name)
        }
        _ => false,
    }
}

fn rule_allows(rule: &Value, attributes: &Attributes) -> bool {
    let verb = strings(&rule["verbs"]).any(|v| v == "*" || v == attributes.verb);
    if !verb {
        return false;
    }
    match &attributes.kind {
        Request::Resource(resource) => {
            strings(&rule["apiGroups"]).any(|g| g == "*" || g == resource.group)
                && resource_matches(rule, resource)
                && {
                    let mut names = strings(&rule["resourceNames"]).peekable();
                    names.peek().is_none() || names.any(|n| n == resource.name)
                }
        }
        Request::NonResource { path } => strings(&rule["nonResourceURLs"]).any(|url| {
            url == "*" || url == path || url.strip_suffix('*').is_some_and(|p| path.starts_with(p))
        }),
    }
}

fn resource_matches(rule: &Value, resource: &Resource) -> bool {
    let combined = if resource.subresource.is_empty() {
        resource.resource.clone()
    } else {
        format!("{}/{}", resource.resource, resource.subresource)
    };
    strings(&rule["resources"]).any(|r| {
        r == "*"
            || r == combined
            || (!resource.subresource.is_empty()
                && r.strip_prefix("*/") == Some(resource.subresource.as_str()))
    })
}

/// The 403 the real server answers a request its authorizers did not allow
/// (responsewriters.Forbidden).
pub fn forbidden(user: &User, attributes: &Attributes, reason: &str) -> ApiError {
    let message = match &attributes.kind {
        Request::NonResource { path } => {
            format!(
                "User \"{}\" cannot {} path \"{path}\"",
                user.name, attributes.verb
            )
        }
        Request::Resource(resource) => {
            let what = if resource.subresource.is_empty() {
                resource.resource.clone()
            } else {
                format!("{}/{}", resource.resource, resource.subresource)
            };
            let scope = if resource.namespace.is_empty() {
                "at the cluster scope".to_owned()
            } else {
                format!("in the namespace \"{}\"", resource.namespace)
            };
            format!(
                "User \"{}\" cannot {} resource \"{what}\" in API group \"{}\" {scope}",
                user.name, attributes.verb, resource.group
            )
        }
    };
    let why = if reason.is_empty() {
        message
    } else {
        format!("{message}: {reason}")
    };
    match &attributes.kind {
        Request::NonResource { .. } => ApiError::forbidden_object("", "", "", &why),
        Request::Resource(resource) => {
            ApiError::forbidden_object(&resource.group, &resource.resource, &resource.name, &why)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn get_pods(namespace: &str, name: &str) -> Attributes {
        Attributes::resource(
            "get",
            Resource {
                resource: "pods".to_owned(),
                namespace: namespace.to_owned(),
                name: name.to_owned(),
                ..Resource::default()
            },
        )
    }

    #[test]
    fn rules_match_verbs_groups_resources_and_names() {
        let rule = json!({"verbs": ["get"], "apiGroups": [""], "resources": ["pods"], "resourceNames": ["a"]});
        assert!(rule_allows(&rule, &get_pods("ns", "a")));
        assert!(!rule_allows(&rule, &get_pods("ns", "b")));
        let mut list = get_pods("ns", "");
        list.verb = "list".to_owned();
        assert!(
            !rule_allows(&rule, &list),
            "resourceNames never cover a list of all"
        );
        let subresources = json!({"verbs": ["*"], "apiGroups": ["*"], "resources": ["*/status"]});
        let mut status = get_pods("", "a");
        if let Request::Resource(resource) = &mut status.kind {
            resource.subresource = "status".to_owned();
        }
        assert!(rule_allows(&subresources, &status));
        assert!(!rule_allows(&subresources, &get_pods("", "a")));
        let urls = json!({"verbs": ["get"], "nonResourceURLs": ["/apis/*", "/version"]});
        let path = |path: &str| Attributes {
            verb: "get".to_owned(),
            kind: Request::NonResource {
                path: path.to_owned(),
            },
        };
        assert!(rule_allows(&urls, &path("/apis/apps/v1")));
        assert!(rule_allows(&urls, &path("/version")));
        assert!(!rule_allows(&urls, &path("/healthz")));
        assert!(!rule_allows(&urls, &get_pods("ns", "a")));
    }

    #[test]
    fn the_forbidden_message_is_the_api_servers() {
        let user = User::service_account("ns", "agent", "u");
        let error = forbidden(&user, &get_pods("ns", "web-0"), "");
        assert_eq!(
            error.message,
            "pods \"web-0\" is forbidden: User \"system:serviceaccount:ns:agent\" cannot get resource \"pods\" in API group \"\" in the namespace \"ns\""
        );
    }
}
