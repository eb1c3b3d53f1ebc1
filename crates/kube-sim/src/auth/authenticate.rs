//! Authentication: the kubeconfig's admin token, ServiceAccount tokens this server issued
//! (checked as pkg/serviceaccount/jwt.go and legacy.go's validator do: signature, expiry,
//! audience, the account and the bound object still existing), no token → anonymous; then the
//! `Impersonate-*` headers (staging/src/k8s.io/apiserver/pkg/endpoints/filters/impersonation.go).

use std::collections::BTreeMap;

use http::HeaderMap;
use serde_json::Value;

use super::attributes::{Attributes, Resource};
use super::{AUTHENTICATED, UNAUTHENTICATED, User, parse_service_account, rbac};
use crate::error::ApiError;
use crate::store::Store;
use crate::tokens::{API_AUDIENCE, TokenIssuer};

/// The bearer token the kubeconfig carries: whoever holds it is a cluster admin.
pub const ADMIN_TOKEN: &str = "kube-sim";

/// Who sent the request, before impersonation (`None`: it carries no credentials).
pub fn authenticate(
    store: &Store,
    tokens: &TokenIssuer,
    headers: &HeaderMap,
) -> Result<Option<User>, ApiError> {
    let Some(authorization) = headers.get(http::header::AUTHORIZATION) else {
        return Ok(None);
    };
    let token = authorization
        .to_str()
        .ok()
        .and_then(|value| {
            let (scheme, token) = value.split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
        })
        .filter(|token| !token.is_empty())
        .ok_or_else(ApiError::unauthorized)?;
    if token == ADMIN_TOKEN {
        return Ok(Some(User::admin()));
    }
    service_account_user(store, tokens, token, &[Value::from(API_AUDIENCE)])
        .map(|(user, _)| Some(user))
        .map_err(|_| ApiError::unauthorized())
}

/// The user a ServiceAccount token stands for and the asked audiences it carries, or why it
/// stands for no one (TokenReview reports that reason).
pub fn service_account_user(
    store: &Store,
    tokens: &TokenIssuer,
    token: &str,
    wanted: &[Value],
) -> Result<(User, Vec<Value>), String> {
    let claims = tokens.verify(token).map_err(str::to_owned)?;
    let granted: Vec<Value> = claims["aud"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|aud| wanted.contains(aud))
        .cloned()
        .collect();
    if granted.is_empty() {
        return Err("token audiences is invalid for the target audiences".to_owned());
    }
    let private = &claims["kubernetes.io"];
    let namespace = private["namespace"].as_str().unwrap_or_default();
    let name = private["serviceaccount"]["name"]
        .as_str()
        .unwrap_or_default();
    let account = store
        .get(&store.kind("", "serviceaccounts"), Some(namespace), name)
        .map_err(|_| format!("serviceaccounts \"{name}\" not found"))?;
    if account["metadata"]["uid"] != private["serviceaccount"]["uid"] {
        return Err("the ServiceAccount the token was issued for no longer exists".to_owned());
    }
    let mut user = User::service_account(
        namespace,
        name,
        account["metadata"]["uid"].as_str().unwrap_or_default(),
    );
    for (kind, plural, namespaced) in [
        ("pod", "pods", true),
        ("secret", "secrets", true),
        ("node", "nodes", false),
    ] {
        let bound = &private[kind];
        let Some(bound_name) = bound["name"].as_str() else {
            continue;
        };
        let live = store.get(
            &store.kind("", plural),
            namespaced.then_some(namespace),
            bound_name,
        );
        if live.is_ok_and(|object| object["metadata"]["uid"] == bound["uid"]) {
            if kind != "secret" {
                let uid = bound["uid"].as_str().unwrap_or_default().to_owned();
                user.extra.insert(
                    format!("authentication.kubernetes.io/{kind}-name"),
                    vec![bound_name.to_owned()],
                );
                user.extra.insert(
                    format!("authentication.kubernetes.io/{kind}-uid"),
                    vec![uid],
                );
            }
        } else {
            return Err(format!(
                "{plural} \"{bound_name}\" not found or no longer the one the token was bound to"
            ));
        }
    }
    if let Some(id) = claims["jti"].as_str() {
        user.extra.insert(
            "authentication.kubernetes.io/credential-id".to_owned(),
            vec![format!("JTI={id}")],
        );
    }
    Ok((user, granted))
}

