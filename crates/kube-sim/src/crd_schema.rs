//! CustomResourceDefinition schemas, as apiextensions-apiserver applies them to custom objects:
//! unknown fields pruned (kept under `x-kubernetes-preserve-unknown-fields`; refused under
//! `fieldValidation=Strict`, kubectl's default), `default`s filled in, then validated: type,
//! required, enum, minimum/maximum, maxLength, pattern, minItems/maxItems,
//! `x-kubernetes-int-or-string`, and CEL rules (`x-kubernetes-validations`, with `self`, and
//! `oldSelf` for transition rules, evaluated by the cel-interpreter crate).

use cel_interpreter::{Context, Program};
use serde_json::Value;

use crate::error::{ApiError, Cause};

/// Compiles a CEL rule. The parser panics on some malformed input (antlr4rust), which must be
/// a 422 for the CRD, never a crashed request.
pub(crate) fn compile(source: &str) -> Result<Program, String> {
    std::panic::catch_unwind(|| Program::compile(source))
        .map_err(|_| "syntax error".to_owned())?
        .map_err(|error| error.to_string())
}

/// Every CEL rule of a schema, with its location.
fn rules<'v>(schema: &'v Value, path: &str, found: &mut Vec<(String, &'v Value)>) {
    match schema {
        Value::Object(map) => {
            for (index, rule) in map
                .get("x-kubernetes-validations")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .enumerate()
            {
                found.push((
                    format!("{path}.x-kubernetes-validations[{index}].rule"),
                    rule,
                ));
            }
            for (key, value) in map {
                if key != "x-kubernetes-validations" {
                    rules(value, &format!("{path}.{key}"), found);
                }
            }
        }
        Value::Array(items) => {
            for (index, item) in items.iter().enumerate() {
                rules(item, &format!("{path}[{index}]"), found);
            }
        }
        _ => {}
    }
}

/// Checks a CRD before it is stored: every version has a schema, and every CEL rule compiles.
pub fn validate_crd(crd: &Value) -> Result<(), ApiError> {
    let name = crd["metadata"]["name"].as_str().unwrap_or_default();
    let mut causes = Vec::new();
    for (index, version) in crd["spec"]["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let path = format!("spec.versions[{index}].schema.openAPIV3Schema");
        let schema = &version["schema"]["openAPIV3Schema"];
        if schema.is_null() {
            causes.push(Cause {
                reason: "FieldValueRequired",
                field: path.clone(),
                message: "Required value: schemas are required".to_owned(),
            });
            continue;
        }
        let mut found = Vec::new();
        rules(schema, &path, &mut found);
        for (field, rule) in found {
            let source = rule["rule"].as_str().unwrap_or_default();
            if let Err(error) = compile(source) {
                causes.push(Cause {
                    reason: "FieldValueInvalid",
                    field,
                    message: format!(
                        "Invalid value: {}: compilation failed: {error}",
                        Value::String(source.to_owned())
                    ),
                });
            }
        }
    }
    if causes.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid(
            "apiextensions.k8s.io",
            "CustomResourceDefinition",
            name,
            &causes,
        ))
    }
}

/// The schema of `version` in `crd`.
pub fn schema_for<'a>(crd: &'a Value, version: &str) -> Option<&'a Value> {
    crd["spec"]["versions"]
        .as_array()?
        .iter()
        .find(|v| v["name"] == version)
        .map(|v| &v["schema"]["openAPIV3Schema"])
}

/// The custom object a write stores: pruned, defaulted and validated against its schema.
#[derive(Debug)]
pub struct Admission<'a> {
    pub group: &'a str,
    pub kind: &'a str,
    pub version: &'a str,
    pub schema: &'a Value,
    /// `fieldValidation=Strict`: unknown fields are an error instead of being dropped.
    pub strict: bool,
}

