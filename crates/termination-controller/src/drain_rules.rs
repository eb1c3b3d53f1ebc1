//! Which NodeDrainRule a pod of a draining node follows, as Cluster API's MachineDrainRule
//! does it:
//!
//! - A rule applies on the nodes of any of its `nodes` terms (every node without terms) to the
//!   pods of any of its `pods` terms (every pod without terms); within a term, the pod's and
//!   its namespace's selectors must both match (null or empty selects all).
//! - Of several rules, the first by name applies (Cluster API's rule: one rule, never a mix).
//! - The pod's own `nodegrace.io/drain` label or annotation (`skip`, `wait-completed`) wins over
//!   every rule.
//! - A rule whose selector cannot be read applies to no pod (the pod is drained as without
//!   rules: never skipped or held by a rule nobody can read) and is reported.
//!
//! *Choice:* `order` sorts pods **within their tier**, not across tiers: the tiers keep a node's
//! own services (log shippers, CNI, critical add-ons) running until the workloads that use them
//! are gone, which an order chosen for one application must not undo.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use nodegrace_core::k8s::selectors::{SelectorError, selector_matches};

use crate::api::{DRAIN_OVERRIDE, DrainBehavior, NodeDrainRule};

/// The labels of an object that has none.
pub static NO_LABELS: BTreeMap<String, String> = BTreeMap::new();

/// Where a pod's drain behavior comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// No rule and no override: drained, order 0.
    Default,
    /// The NodeDrainRule of this name.
    Rule(String),
    /// The pod's own `nodegrace.io/drain` (its value).
    Override(String),
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Default => write!(f, "no rule"),
            Self::Rule(name) => write!(f, "NodeDrainRule {name}"),
            Self::Override(value) => write!(f, "{DRAIN_OVERRIDE}={value}"),
        }
    }
}

/// What the drain does with one pod, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    pub behavior: DrainBehavior,
    pub order: i32,
    pub source: Source,
}

impl Applied {
    pub const DEFAULT: Self = Self {
        behavior: DrainBehavior::Drain,
        order: 0,
        source: Source::Default,
    };
}

/// The rules that apply on one node, by name, and those that cannot be read.
#[derive(Debug, Clone, Default)]
pub struct NodeRules {
    rules: Vec<Arc<NodeDrainRule>>,
    pub invalid: Vec<(String, SelectorError)>,
}

fn selects(
    selector: Option<&LabelSelector>,
    labels: &BTreeMap<String, String>,
) -> Result<bool, SelectorError> {
    selector.map_or(Ok(true), |selector| selector_matches(selector, labels))
}

impl NodeRules {
    /// The rules of `all` that apply on a node with `node_labels`.
    pub fn for_node(all: &[Arc<NodeDrainRule>], node_labels: &BTreeMap<String, String>) -> Self {
        let mut rules = Self::default();
        for rule in all {
            if let Err(error) = readable(rule) {
                rules.invalid.push((rule.name().to_owned(), error));
                continue;
            }
            let applies = rule.spec.nodes.is_empty()
                || rule
                    .spec
                    .nodes
                    .iter()
                    .any(|term| selects(term.selector.as_ref(), node_labels).unwrap_or(false));
            if applies {
                rules.rules.push(Arc::clone(rule));
            }
        }
        rules.rules.sort_by(|a, b| a.name().cmp(b.name()));
        rules
    }

    /// What the drain does with `pod`, whose namespace has `namespace_labels`.
    pub fn applied(&self, pod: &Pod, namespace_labels: &BTreeMap<String, String>) -> Applied {
        if let Some(value) = override_of(pod) {
            let behavior = match value.trim() {
                "skip" => DrainBehavior::Skip,
                "drain" => DrainBehavior::Drain,
                _ => DrainBehavior::WaitCompleted,
            };
            return Applied {
                behavior,
                order: 0,
                source: Source::Override(value.to_owned()),
            };
        }
        let labels = pod.metadata.labels.as_ref().unwrap_or(&NO_LABELS);
        self.rules
            .iter()
            .find(|rule| {
                rule.spec.pods.is_empty()
                    || rule.spec.pods.iter().any(|term| {
                        selects(term.selector.as_ref(), labels).unwrap_or(false)
                            && selects(term.namespace_selector.as_ref(), namespace_labels)
                                .unwrap_or(false)
                    })
            })
            .map_or(Applied::DEFAULT, |rule| Applied {
                behavior: rule.spec.drain.behavior,
                order: match rule.spec.drain.behavior {
                    DrainBehavior::Drain => rule.spec.drain.order.unwrap_or_default(),
                    DrainBehavior::Skip | DrainBehavior::WaitCompleted => 0,
                },
                source: Source::Rule(rule.name().to_owned()),
            })
    }
}

/// Whether every selector of `rule` can be read (a rule is used whole or not at all).
fn readable(rule: &NodeDrainRule) -> Result<(), SelectorError> {
    let node_selectors = rule.spec.nodes.iter().map(|term| term.selector.as_ref());
    let pod_selectors = rule
        .spec
        .pods
        .iter()
        .flat_map(|term| [term.selector.as_ref(), term.namespace_selector.as_ref()]);
    for selector in node_selectors.chain(pod_selectors) {
        selects(selector, &NO_LABELS)?;
    }
    Ok(())
}

