//! A pod's node affinity as the scheduler's NodeAffinity plugin reads it
//! (component-helpers/scheduling/corev1/nodeaffinity): the required terms filter nodes (any
//! term, every requirement of it), the preferred terms add their weights to a node's score.
//! An empty term matches no node; a requirement the API would reject matches nothing.

use serde_json::Value;

fn affinity(spec: &Value) -> &Value {
    &spec["affinity"]["nodeAffinity"]
}

/// Whether `node` satisfies the pod's required node affinity (true when it has none).
pub fn required_by(spec: &Value, node: &Value) -> bool {
    let required = &affinity(spec)["requiredDuringSchedulingIgnoredDuringExecution"];
    if required.is_null() {
        return true;
    }
    required["nodeSelectorTerms"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|term| term_matches(term, node))
}

/// The sum of the weights of the pod's preferred terms that `node` matches.
pub fn preference(spec: &Value, node: &Value) -> i64 {
    affinity(spec)["preferredDuringSchedulingIgnoredDuringExecution"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|preferred| term_matches(&preferred["preference"], node))
        .filter_map(|preferred| preferred["weight"].as_i64())
        .sum()
}

fn requirements(term: &Value, field: &str) -> Vec<Value> {
    term[field].as_array().cloned().unwrap_or_default()
}

fn term_matches(term: &Value, node: &Value) -> bool {
    let expressions = requirements(term, "matchExpressions");
    let fields = requirements(term, "matchFields");
    if expressions.is_empty() && fields.is_empty() {
        return false;
    }
    let labels = &node["metadata"]["labels"];
    expressions
        .iter()
        .all(|requirement| label_matches(requirement, labels))
        && fields
            .iter()
            .all(|requirement| field_matches(requirement, node))
}

fn values(requirement: &Value) -> Vec<&str> {
    crate::json::strings(&requirement["values"]).collect()
}

fn label_matches(requirement: &Value, labels: &Value) -> bool {
    let Some(key) = requirement["key"].as_str() else {
        return false;
    };
    let label = labels[key].as_str();
    let values = values(requirement);
    match requirement["operator"].as_str() {
        Some("In") => label.is_some_and(|label| values.contains(&label)),
        Some("NotIn") => label.is_none_or(|label| !values.contains(&label)),
        Some("Exists") => label.is_some(),
        Some("DoesNotExist") => label.is_none(),
        Some(operator @ ("Gt" | "Lt")) => {
            let [bound] = values.as_slice() else {
                return false;
            };
            match (
                label.and_then(|label| label.parse::<i64>().ok()),
                bound.parse::<i64>(),
            ) {
                (Some(label), Ok(bound)) if operator == "Gt" => label > bound,
                (Some(label), Ok(bound)) => label < bound,
                _ => false,
            }
        }
        _ => false,
    }
}

/// Only `metadata.name` may be matched by field, with In or NotIn.
fn field_matches(requirement: &Value, node: &Value) -> bool {
    if requirement["key"] != "metadata.name" {
        return false;
    }
    let name = node["metadata"]["name"].as_str().unwrap_or_default();
    let values = values(requirement);
    match requirement["operator"].as_str() {
        Some("In") => values.contains(&name),
        Some("NotIn") => !values.contains(&name),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(name: &str, labels: &Value) -> Value {
        json!({"metadata": {"name": name, "labels": labels}})
    }

    fn requiring(terms: &Value) -> Value {
        json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}})
    }

    fn expression(key: &str, operator: &str, values: &[&str]) -> Value {
        json!({"matchExpressions": [{"key": key, "operator": operator, "values": values}]})
    }

    #[test]
    fn label_operators() {
        let ssd = node("a", &json!({"disk": "ssd", "cores": "8"}));
        let bare = node("b", &json!({}));
        let cases = [
            (expression("disk", "In", &["ssd", "nvme"]), true, false),
            (expression("disk", "NotIn", &["hdd"]), true, true),
            (expression("disk", "NotIn", &["ssd"]), false, true),
            (expression("disk", "Exists", &[]), true, false),
            (expression("disk", "DoesNotExist", &[]), false, true),
            (expression("cores", "Gt", &["4"]), true, false),
            (expression("cores", "Lt", &["4"]), false, false),
            (expression("cores", "Gt", &["4", "5"]), false, false),
            (expression("disk", "Gt", &["4"]), false, false),
            (expression("disk", "Near", &["ssd"]), false, false),
        ];
        for (term, on_ssd, on_bare) in cases {
            let spec = requiring(&json!([term]));
            assert_eq!(required_by(&spec, &ssd), on_ssd, "{term} on ssd");
            assert_eq!(required_by(&spec, &bare), on_bare, "{term} on bare");
        }
    }

    #[test]
    fn terms_are_ored_and_requirements_anded() {
        let a = node("a", &json!({"zone": "1", "disk": "ssd"}));
        let b = node("b", &json!({"zone": "2", "disk": "hdd"}));
        let both = json!({"matchExpressions": [
            {"key": "zone", "operator": "In", "values": ["1"]},
            {"key": "disk", "operator": "In", "values": ["hdd"]},
        ]});
        assert!(!required_by(&requiring(&json!([both])), &a));
        let either = json!([
            expression("zone", "In", &["1"]),
            expression("disk", "In", &["hdd"])
        ]);
        assert!(required_by(&requiring(&either), &a));
        assert!(required_by(&requiring(&either), &b));
    }

    #[test]
    fn empty_terms_match_nothing_and_no_affinity_matches_everything() {
        let a = node("a", &json!({}));
        assert!(required_by(&json!({}), &a));
        assert!(!required_by(&requiring(&json!([{}])), &a));
        assert!(!required_by(&requiring(&json!([])), &a));
    }

    #[test]
    fn fields_match_the_node_name_only() {
        let a = node("a", &json!({}));
        let by_name = |operator: &str, key: &str| {
            requiring(
                &json!([{"matchFields": [{"key": key, "operator": operator, "values": ["a"]}]}]),
            )
        };
        assert!(required_by(&by_name("In", "metadata.name"), &a));
        assert!(!required_by(&by_name("NotIn", "metadata.name"), &a));
        assert!(!required_by(&by_name("In", "metadata.uid"), &a));
        assert!(!required_by(&by_name("Exists", "metadata.name"), &a));
    }

    #[test]
    fn preferences_add_their_weights() {
        let spec = json!({"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 60, "preference": expression("disk", "In", &["ssd"])},
            {"weight": 30, "preference": expression("zone", "Exists", &[])},
            {"weight": 10, "preference": {}},
        ]}}});
        assert_eq!(
            preference(&spec, &node("a", &json!({"disk": "ssd", "zone": "1"}))),
            90
        );
        assert_eq!(preference(&spec, &node("b", &json!({"zone": "1"}))), 30);
        assert_eq!(preference(&json!({}), &node("c", &json!({}))), 0);
    }
}
