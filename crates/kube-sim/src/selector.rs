//! Label and field selectors with the API server's semantics.

use serde_json::{Map, Value};

use crate::error::ApiError;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
}

impl Requirement {
    fn matches(&self, labels: &Map<String, Value>) -> bool {
        let value = |key: &str| labels.get(key).and_then(Value::as_str);
        match self {
            Self::Equals(key, wanted) => value(key) == Some(wanted.as_str()),
            // Absent labels satisfy != and notin, as in k8s.io/apimachinery/pkg/labels.
            Self::NotEquals(key, unwanted) => value(key) != Some(unwanted.as_str()),
            Self::In(key, values) => value(key).is_some_and(|v| values.iter().any(|w| w == v)),
            Self::NotIn(key, values) => !value(key).is_some_and(|v| values.iter().any(|w| w == v)),
            Self::Exists(key) => labels.contains_key(key),
            Self::DoesNotExist(key) => !labels.contains_key(key),
        }
    }
}

/// A label selector; `Nothing` (a null metav1.LabelSelector) matches no object, while an empty
/// one matches every object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LabelSelector {
    Nothing,
    All(Vec<Requirement>),
}

impl Default for LabelSelector {
    fn default() -> Self {
        Self::All(Vec::new())
    }
}

fn bad_selector(text: &str, why: &str) -> ApiError {
    ApiError::bad_request(format!(
        "unable to parse requirement: {why} (in selector {text:?})"
    ))
}

impl LabelSelector {
    /// Parses the query-string form: `a=b,c!=d,e in (f,g),!h,i`.
    pub fn parse(text: &str) -> Result<Self, ApiError> {
        let mut requirements = Vec::new();
        for term in split_terms(text) {
            let term = term.trim();
            if term.is_empty() {
                continue;
            }
            requirements.push(parse_term(term).map_err(|why| bad_selector(text, &why))?);
        }
        Ok(Self::All(requirements))
    }

    /// Converts a `metav1.LabelSelector` object (`matchLabels`, `matchExpressions`).
    pub fn from_object(selector: &Value) -> Result<Self, ApiError> {
        if selector.is_null() {
            return Ok(Self::Nothing);
        }
        let mut requirements = Vec::new();
        if let Some(labels) = selector["matchLabels"].as_object() {
            for (key, value) in labels {
                requirements.push(Requirement::Equals(
                    key.clone(),
                    value.as_str().unwrap_or_default().to_owned(),
                ));
            }
        }
        for expression in selector["matchExpressions"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let key = expression["key"].as_str().unwrap_or_default().to_owned();
            let values = crate::json::owned_strings(&expression["values"]);
            requirements.push(match expression["operator"].as_str().unwrap_or_default() {
                "In" => Requirement::In(key, values),
                "NotIn" => Requirement::NotIn(key, values),
                "Exists" => Requirement::Exists(key),
                "DoesNotExist" => Requirement::DoesNotExist(key),
                other => {
                    return Err(ApiError::bad_request(format!(
                        "{other:?} is not a valid label selector operator"
                    )));
                }
            });
        }
        Ok(Self::All(requirements))
    }

    pub fn is_everything(&self) -> bool {
        matches!(self, Self::All(requirements) if requirements.is_empty())
    }

    pub fn matches_labels(&self, labels: &Map<String, Value>) -> bool {
        match self {
            Self::Nothing => false,
            Self::All(requirements) => requirements.iter().all(|r| r.matches(labels)),
        }
    }

    pub fn matches(&self, object: &Value) -> bool {
        static EMPTY: std::sync::LazyLock<Map<String, Value>> = std::sync::LazyLock::new(Map::new);
        self.matches_labels(object["metadata"]["labels"].as_object().unwrap_or(&EMPTY))
    }
}

/// Splits on commas outside parentheses.
fn split_terms(text: &str) -> Vec<&str> {
    let mut terms = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (index, c) in text.char_indices() {
        match c {
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
    terms
}

fn parse_term(term: &str) -> Result<Requirement, String> {
    if let Some(key) = term.strip_prefix('!') {
        return Ok(Requirement::DoesNotExist(valid_key(key.trim())?));
    }
    for (operator, make) in [
        (
            " notin ",
            Requirement::NotIn as fn(String, Vec<String>) -> Requirement,
        ),
        (" in ", Requirement::In),
    ] {
        if let Some((key, values)) = term.split_once(operator) {
            let values = values.trim();
            let inner = values
                .strip_prefix('(')
                .and_then(|v| v.strip_suffix(')'))
                .ok_or_else(|| {
                    format!(
                        "expected a parenthesised value list after {}",
                        operator.trim()
                    )
                })?;
            let values = inner.split(',').map(|v| v.trim().to_owned()).collect();
            return Ok(make(valid_key(key.trim())?, values));
        }
    }
    if let Some((key, value)) = term.split_once("!=") {
        return Ok(Requirement::NotEquals(
            valid_key(key.trim())?,
            value.trim().to_owned(),
        ));
    }
    if let Some((key, value)) = term.split_once("==").or_else(|| term.split_once('=')) {
        return Ok(Requirement::Equals(
            valid_key(key.trim())?,
            value.trim().to_owned(),
        ));
    }
    Ok(Requirement::Exists(valid_key(term)?))
}

fn valid_key(key: &str) -> Result<String, String> {
    let ok = !key.is_empty()
        && key.len() <= 317
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c));
    if ok {
        Ok(key.to_owned())
    } else {
        Err(format!("invalid label key {key:?}"))
    }
}

/// A field selector: `field=value` and `field!=value` terms, all of which must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector {
    terms: Vec<(String, bool, String)>,
}