impl Admission<'_> {
    pub fn admit(&self, object: &mut Value, old: Option<&Value>) -> Result<(), ApiError> {
        let name = object["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let mut unknown = Vec::new();
        if let Value::Object(fields) = object {
            for (field, value) in fields.iter_mut() {
                if field == "metadata" {
                    crate::typed::prune_object_meta(value, "metadata", &mut unknown);
                }
                if matches!(field.as_str(), "apiVersion" | "kind" | "metadata") {
                    continue;
                }
                let child = &self.schema["properties"][field.as_str()];
                if child.is_null() {
                    // Undeclared: kept whole under preserve-unknown-fields, else unknown.
                    if self.schema["x-kubernetes-preserve-unknown-fields"] != true {
                        unknown.push(field.clone());
                    }
                    continue;
                }
                prune_and_default(child, value, field, &mut unknown);
            }
            if self.schema["x-kubernetes-preserve-unknown-fields"] != true {
                fields.retain(|field, _| {
                    matches!(field.as_str(), "apiVersion" | "kind" | "metadata")
                        || !self.schema["properties"][field.as_str()].is_null()
                });
            }
        }
        if self.strict && !unknown.is_empty() {
            let listed: Vec<String> = unknown
                .iter()
                .map(|field| format!("unknown field \"{field}\""))
                .collect();
            return Err(ApiError::bad_request(format!(
                "{kind} in version \"{version}\" cannot be handled as a {kind}: strict decoding error: {}",
                listed.join(", "),
                kind = self.kind,
                version = self.version
            )));
        }
        let mut causes = Vec::new();
        for field in ["spec", "status"] {
            let schema = &self.schema["properties"][field];
            if !object[field].is_null() && !schema.is_null() {
                let old = old.map(|old| &old[field]).filter(|old| !old.is_null());
                check(schema, &object[field], old, field, &mut causes);
            }
        }
        // Rules at the root report the nil field path, as the real validator prints it.
        if let Some(root_rules) = self.schema.get("x-kubernetes-validations") {
            let rooted =
                serde_json::json!({"x-kubernetes-validations": root_rules, "type": "object"});
            check_rules(&rooted, object, old, "<nil>", &mut causes);
        }
        if causes.is_empty() {
            Ok(())
        } else {
            Err(ApiError::invalid(self.group, self.kind, &name, &causes))
        }
    }
}

/// Drops what the schema does not declare (noting its path) and fills in defaults.
fn prune_and_default(schema: &Value, value: &mut Value, path: &str, unknown: &mut Vec<String>) {
    let preserve = schema["x-kubernetes-preserve-unknown-fields"] == true;
    match value {
        Value::Object(fields) => {
            let properties = schema["properties"].as_object();
            let additional = &schema["additionalProperties"];
            if let Some(properties) = properties {
                for (field, child) in properties {
                    if !fields.contains_key(field)
                        && let Some(default) = child.get("default")
                    {
                        fields.insert(field.clone(), default.clone());
                    }
                }
            }
            // An embedded resource (x-kubernetes-embedded-resource) carries apiVersion, kind
            // and an ObjectMeta whether its schema names them or not.
            let embedded = schema["x-kubernetes-embedded-resource"] == true;
            let mut dropped = Vec::new();
            for (field, child) in fields.iter_mut() {
                if embedded && field == "metadata" {
                    crate::typed::prune_object_meta(child, &format!("{path}.metadata"), unknown);
                }
                if embedded && matches!(field.as_str(), "apiVersion" | "kind" | "metadata") {
                    continue;
                }
                let child_schema = properties.and_then(|p| p.get(field)).unwrap_or(additional);
                if child_schema.is_null() || child_schema == &Value::Bool(false) {
                    if !preserve && !additional.is_object() && additional != &Value::Bool(true) {
                        dropped.push(field.clone());
                    }
                    continue;
                }
                prune_and_default(child_schema, child, &format!("{path}.{field}"), unknown);
            }
            for field in dropped {
                fields.remove(&field);
                unknown.push(format!("{path}.{field}"));
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for (index, item) in items.iter_mut().enumerate() {
                    prune_and_default(item_schema, item, &format!("{path}[{index}]"), unknown);
                }
            }
        }
        _ => {}
    }
}

