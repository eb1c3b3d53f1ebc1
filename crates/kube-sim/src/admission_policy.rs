//! ValidatingAdmissionPolicy and its bindings (staging/src/k8s.io/apiserver/pkg/admission/
//! plugin/policy/validating), evaluated with the CEL engine the CRD rules use: for an API
//! write every binding whose policy's `matchConstraints` (and the binding's `matchResources`)
//! cover it and whose `matchConditions` hold runs the policy's `validations` with `object`,
//! `oldObject`, `request` and `variables`; a failed one is denied (`Deny`, with the policy's
//! reason — Invalid when unset — as `admission.NewForbidden` words it) or warned about
//! (`Warn`). Not supported: `paramKind`/`paramRef`, `auditAnnotations`, `authorizer` and
//! `namespaceObject` in expressions, type checking of the expressions against schemas.

use cel_interpreter::Context;
use serde_json::{Value, json};

use crate::admission::{Operation, Request};
use crate::error::ApiError;
use crate::store::Store;

const GROUP: &str = "admissionregistration.k8s.io";

/// Whether any binding exists (the fast path skips policies otherwise).
pub fn any_bound(store: &Store) -> bool {
    !store
        .all(&store.kind(GROUP, "validatingadmissionpolicybindings"))
        .is_empty()
}

/// The warnings of `Warn` bindings, or the denial of the first `Deny` binding that fails.
pub fn validate(
    store: &Store,
    request: &Request<'_>,
    object: &Value,
) -> Result<Vec<String>, ApiError> {
    let mut warnings = Vec::new();
    for binding in store.all(&store.kind(GROUP, "validatingadmissionpolicybindings")) {
        let policy_name = binding["spec"]["policyName"].as_str().unwrap_or_default();
        let Ok(policy) = store.get(
            &store.kind(GROUP, "validatingadmissionpolicies"),
            None,
            policy_name,
        ) else {
            continue;
        };
        let spec = &policy["spec"];
        if !covers(store, &spec["matchConstraints"], request, object)
            || (binding["spec"]["matchResources"].is_object()
                && !covers(store, &binding["spec"]["matchResources"], request, object))
        {
            continue;
        }
        let binding_name = binding["metadata"]["name"].as_str().unwrap_or_default();
        let ignore_errors = spec["failurePolicy"].as_str() == Some("Ignore");
        let failure = match judge(spec, request, object) {
            Ok(None) => continue,
            Ok(Some(failure)) => failure,
            Err(_) if ignore_errors => continue,
            Err(error) => Failure {
                message: error,
                reason: None,
            },
        };
        let actions: Vec<&str> =
            crate::json::strings(&binding["spec"]["validationActions"]).collect();
        if actions.contains(&"Warn") {
            warnings.push(format!(
                "Validation failed for ValidatingAdmissionPolicy '{policy_name}' with binding '{binding_name}': {}",
                failure.message
            ));
        }
        if actions.contains(&"Deny") {
            let why = format!(
                "ValidatingAdmissionPolicy '{policy_name}' with binding '{binding_name}' denied request: {}",
                failure.message
            );
            let kind = request.kind;
            let mut error =
                ApiError::forbidden_object(&kind.group, &kind.plural, request.name, &why);
            let (code, reason) = match failure.reason.as_deref() {
                Some("Forbidden") => (403, "Forbidden"),
                Some("Unauthorized") => (401, "Unauthorized"),
                Some("RequestEntityTooLarge") => (413, "RequestEntityTooLarge"),
                _ => (422, "Invalid"),
            };
            error.code = code;
            error.reason = reason;
            return Err(error);
        }
    }
    Ok(warnings)
}

/// A validation that did not pass.
struct Failure {
    message: String,
    reason: Option<String>,
}

/// Whether the request is one these match rules (`resourceRules`, `excludeResourceRules`,
/// selectors) cover: the webhooks' matching, rule for rule.
fn covers(store: &Store, constraints: &Value, request: &Request<'_>, object: &Value) -> bool {
    let as_webhook = |rules: &Value| {
        json!({
            "rules": rules,
            "namespaceSelector": constraints["namespaceSelector"],
            "objectSelector": constraints["objectSelector"],
        })
    };
    let included = crate::admission::applies(
        store,
        &as_webhook(&constraints["resourceRules"]),
        request,
        object,
    ) && names_match(&constraints["resourceRules"], request);
    let excluded = constraints["excludeResourceRules"].is_array()
        && crate::admission::applies(
            store,
            &as_webhook(&constraints["excludeResourceRules"]),
            request,
            object,
        )
        && names_match(&constraints["excludeResourceRules"], request);
    included && !excluded
}

