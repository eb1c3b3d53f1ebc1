//! A chart's rendered Roles and ClusterRoles, and their rules by position: what the demo's
//! stage needs to install a chart with one rule removed, and what the least-privilege proof
//! names its rules by. A leaf, so the stage and the proof that drives it import it, not each
//! other.

use anyhow::{Context, Result, bail};
use serde_json::Value;

/// One rule of one Role or ClusterRole of a chart, by position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleRef {
    pub chart: String,
    /// `ClusterRole/<name>` or `Role/<namespace>/<name>`.
    pub role: String,
    pub index: usize,
}

/// `ClusterRole/<name>` or `Role/<namespace>/<name>` for a Role or ClusterRole, and the
/// Role's namespace; a Role that names none is in `namespace`, the one it was rendered for.
pub fn role_of(object: &Value, namespace: &str) -> Option<(String, Option<String>)> {
    let name = object["metadata"]["name"].as_str()?;
    match object["kind"].as_str()? {
        "ClusterRole" => Some((format!("ClusterRole/{name}"), None)),
        "Role" => {
            let namespace = object["metadata"]["namespace"]
                .as_str()
                .unwrap_or(namespace);
            Some((
                format!("Role/{namespace}/{name}"),
                Some(namespace.to_owned()),
            ))
        }
        _ => None,
    }
}

/// The rendered objects with the one rule removed.
pub fn without(objects: &[Value], rule: &RuleRef, namespace: &str) -> Result<Vec<Value>> {
    let mut trimmed = objects.to_vec();
    let object = trimmed
        .iter_mut()
        .find(|object| role_of(object, namespace).is_some_and(|(role, _)| role == rule.role))
        .with_context(|| format!("the chart has no {}", rule.role))?;
    let rules = object["rules"]
        .as_array_mut()
        .with_context(|| format!("{} has no rules", rule.role))?;
    if rule.index >= rules.len() {
        bail!("{} has no rule {}", rule.role, rule.index);
    }
    rules.remove(rule.index);
    Ok(trimmed)
}