/// The pod's `nodegrace.io/drain`, label first.
fn override_of(pod: &Pod) -> Option<&str> {
    [&pod.metadata.labels, &pod.metadata.annotations]
        .into_iter()
        .find_map(|map| map.as_ref().and_then(|map| map.get(DRAIN_OVERRIDE)))
        .map(String::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rule(name: &str, spec: &serde_json::Value) -> Arc<NodeDrainRule> {
        Arc::new(
            serde_json::from_value(json!({
                "apiVersion": "nodegrace.io/v1alpha1", "kind": "NodeDrainRule",
                "metadata": {"name": name}, "spec": spec,
            }))
            .unwrap(),
        )
    }

    fn pod(labels: &serde_json::Value, annotations: &serde_json::Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "p", "namespace": "shop",
            "labels": labels, "annotations": annotations}}))
        .unwrap()
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
            .collect()
    }

    #[test]
    fn the_first_matching_rule_by_name_applies_and_the_pods_own_label_wins() {
        let rules = [
            rule(
                "z-proxies-last",
                &json!({"drain": {"behavior": "Drain", "order": 10},
                "pods": [{"selector": {"matchLabels": {"app": "proxy"}}}]}),
            ),
            rule(
                "a-jobs",
                &json!({"drain": {"behavior": "WaitCompleted"},
                "nodes": [{"selector": {"matchLabels": {"pool": "batch"}}}],
                "pods": [{"namespaceSelector": {"matchLabels": {"team": "data"}}}]}),
            ),
            rule(
                "m-skip-proxies-on-edge",
                &json!({"drain": {"behavior": "Skip"},
                "nodes": [{"selector": {"matchLabels": {"pool": "edge"}}}],
                "pods": [{"selector": {"matchLabels": {"app": "proxy"}}}]}),
            ),
        ];
        let batch = NodeRules::for_node(&rules, &labels(&[("pool", "batch")]));
        let edge = NodeRules::for_node(&rules, &labels(&[("pool", "edge")]));
        let data = labels(&[("team", "data")]);
        let shop = labels(&[("team", "shop")]);
        let proxy = pod(&json!({"app": "proxy"}), &json!({}));
        let web = pod(&json!({"app": "web"}), &json!({}));
        let cases = [
            (
                &batch,
                &proxy,
                &data,
                DrainBehavior::WaitCompleted,
                0,
                "NodeDrainRule a-jobs",
            ),
            (
                &batch,
                &proxy,
                &shop,
                DrainBehavior::Drain,
                10,
                "NodeDrainRule z-proxies-last",
            ),
            (&batch, &web, &shop, DrainBehavior::Drain, 0, "no rule"),
            (
                &edge,
                &proxy,
                &data,
                DrainBehavior::Skip,
                0,
                "NodeDrainRule m-skip-proxies-on-edge",
            ),
        ];
        for (node, pod, namespace, behavior, order, source) in cases {
            let applied = node.applied(pod, namespace);
            assert_eq!(
                (applied.behavior, applied.order, applied.source.to_string()),
                (behavior, order, source.to_owned()),
                "{:?} in {namespace:?}",
                pod.metadata.labels
            );
        }
        let overrides = [
            (
                pod(&json!({"nodegrace.io/drain": "skip"}), &json!({})),
                DrainBehavior::Skip,
            ),
            (
                pod(&json!({}), &json!({"nodegrace.io/drain": "wait-completed"})),
                DrainBehavior::WaitCompleted,
            ),
            (
                pod(&json!({"nodegrace.io/drain": "skpi"}), &json!({})),
                DrainBehavior::WaitCompleted,
            ),
            (
                pod(
                    &json!({"app": "proxy", "nodegrace.io/drain": "drain"}),
                    &json!({"nodegrace.io/drain": "skip"}),
                ),
                DrainBehavior::Drain,
            ),
        ];
        for (pod, behavior) in overrides {
            let applied = edge.applied(&pod, &shop);
            assert_eq!(applied.behavior, behavior, "{:?}", pod.metadata);
            assert!(matches!(applied.source, Source::Override(_)));
        }
    }

    #[test]
    fn a_rule_nobody_can_read_applies_to_no_pod_and_is_reported() {
        let rules = [
            rule(
                "broken-node",
                &json!({"drain": {"behavior": "Skip"},
                "nodes": [{"selector": {"matchExpressions": [{"key": "pool", "operator": "Gt"}]}}]}),
            ),
            rule(
                "broken-pod",
                &json!({"drain": {"behavior": "Skip"},
                "pods": [{"selector": {"matchExpressions": [{"key": "app", "operator": "Gt"}]}}]}),
            ),
        ];
        let node = NodeRules::for_node(&rules, &labels(&[("pool", "a")]));
        let invalid: Vec<&str> = node.invalid.iter().map(|(name, _)| name.as_str()).collect();
        assert_eq!(invalid, ["broken-node", "broken-pod"]);
        let applied = node.applied(&pod(&json!({"app": "web"}), &json!({})), &BTreeMap::new());
        assert_eq!(applied, Applied::DEFAULT);
    }
}