impl FieldSelector {
    /// Parses and checks the fields against what the API server supports for `plural`.
    pub fn parse(text: &str, group: &str, plural: &str) -> Result<Self, ApiError> {
        let mut terms = Vec::new();
        for term in text.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let (field, equal, value) = if let Some((f, v)) = term.split_once("!=") {
                (f, false, v)
            } else if let Some((f, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
                (f, true, v)
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid selector: '{text}'; can't understand '{term}'"
                )));
            };
            let field = field.trim();
            if !supported(group, plural, field) {
                return Err(ApiError::bad_request(format!(
                    "field label not supported: {field}"
                )));
            }
            terms.push((field.to_owned(), equal, value.trim().to_owned()));
        }
        Ok(Self { terms })
    }

    pub fn is_everything(&self) -> bool {
        self.terms.is_empty()
    }

    /// The value an `field=value` term requires, if there is one.
    pub fn required(&self, field: &str) -> Option<&str> {
        self.terms
            .iter()
            .find(|(name, equal, _)| *equal && name == field)
            .map(|(_, _, value)| value.as_str())
    }

    pub fn matches(&self, object: &Value) -> bool {
        self.terms
            .iter()
            .all(|(field, equal, value)| (field_value(object, field) == *value) == *equal)
    }
}

fn supported(group: &str, plural: &str, field: &str) -> bool {
    if matches!(field, "metadata.name" | "metadata.namespace") {
        return true;
    }
    match (group, plural) {
        ("", "pods") => matches!(
            field,
            "spec.nodeName"
                | "spec.restartPolicy"
                | "spec.schedulerName"
                | "spec.serviceAccountName"
                | "spec.hostNetwork"
                | "status.phase"
                | "status.podIP"
                | "status.nominatedNodeName"
        ),
        ("", "nodes") => field == "spec.unschedulable",
        ("", "events") => {
            field.starts_with("involvedObject.")
                || matches!(field, "reason" | "reportingComponent" | "source" | "type")
        }
        ("", "namespaces") => field == "status.phase",
        _ => false,
    }
}

/// The field's value as the API server's field-label conversion renders it: absent strings are
/// empty, absent booleans `false`.
fn field_value(object: &Value, field: &str) -> String {
    let value = field.split('.').fold(object, |value, part| &value[part]);
    match value {
        Value::String(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::Null if matches!(field, "spec.unschedulable" | "spec.hostNetwork") => {
            "false".to_owned()
        }
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn labelled(labels: &Value) -> Value {
        json!({"metadata": {"labels": labels}})
    }

    #[test]
    fn label_selector_operators() {
        let object = labelled(&json!({"app": "web", "tier": "front"}));
        let cases = [
            ("app=web", true),
            ("app==web", true),
            ("app!=web", false),
            ("app!=db", true),
            ("missing!=x", true),
            ("app in (web,db)", true),
            ("app notin (web,db)", false),
            ("missing notin (web)", true),
            ("app", true),
            ("!app", false),
            ("!missing", true),
            ("app=web,tier=front", true),
            ("app=web,tier=back", false),
            ("app in (db, web),tier", true),
            ("", true),
        ];
        for (text, expected) in cases {
            let selector = LabelSelector::parse(text).unwrap();
            assert_eq!(selector.matches(&object), expected, "{text}");
        }
        assert!(LabelSelector::parse("app in web").is_err());
        assert!(LabelSelector::parse("bad key=1").is_err());
    }

    #[test]
    fn label_selector_objects_null_matches_nothing_empty_everything() {
        let object = labelled(&json!({"app": "web"}));
        assert!(
            !LabelSelector::from_object(&Value::Null)
                .unwrap()
                .matches(&object)
        );
        assert!(
            LabelSelector::from_object(&json!({}))
                .unwrap()
                .matches(&object)
        );
        let selector = LabelSelector::from_object(&json!({
            "matchLabels": {"app": "web"},
            "matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}, {"key": "app", "operator": "In", "values": ["web"]}]
        }))
        .unwrap();
        assert!(selector.matches(&object));
        assert!(
            LabelSelector::from_object(
                &json!({"matchExpressions": [{"key": "a", "operator": "Gt"}]})
            )
            .is_err()
        );
    }

    #[test]
    fn field_selectors_on_pods_nodes_and_events() {
        let pod = json!({"metadata": {"name": "p", "namespace": "ns"}, "spec": {"nodeName": "n1"}, "status": {"phase": "Running"}});
        let unbound = json!({"metadata": {"name": "q", "namespace": "ns"}, "spec": {}});
        let parse = |text| FieldSelector::parse(text, "", "pods").unwrap();
        assert!(parse("spec.nodeName=n1").matches(&pod));
        assert!(!parse("spec.nodeName=n1").matches(&unbound));
        assert!(parse("spec.nodeName=").matches(&unbound));
        assert!(!parse("spec.nodeName!=n1,status.phase==Running").matches(&pod));
        assert!(parse("metadata.name=p,metadata.namespace!=kube-system").matches(&pod));
        let node = json!({"metadata": {"name": "n"}, "spec": {}});
        assert!(
            FieldSelector::parse("spec.unschedulable=false", "", "nodes")
                .unwrap()
                .matches(&node)
        );
        let event = json!({"involvedObject": {"kind": "Node", "name": "n"}});
        assert!(
            FieldSelector::parse("involvedObject.kind=Node", "", "events")
                .unwrap()
                .matches(&event)
        );
        let error = FieldSelector::parse("spec.color=red", "", "pods").unwrap_err();
        assert_eq!(error.code, 400);
        assert_eq!(error.message, "field label not supported: spec.color");
    }
}