fn type_matches(wanted: &str, value: &Value) -> bool {
    match wanted {
        "object" => value.is_object(),
        "array" => value.is_array(),
        "string" => value.is_string(),
        "integer" => value.as_i64().is_some() || value.as_u64().is_some(),
        "number" => value.is_number(),
        "boolean" => value.is_boolean(),
        _ => true,
    }
}

fn cause(reason: &'static str, field: &str, message: String) -> Cause {
    Cause {
        reason,
        field: field.to_owned(),
        message,
    }
}

fn check(schema: &Value, value: &Value, old: Option<&Value>, path: &str, causes: &mut Vec<Cause>) {
    if value.is_null() {
        return;
    }
    let int_or_string = schema["x-kubernetes-int-or-string"] == true;
    if let Some(wanted) = schema["type"].as_str() {
        let ok = if int_or_string {
            value.is_string() || value.as_i64().is_some()
        } else {
            type_matches(wanted, value)
        };
        if !ok {
            causes.push(cause(
                "FieldValueTypeInvalid",
                path,
                format!("Invalid value: {value}: {path} in body must be of type {wanted}"),
            ));
            return;
        }
    }
    if let Some(allowed) = schema["enum"].as_array()
        && !allowed.contains(value)
    {
        let supported: Vec<String> = allowed.iter().map(Value::to_string).collect();
        causes.push(cause(
            "FieldValueNotSupported",
            path,
            format!(
                "Unsupported value: {value}: supported values: {}",
                supported.join(", ")
            ),
        ));
    }
    check_bounds(schema, value, path, causes);
    if let Some(map) = value.as_object() {
        for required in crate::json::strings(&schema["required"]) {
            if !map.contains_key(required) {
                causes.push(cause(
                    "FieldValueRequired",
                    &format!("{path}.{required}"),
                    "Required value".to_owned(),
                ));
            }
        }
        for (key, child) in map {
            let child_schema = match &schema["properties"][key.as_str()] {
                Value::Null => &schema["additionalProperties"],
                found => found,
            };
            if child_schema.is_object() {
                let old_child = old.and_then(|old| old.get(key));
                check(
                    child_schema,
                    child,
                    old_child,
                    &format!("{path}.{key}"),
                    causes,
                );
            }
        }
    }
    if let (Some(items), Some(item_schema)) = (value.as_array(), schema.get("items")) {
        for (index, item) in items.iter().enumerate() {
            // Transition rules inside lists need the old item, which only keyed lists have;
            // they are skipped for items, as for new objects.
            check(item_schema, item, None, &format!("{path}[{index}]"), causes);
        }
    }
    check_rules(schema, value, old, path, causes);
}

