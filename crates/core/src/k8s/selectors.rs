//! Label selectors as `metav1.LabelSelectorAsSelector` reads them, and which
//! PodDisruptionBudgets cover a pod (the disruption controller's `getPdbsForPod`).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    #[error(
        "label selector: unknown operator {0:?} in matchExpressions (use In, NotIn, Exists or DoesNotExist)"
    )]
    Operator(String),
    #[error("label selector: operator {operator} on key {key:?} needs {needs}")]
    Values {
        key: String,
        operator: String,
        needs: &'static str,
    },
}

/// Parses a selector in kubectl's `-l` syntax (`pool=a,zone in (x,y),!spot,tier!=db`) into a
/// `LabelSelector`; an empty text selects everything.
pub fn parse_selector(text: &str) -> Result<LabelSelector, String> {
    let mut terms = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (index, character) in text.char_indices() {
        match character {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                terms.push(&text[start..index]);
                start = index + 1;
            }
            _ => {}
        }
    }
    terms.push(&text[start..]);
    let mut selector = LabelSelector::default();
    let requirement =
        |key: &str, operator: &str, values: Option<Vec<String>>| LabelSelectorRequirement {
            key: key.trim().to_owned(),
            operator: operator.to_owned(),
            values,
        };
    for term in terms
        .iter()
        .map(|term| term.trim())
        .filter(|term| !term.is_empty())
    {
        let invalid = || {
            format!(
                "{term:?} is not a label selector term; use key=value, key!=value, key, !key, \
                 key in (a,b) or key notin (a,b)"
            )
        };
        let set = |rest: &str| -> Option<Vec<String>> {
            let inner = rest.trim().strip_prefix('(')?.strip_suffix(')')?;
            let values: Vec<String> = inner
                .split(',')
                .map(|value| value.trim().to_owned())
                .collect();
            values
                .iter()
                .all(|value| !value.is_empty())
                .then_some(values)
        };
        let expression = if let Some((key, value)) = term.split_once("!=") {
            requirement(key, "NotIn", Some(vec![value.trim().to_owned()]))
        } else if let Some((key, value)) = term.split_once("==").or_else(|| term.split_once('=')) {
            selector
                .match_labels
                .get_or_insert_with(BTreeMap::new)
                .insert(key.trim().to_owned(), value.trim().to_owned());
            continue;
        } else if let Some((key, rest)) = term.split_once(" notin ") {
            requirement(key, "NotIn", Some(set(rest).ok_or_else(invalid)?))
        } else if let Some((key, rest)) = term.split_once(" in ") {
            requirement(key, "In", Some(set(rest).ok_or_else(invalid)?))
        } else if let Some(key) = term.strip_prefix('!') {
            requirement(key, "DoesNotExist", None)
        } else {
            requirement(term, "Exists", None)
        };
        if expression.key.is_empty() || expression.key.contains(char::is_whitespace) {
            return Err(invalid());
        }
        selector
            .match_expressions
            .get_or_insert_with(Vec::new)
            .push(expression);
    }
    Ok(selector)
}

/// Whether `labels` satisfy `selector`. An empty selector (no labels, no expressions) selects
/// everything; callers decide what a missing (null) selector means.
/// Whether `selector` selects `node` by its labels (a selector that cannot be read selects
/// nothing).
pub fn selects_node(selector: &LabelSelector, node: &impl kube::Resource) -> bool {
    let empty = BTreeMap::new();
    let labels = node.meta().labels.as_ref().unwrap_or(&empty);
    selector_matches(selector, labels).unwrap_or(false)
}

pub fn selector_matches(
    selector: &LabelSelector,
    labels: &BTreeMap<String, String>,
) -> Result<bool, SelectorError> {
    let labels_match = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(key, value)| labels.get(key) == Some(value));
    let mut expressions_match = true;
    for expression in selector.match_expressions.iter().flatten() {
        let values = expression.values.as_deref().unwrap_or_default();
        let needs = |needs| SelectorError::Values {
            key: expression.key.clone(),
            operator: expression.operator.clone(),
            needs,
        };
        let present = labels.get(&expression.key);
        let matched = match expression.operator.as_str() {
            "In" | "NotIn" if values.is_empty() => return Err(needs("at least one value")),
            "Exists" | "DoesNotExist" if !values.is_empty() => return Err(needs("no values")),
            "In" => present.is_some_and(|value| values.contains(value)),
            "NotIn" => present.is_none_or(|value| !values.contains(value)),
            "Exists" => present.is_some(),
            "DoesNotExist" => present.is_none(),
            other => return Err(SelectorError::Operator(other.to_owned())),
        };
        expressions_match &= matched;
    }
    Ok(labels_match && expressions_match)
}

