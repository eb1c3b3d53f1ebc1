//! Who sends a request and what they may do, as the real API server decides it: bearer tokens
//! (the admin token of the kubeconfig, ServiceAccount JWTs), impersonation headers, and RBAC.

pub mod attributes;
pub mod authenticate;
pub mod rbac;

use std::collections::BTreeMap;

use serde_json::{Value, json};

pub use attributes::Attributes;
pub use authenticate::{ADMIN_TOKEN, authenticate, impersonate};
pub use rbac::{Decision, authorize};

/// The group whose members every authorizer allows everything (system:masters).
pub const MASTERS: &str = "system:masters";
pub const AUTHENTICATED: &str = "system:authenticated";
pub const UNAUTHENTICATED: &str = "system:unauthenticated";

/// `user.Info`: the name, uid, groups and extra values a request runs as.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct User {
    pub name: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

impl User {
    /// Whoever holds the kubeconfig's token: a member of system:masters.
    pub fn admin() -> Self {
        Self {
            name: "kube-sim-admin".to_owned(),
            groups: vec![MASTERS.to_owned(), AUTHENTICATED.to_owned()],
            ..Self::default()
        }
    }

    pub fn anonymous() -> Self {
        Self {
            name: "system:anonymous".to_owned(),
            groups: vec![UNAUTHENTICATED.to_owned()],
            ..Self::default()
        }
    }

    /// The user a ServiceAccount's token authenticates as (serviceaccount.UserInfo).
    pub fn service_account(namespace: &str, name: &str, uid: &str) -> Self {
        Self {
            name: service_account_username(namespace, name),
            uid: uid.to_owned(),
            groups: service_account_groups(namespace),
            extra: BTreeMap::new(),
        }
    }

    pub fn is_master(&self) -> bool {
        self.groups.iter().any(|group| group == MASTERS)
    }

    /// `authenticationv1.UserInfo` as AdmissionReview, TokenReview and the access reviews
    /// carry it.
    pub fn to_json(&self) -> Value {
        let mut info = json!({"username": self.name, "groups": self.groups});
        if !self.uid.is_empty() {
            info["uid"] = json!(self.uid);
        }
        if !self.extra.is_empty() {
            info["extra"] = json!(self.extra);
        }
        info
    }
}

pub fn service_account_username(namespace: &str, name: &str) -> String {
    format!("system:serviceaccount:{namespace}:{name}")
}

pub fn service_account_groups(namespace: &str) -> Vec<String> {
    vec![
        "system:serviceaccounts".to_owned(),
        format!("system:serviceaccounts:{namespace}"),
        AUTHENTICATED.to_owned(),
    ]
}

/// `system:serviceaccount:<namespace>:<name>` → (namespace, name).
pub fn parse_service_account(username: &str) -> Option<(&str, &str)> {
    let rest = username.strip_prefix("system:serviceaccount:")?;
    let (namespace, name) = rest.split_once(':')?;
    (!namespace.is_empty() && !name.is_empty() && !name.contains(':')).then_some((namespace, name))
}
