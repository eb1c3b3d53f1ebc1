//! CustomResourceDefinition schemas: custom objects are checked against the served version's
//! `openAPIV3Schema` (type, required, enum, minimum/maximum, nested properties and items,
//! `x-kubernetes-preserve-unknown-fields`, `x-kubernetes-int-or-string`). CEL rules
//! (`x-kubernetes-validations`) are not evaluated; a CRD carrying them is refused at creation
//! with a message saying so, rather than accepted and silently unenforced.

use serde_json::Value;

use crate::error::{ApiError, Cause};

fn find_cel(schema: &Value, path: &str, found: &mut Vec<String>) {
    match schema {
        Value::Object(map) => {
            if map.contains_key("x-kubernetes-validations") {
                found.push(format!("{path}.x-kubernetes-validations"));
            }
            for (key, value) in map {
                find_cel(value, &format!("{path}.{key}"), found);
            }
        }
        Value::Array(items) => {
            for (index, item) in items.iter().enumerate() {
                find_cel(item, &format!("{path}[{index}]"), found);
            }
        }
        _ => {}
    }
}

/// Checks a CRD before it is stored.
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
        let mut cel = Vec::new();
        find_cel(schema, &path, &mut cel);
        causes.extend(cel.into_iter().map(|field| Cause {
            reason: "FieldValueForbidden",
            field,
            message: "Forbidden: CEL validation rules are not supported by kube-sim; validate in an admission webhook instead".to_owned(),
        }));
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

/// Checks a custom object against its schema; every problem becomes a 422 cause.
pub fn validate_object(kind: &str, schema: &Value, object: &Value) -> Result<(), ApiError> {
    let mut causes = Vec::new();
    for field in ["spec", "status"] {
        if !object[field].is_null() && !schema["properties"][field].is_null() {
            check(
                &schema["properties"][field],
                &object[field],
                field,
                &mut causes,
            );
        }
    }
    if causes.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid(
            "",
            kind,
            object["metadata"]["name"].as_str().unwrap_or_default(),
            &causes,
        ))
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

fn check(schema: &Value, value: &Value, path: &str, causes: &mut Vec<Cause>) {
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
            causes.push(Cause {
                reason: "FieldValueTypeInvalid",
                field: path.to_owned(),
                message: format!("Invalid value: {value}: {path} in body must be of type {wanted}"),
            });
            return;
        }
    }
    if let Some(allowed) = schema["enum"].as_array()
        && !allowed.contains(value)
    {
        causes.push(Cause {
            reason: "FieldValueNotSupported",
            field: path.to_owned(),
            message: format!("Unsupported value: {value}"),
        });
    }
    if let Some(number) = value.as_f64() {
        if schema["minimum"].as_f64().is_some_and(|min| number < min) {
            causes.push(Cause {
                reason: "FieldValueInvalid",
                field: path.to_owned(),
                message: format!(
                    "Invalid value: {value}: {path} in body should be greater than or equal to {}",
                    schema["minimum"]
                ),
            });
        }
        if schema["maximum"].as_f64().is_some_and(|max| number > max) {
            causes.push(Cause {
                reason: "FieldValueInvalid",
                field: path.to_owned(),
                message: format!(
                    "Invalid value: {value}: {path} in body should be less than or equal to {}",
                    schema["maximum"]
                ),
            });
        }
    }
    if let Some(map) = value.as_object() {
        for required in schema["required"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
        {
            if !map.contains_key(required) {
                causes.push(Cause {
                    reason: "FieldValueRequired",
                    field: format!("{path}.{required}"),
                    message: "Required value".to_owned(),
                });
            }
        }
        for (key, child) in map {
            let child_schema = &schema["properties"][key];
            let child_schema = if child_schema.is_null() {
                &schema["additionalProperties"]
            } else {
                child_schema
            };
            if child_schema.is_object() {
                check(child_schema, child, &format!("{path}.{key}"), causes);
            }
        }
    }
    if let (Some(items), Some(item_schema)) = (value.as_array(), schema.get("items")) {
        for (index, item) in items.iter().enumerate() {
            check(item_schema, item, &format!("{path}[{index}]"), causes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Value {
        json!({"type": "object", "properties": {"spec": {"type": "object", "required": ["maxUnavailable"], "properties": {
            "maxUnavailable": {"x-kubernetes-int-or-string": true, "type": "string"},
            "mode": {"type": "string", "enum": ["Drain", "Delete"]},
            "priority": {"type": "integer", "minimum": 0, "maximum": 10},
            "nodes": {"type": "array", "items": {"type": "string"}},
        }}}})
    }

    #[test]
    fn objects_are_checked_field_by_field() {
        let ok = json!({"metadata": {"name": "a"}, "spec": {"maxUnavailable": 1, "mode": "Drain", "priority": 3, "nodes": ["n1"]}});
        assert!(validate_object("NodeDisruptionBudget", &schema(), &ok).is_ok());
        let bad = json!({"metadata": {"name": "a"}, "spec": {"mode": "Explode", "priority": 11, "nodes": [1]}});
        let error = validate_object("NodeDisruptionBudget", &schema(), &bad).unwrap_err();
        assert_eq!(error.code, 422);
        let fields: Vec<String> = error.to_status()["details"]["causes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["field"].as_str().unwrap().to_owned())
            .collect();
        for field in [
            "spec.maxUnavailable",
            "spec.mode",
            "spec.priority",
            "spec.nodes[0]",
        ] {
            assert!(
                fields.iter().any(|f| f == field),
                "{field} not in {fields:?}"
            );
        }
    }

    #[test]
    fn cel_rules_are_refused_at_creation_with_their_location() {
        let crd = json!({"metadata": {"name": "x.nodegrace.io"}, "spec": {"versions": [{"name": "v1", "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-validations": [{"rule": "self.a > 0"}]}}}]}});
        let error = validate_crd(&crd).unwrap_err();
        assert_eq!(error.code, 422);
        assert!(
            error
                .message
                .contains("spec.versions[0].schema.openAPIV3Schema.x-kubernetes-validations"),
            "{}",
            error.message
        );
        assert!(error.message.contains("not supported by kube-sim"));
    }
}