/// The budgets of the pod's namespace whose selector matches it. In policy/v1 an empty
/// selector covers every pod of the namespace and a null one covers none; a budget with an
/// invalid selector covers none (the disruption controller skips it too).
pub fn pdbs_for_pod<'a>(
    pod: &Pod,
    budgets: impl IntoIterator<Item = &'a PodDisruptionBudget>,
) -> Vec<&'a PodDisruptionBudget> {
    let empty = BTreeMap::new();
    let labels = pod.metadata.labels.as_ref().unwrap_or(&empty);
    budgets
        .into_iter()
        .filter(|pdb| pdb.metadata.namespace == pod.metadata.namespace)
        .filter(|pdb| {
            pdb.spec
                .as_ref()
                .and_then(|spec| spec.selector.as_ref())
                .is_some_and(|selector| selector_matches(selector, labels).unwrap_or(false))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn selector(value: &serde_json::Value) -> LabelSelector {
        serde_json::from_value(value.clone()).unwrap()
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn selectors_match_as_the_api_server_reads_them() {
        let app_web = labels(&[("app", "web"), ("tier", "front")]);
        let cases = [
            (json!({}), true),
            (json!({"matchLabels": {"app": "web"}}), true),
            (json!({"matchLabels": {"app": "db"}}), false),
            (
                json!({"matchExpressions": [{"key": "app", "operator": "In", "values": ["db", "web"]}]}),
                true,
            ),
            (
                json!({"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["web"]}]}),
                false,
            ),
            (
                json!({"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["a"]}]}),
                true,
            ),
            (
                json!({"matchExpressions": [{"key": "tier", "operator": "Exists"}]}),
                true,
            ),
            (
                json!({"matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]}),
                false,
            ),
            (
                json!({"matchLabels": {"app": "web"}, "matchExpressions": [{"key": "tier", "operator": "In", "values": ["back"]}]}),
                false,
            ),
        ];
        for (value, expected) in cases {
            assert_eq!(
                selector_matches(&selector(&value), &app_web),
                Ok(expected),
                "{value}"
            );
        }
    }

    #[test]
    fn kubectl_selector_syntax_parses_into_a_label_selector() {
        let parsed = parse_selector("pool=a, zone in (x, y),!spot,tier!=db,gpu").unwrap();
        let node = |pairs: &[(&str, &str)]| selector_matches(&parsed, &labels(pairs)).unwrap();
        assert!(node(&[("pool", "a"), ("zone", "y"), ("gpu", "1")]));
        assert!(!node(&[
            ("pool", "a"),
            ("zone", "y"),
            ("gpu", "1"),
            ("spot", "")
        ]));
        assert!(!node(&[("pool", "a"), ("zone", "z"), ("gpu", "1")]));
        assert!(!node(&[
            ("pool", "a"),
            ("zone", "x"),
            ("gpu", "1"),
            ("tier", "db")
        ]));
        assert_eq!(parse_selector(" ").unwrap(), LabelSelector::default());
        let error = parse_selector("zone in x").unwrap_err();
        assert!(error.contains("key in (a,b)"), "{error}");
    }

    #[test]
    fn malformed_expressions_are_errors_that_name_the_fix() {
        let unknown =
            json!({"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]});
        let error = selector_matches(&selector(&unknown), &labels(&[])).unwrap_err();
        assert!(error.to_string().contains("use In, NotIn"), "{error}");
        let no_values = json!({"matchExpressions": [{"key": "a", "operator": "In"}]});
        let error = selector_matches(&selector(&no_values), &labels(&[])).unwrap_err();
        assert!(error.to_string().contains("at least one value"), "{error}");
    }

    #[test]
    fn budgets_cover_pods_of_their_namespace_only_and_null_selects_none() {
        let pdb =
            |name: &str, namespace: &str, selector: serde_json::Value| -> PodDisruptionBudget {
                let mut spec = json!({});
                if !selector.is_null() {
                    spec["selector"] = selector;
                }
                serde_json::from_value(json!({
                    "metadata": {"name": name, "namespace": namespace},
                    "spec": spec,
                }))
                .unwrap()
            };
        let budgets = [
            pdb("web", "shop", json!({"matchLabels": {"app": "web"}})),
            pdb("everything", "shop", json!({})),
            pdb("nothing", "shop", serde_json::Value::Null),
            pdb("elsewhere", "other", json!({})),
            pdb(
                "broken",
                "shop",
                json!({"matchExpressions": [{"key": "a", "operator": "Gt"}]}),
            ),
        ];
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "web-1", "namespace": "shop", "labels": {"app": "web"}},
        }))
        .unwrap();
        let names: Vec<&str> = pdbs_for_pod(&pod, &budgets)
            .iter()
            .filter_map(|pdb| pdb.metadata.name.as_deref())
            .collect();
        assert_eq!(names, ["web", "everything"]);
    }
}