/// `resourceNames` of the rules, when any rule lists them.
fn names_match(rules: &Value, request: &Request<'_>) -> bool {
    rules.as_array().into_iter().flatten().any(|rule| {
        rule["resourceNames"]
            .as_array()
            .is_none_or(|names| names.is_empty() || names.iter().any(|n| n == request.name))
    })
}

/// The first validation that fails (`None`: all pass, or a match condition is false), or an
/// evaluation error.
fn judge(spec: &Value, request: &Request<'_>, object: &Value) -> Result<Option<Failure>, String> {
    let (new_object, old_object) = match request.operation {
        Operation::Delete => (Value::Null, request.old.cloned().unwrap_or(Value::Null)),
        _ => (object.clone(), request.old.cloned().unwrap_or(Value::Null)),
    };
    let request_value = json!({
        "kind": {"group": request.kind.group, "version": request.kind.version, "kind": request.kind.kind},
        "resource": {"group": request.kind.group, "version": request.kind.version, "resource": request.kind.plural},
        "subResource": request.subresource.unwrap_or_default(),
        "name": request.name,
        "namespace": request.namespace.unwrap_or_default(),
        "operation": request.operation.as_str(),
        "userInfo": with_empty_extra(request.user.to_json()),
        "dryRun": request.dry_run,
    });
    let mut context = Context::default();
    for (name, value) in [
        ("object", &new_object),
        ("oldObject", &old_object),
        ("request", &request_value),
    ] {
        context
            .add_variable(name, value)
            .map_err(|e| format!("cannot bind {name}: {e}"))?;
    }
    let mut variables = serde_json::Map::new();
    for variable in spec["variables"].as_array().into_iter().flatten() {
        let name = variable["name"].as_str().unwrap_or_default();
        let value = evaluate(
            &context,
            variable["expression"].as_str().unwrap_or_default(),
        )?;
        variables.insert(name.to_owned(), value);
        context
            .add_variable("variables", Value::Object(variables.clone()))
            .map_err(|e| format!("cannot bind variables: {e}"))?;
    }
    for condition in spec["matchConditions"].as_array().into_iter().flatten() {
        let expression = condition["expression"].as_str().unwrap_or_default();
        if evaluate(&context, expression)? != Value::Bool(true) {
            return Ok(None);
        }
    }
    for validation in spec["validations"].as_array().into_iter().flatten() {
        let expression = validation["expression"].as_str().unwrap_or_default();
        if evaluate(&context, expression)? == Value::Bool(true) {
            continue;
        }
        let written = validation["messageExpression"]
            .as_str()
            .and_then(|source| evaluate(&context, source).ok())
            .and_then(|value| value.as_str().map(str::to_owned))
            .filter(|message| !message.trim().is_empty());
        let message = written
            .or_else(|| validation["message"].as_str().map(str::to_owned))
            .unwrap_or_else(|| format!("failed expression: {expression}"));
        return Ok(Some(Failure {
            message,
            reason: validation["reason"].as_str().map(str::to_owned),
        }));
    }
    Ok(None)
}

/// `request.userInfo.extra` is always a map, empty when the user has none.
fn with_empty_extra(mut user: Value) -> Value {
    if user["extra"].is_null() {
        user["extra"] = json!({});
    }
    user
}

fn evaluate(context: &Context<'_>, source: &str) -> Result<Value, String> {
    let program = crate::crd_schema::compile(source)
        .map_err(|error| format!("compilation failed: {error}"))?;
    let outcome =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| program.execute(context)))
            .map_err(|_| format!("expression '{source}' could not be evaluated"))?
            .map_err(|error| format!("expression '{source}' resulted in error: {error}"))?;
    outcome
        .json()
        .map_err(|error| format!("expression '{source}' gave a value that is not JSON: {error}"))
}

/// Checks a policy's expressions compile, as its validation does (422 otherwise).
pub fn check_policy(policy: &Value) -> Result<(), String> {
    let spec = &policy["spec"];
    for (list, field) in [
        ("validations", "expression"),
        ("validations", "messageExpression"),
        ("matchConditions", "expression"),
        ("variables", "expression"),
    ] {
        for (index, item) in spec[list].as_array().into_iter().flatten().enumerate() {
            if let Some(source) = item[field].as_str() {
                crate::crd_schema::compile(source).map_err(|error| {
                    format!("spec.{list}[{index}].{field}: Invalid value: \"{source}\": compilation failed: {error}")
                })?;
            }
        }
    }
    Ok(())
}