fn check_bounds(schema: &Value, value: &Value, path: &str, causes: &mut Vec<Cause>) {
    if let Some(number) = value.as_f64() {
        if schema["minimum"].as_f64().is_some_and(|min| number < min) {
            causes.push(cause(
                "FieldValueInvalid",
                path,
                format!(
                    "Invalid value: {value}: {path} in body should be greater than or equal to {}",
                    schema["minimum"]
                ),
            ));
        }
        if schema["maximum"].as_f64().is_some_and(|max| number > max) {
            causes.push(cause(
                "FieldValueInvalid",
                path,
                format!(
                    "Invalid value: {value}: {path} in body should be less than or equal to {}",
                    schema["maximum"]
                ),
            ));
        }
    }
    if let Some(text) = value.as_str() {
        if let Some(max) = schema["maxLength"].as_u64()
            && text.chars().count() as u64 > max
        {
            causes.push(cause(
                "FieldValueTooLong",
                path,
                format!("Too long: may not be more than {max} bytes"),
            ));
        }
        if let Some(pattern) = schema["pattern"].as_str()
            && regex::Regex::new(pattern).is_ok_and(|re| !re.is_match(text))
        {
            causes.push(cause(
                "FieldValueInvalid",
                path,
                format!("Invalid value: {value}: {path} in body should match '{pattern}'"),
            ));
        }
    }
    if let Some(items) = value.as_array() {
        let count = items.len() as u64;
        if schema["maxItems"].as_u64().is_some_and(|max| count > max) {
            causes.push(cause(
                "FieldValueTooMany",
                path,
                format!(
                    "Too many: {count}: must have at most {} items",
                    schema["maxItems"]
                ),
            ));
        }
        if schema["minItems"].as_u64().is_some_and(|min| count < min) {
            causes.push(cause(
                "FieldValueInvalid",
                path,
                format!(
                    "Invalid value: {count}: {path} in body should have at least {} items",
                    schema["minItems"]
                ),
            ));
        }
    }
}