const IMPERSONATE_USER: &str = "impersonate-user";
const IMPERSONATE_UID: &str = "impersonate-uid";
const IMPERSONATE_GROUP: &str = "impersonate-group";
const IMPERSONATE_EXTRA: &str = "impersonate-extra-";

/// The user the request acts as: `requester`, or the one its `Impersonate-*` headers name when
/// the requester may impersonate each part of it.
pub fn impersonate(store: &Store, requester: User, headers: &HeaderMap) -> Result<User, ApiError> {
    let values = |name: &str| -> Vec<String> {
        headers
            .get_all(name)
            .iter()
            .filter_map(|value| value.to_str().ok())
            .map(str::to_owned)
            .collect()
    };
    let mut extra: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (name, value) in headers {
        if let Some(key) = name.as_str().strip_prefix(IMPERSONATE_EXTRA)
            && let Ok(value) = value.to_str()
        {
            let key = percent_decode(key);
            extra.entry(key).or_default().push(value.to_owned());
        }
    }
    let users = values(IMPERSONATE_USER);
    let groups = values(IMPERSONATE_GROUP);
    let uids = values(IMPERSONATE_UID);
    let Some(name) = users.first() else {
        if groups.is_empty() && extra.is_empty() && uids.is_empty() {
            return Ok(requester);
        }
        return Err(ApiError::internal(format!(
            "requested {:?} without impersonating a user",
            [groups, uids].concat()
        )));
    };
    let may = |attributes: Attributes| -> Result<(), ApiError> {
        let decision = rbac::authorize(store, &requester, &attributes);
        if decision.allowed {
            Ok(())
        } else {
            Err(rbac::forbidden(&requester, &attributes, &decision.reason))
        }
    };
    let impersonate =
        |group: &str, resource: &str, subresource: &str, namespace: &str, name: &str| {
            Attributes::resource(
                "impersonate",
                Resource {
                    group: group.to_owned(),
                    resource: resource.to_owned(),
                    subresource: subresource.to_owned(),
                    namespace: namespace.to_owned(),
                    name: name.to_owned(),
                    ..Resource::default()
                },
            )
        };
    let mut acting_groups = groups.clone();
    if let Some((namespace, account)) = parse_service_account(name) {
        may(impersonate("", "serviceaccounts", "", namespace, account))?;
        if groups.is_empty() {
            acting_groups = vec![
                "system:serviceaccounts".to_owned(),
                format!("system:serviceaccounts:{namespace}"),
            ];
        }
    } else {
        may(impersonate("", "users", "", "", name))?;
    }
    for group in &groups {
        may(impersonate("", "groups", "", "", group))?;
    }
    for (key, values) in &extra {
        for value in values {
            may(impersonate(
                "authentication.k8s.io",
                "userextras",
                key,
                "",
                value,
            ))?;
        }
    }
    for uid in &uids {
        may(impersonate("authentication.k8s.io", "uids", "", "", uid))?;
    }
    let implicit = if name == "system:anonymous" {
        UNAUTHENTICATED
    } else {
        AUTHENTICATED
    };
    if !acting_groups
        .iter()
        .any(|group| group == AUTHENTICATED || group == UNAUTHENTICATED)
    {
        acting_groups.push(implicit.to_owned());
    }
    Ok(User {
        name: name.clone(),
        uid: uids.first().cloned().unwrap_or_default(),
        groups: acting_groups,
        extra,
    })
}

/// Extra keys travel percent-encoded in header names.
fn percent_decode(text: &str) -> String {
    form_urlencoded::parse(format!("k={}", text.replace('+', "%2B")).as_bytes())
        .next()
        .map_or_else(|| text.to_owned(), |(_, value)| value.into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extra_keys_are_percent_decoded() {
        assert_eq!(
            percent_decode("authentication.kubernetes.io%2fnode-name"),
            "authentication.kubernetes.io/node-name"
        );
        assert_eq!(percent_decode("scopes"), "scopes");
    }
}