/// The node's CEL rules: `self` is the value here, `oldSelf` the previous one. A rule naming
/// `oldSelf` is a transition rule, evaluated only when there is a previous value. A failing
/// rule is `Invalid value: "<type>": <message>` at the node (or its `fieldPath`).
fn check_rules(
    schema: &Value,
    value: &Value,
    old: Option<&Value>,
    path: &str,
    causes: &mut Vec<Cause>,
) {
    for rule in schema["x-kubernetes-validations"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let source = rule["rule"].as_str().unwrap_or_default();
        let transition = source.contains("oldSelf");
        if transition && old.is_none() {
            continue;
        }
        let Ok(program) = compile(source) else {
            continue;
        };
        let mut context = Context::default();
        if context.add_variable("self", value).is_err() {
            continue;
        }
        if let Some(old) = old
            && context.add_variable("oldSelf", old).is_err()
        {
            continue;
        }
        let outcome =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| program.execute(&context)));
        let passed = matches!(outcome, Ok(Ok(cel_interpreter::Value::Bool(true))));
        if passed {
            continue;
        }
        let message = rule["message"]
            .as_str()
            .map_or_else(|| format!("failed rule: {source}"), str::to_owned);
        let field = rule["fieldPath"].as_str().map_or_else(
            || path.to_owned(),
            |field_path| format!("{path}{field_path}"),
        );
        let kind = schema["type"].as_str().unwrap_or("object");
        let reason = match rule["reason"].as_str() {
            Some("FieldValueForbidden") => "FieldValueForbidden",
            Some("FieldValueRequired") => "FieldValueRequired",
            Some("FieldValueDuplicate") => "FieldValueDuplicate",
            _ => "FieldValueInvalid",
        };
        causes.push(cause(
            reason,
            &field,
            format!(
                "Invalid value: {}: {message}",
                Value::String(kind.to_owned())
            ),
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Value {
        json!({"type": "object", "properties": {"spec": {"type": "object", "required": ["maxUnavailable"],
            "x-kubernetes-validations": [{"rule": "self.maxUnavailable <= 10", "message": "at most 10"}, {"rule": "self.mode == oldSelf.mode", "message": "mode is immutable"}],
            "properties": {
                "maxUnavailable": {"x-kubernetes-int-or-string": true, "type": "string"},
                "mode": {"type": "string", "enum": ["Drain", "Delete"], "default": "Drain"},
                "priority": {"type": "integer", "minimum": 0, "maximum": 10},
                "name": {"type": "string", "maxLength": 5, "pattern": "^[a-z]+$"},
                "nodes": {"type": "array", "items": {"type": "string"}},
        }}}})
    }

    fn admission(schema: &Value, strict: bool) -> Admission<'_> {
        Admission {
            group: "nodegrace.io",
            kind: "NodeDisruptionBudget",
            version: "v1alpha1",
            schema,
            strict,
        }
    }

    fn fields(error: &ApiError) -> Vec<String> {
        error.to_status()["details"]["causes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["field"].as_str().unwrap().to_owned())
            .collect()
    }

    #[test]
    fn objects_are_pruned_defaulted_and_checked_field_by_field() {
        let schema = schema();
        let mut ok = json!({"metadata": {"name": "a"}, "spec": {"maxUnavailable": 1, "nodes": ["n1"], "extra": 1}, "junk": true});
        admission(&schema, false).admit(&mut ok, None).unwrap();
        assert_eq!(ok["spec"]["mode"], "Drain", "defaulted");
        assert!(
            ok["spec"].get("extra").is_none() && ok.get("junk").is_none(),
            "pruned"
        );
        let mut bad = json!({"metadata": {"name": "a"}, "spec": {"mode": "Explode", "priority": 11, "nodes": [1], "name": "ABCDEFG"}});
        let error = admission(&schema, false).admit(&mut bad, None).unwrap_err();
        assert_eq!(error.code, 422);
        for field in [
            "spec.maxUnavailable",
            "spec.mode",
            "spec.priority",
            "spec.nodes[0]",
            "spec.name",
        ] {
            assert!(
                fields(&error).iter().any(|f| f == field),
                "{field} not in {error:?}"
            );
        }
        assert!(
            error
                .message
                .contains(r#"supported values: "Drain", "Delete""#),
            "{}",
            error.message
        );
        assert!(
            error
                .message
                .starts_with("NodeDisruptionBudget.nodegrace.io \"a\" is invalid: ["),
            "{}",
            error.message
        );
    }

    #[test]
    fn strict_validation_refuses_unknown_fields() {
        let schema = schema();
        let mut object =
            json!({"metadata": {"name": "a"}, "spec": {"maxUnavailable": 1, "extra": 1}});
        let error = admission(&schema, true)
            .admit(&mut object, None)
            .unwrap_err();
        assert_eq!(error.code, 400);
        assert!(
            error
                .message
                .contains("strict decoding error: unknown field \"spec.extra\""),
            "{}",
            error.message
        );
    }

    #[test]
    fn cel_rules_and_transition_rules() {
        let schema = schema();
        let mut big = json!({"metadata": {"name": "a"}, "spec": {"maxUnavailable": 11}});
        let error = admission(&schema, false).admit(&mut big, None).unwrap_err();
        assert!(
            error
                .message
                .contains("spec: Invalid value: \"object\": at most 10"),
            "{}",
            error.message
        );
        let old =
            json!({"metadata": {"name": "a"}, "spec": {"maxUnavailable": 1, "mode": "Drain"}});
        let mut changed =
            json!({"metadata": {"name": "a"}, "spec": {"maxUnavailable": 1, "mode": "Delete"}});
        let error = admission(&schema, false)
            .admit(&mut changed, Some(&old))
            .unwrap_err();
        assert!(
            error.message.contains("mode is immutable"),
            "{}",
            error.message
        );
        let mut same = old.clone();
        admission(&schema, false)
            .admit(&mut same, Some(&old))
            .unwrap();
    }

    #[test]
    fn crds_with_rules_that_do_not_compile_are_refused() {
        let crd = json!({"metadata": {"name": "x.nodegrace.io"}, "spec": {"versions": [{"name": "v1", "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-validations": [{"rule": "self.a >"}]}}}]}});
        let error = validate_crd(&crd).unwrap_err();
        assert_eq!(error.code, 422);
        assert!(
            error.message.contains("x-kubernetes-validations[0].rule"),
            "{}",
            error.message
        );
        let fine = json!({"metadata": {"name": "x.nodegrace.io"}, "spec": {"versions": [{"name": "v1", "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-validations": [{"rule": "has(self.spec)"}]}}}]}});
        validate_crd(&fine).unwrap();
    }
}
