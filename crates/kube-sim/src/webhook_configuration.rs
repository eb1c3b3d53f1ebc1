//! Validation of admission webhook configurations, as pkg/apis/admissionregistration/validation
//! does it for admissionregistration.k8s.io/v1: each webhook's name is a fully qualified domain
//! unique in its configuration, `sideEffects` and `admissionReviewVersions` are required, the
//! client config names exactly one of a URL or a Service, and the enumerations and the timeout
//! take only their allowed values. A refusal is the real 422 with every cause.

use serde_json::Value;

use crate::error::{ApiError, Cause};
use crate::resources::ResourceType;

const ACCEPTED_REVIEW_VERSIONS: &[&str] = &["v1", "v1beta1"];

pub fn is_webhook_configuration(kind: &ResourceType) -> bool {
    kind.group == "admissionregistration.k8s.io"
        && matches!(
            kind.plural.as_str(),
            "validatingwebhookconfigurations" | "mutatingwebhookconfigurations"
        )
}

pub fn validate(kind: &ResourceType, configuration: &Value) -> Result<(), ApiError> {
    let mutating = kind.plural == "mutatingwebhookconfigurations";
    let mut causes = Vec::new();
    let mut names = std::collections::HashSet::new();
    for (index, webhook) in configuration["webhooks"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let path = format!("webhooks[{index}]");
        validate_webhook(webhook, mutating, &path, &mut causes);
        validate_review_versions(
            &webhook["admissionReviewVersions"],
            &format!("{path}.admissionReviewVersions"),
            &mut causes,
        );
        if let Some(name) = webhook["name"].as_str().filter(|n| !n.is_empty())
            && !names.insert(name)
        {
            causes.push(Cause::duplicate(&format!("{path}.name"), name));
        }
    }
    if causes.is_empty() {
        return Ok(());
    }
    Err(ApiError::invalid(
        &kind.group,
        &kind.kind,
        configuration["metadata"]["name"]
            .as_str()
            .unwrap_or_default(),
        &causes,
    ))
}

fn validate_webhook(webhook: &Value, mutating: bool, path: &str, causes: &mut Vec<Cause>) {
    validate_name(&webhook["name"], &format!("{path}.name"), causes);
    for (index, rule) in webhook["rules"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        for operation in rule["operations"].as_array().into_iter().flatten() {
            let supported = ["*", "CONNECT", "CREATE", "DELETE", "UPDATE"];
            one_of(
                operation,
                &supported,
                &format!("{path}.rules[{index}].operations"),
                causes,
            );
        }
    }
    optional_one_of(
        &webhook["failurePolicy"],
        &["Fail", "Ignore"],
        &format!("{path}.failurePolicy"),
        causes,
    );
    optional_one_of(
        &webhook["matchPolicy"],
        &["Equivalent", "Exact"],
        &format!("{path}.matchPolicy"),
        causes,
    );
    if mutating {
        optional_one_of(
            &webhook["reinvocationPolicy"],
            &["IfNeeded", "Never"],
            &format!("{path}.reinvocationPolicy"),
            causes,
        );
    }
    let side_effects = &webhook["sideEffects"];
    if side_effects.is_null() {
        causes.push(Cause::required(
            &format!("{path}.sideEffects"),
            "must specify one of None, NoneOnDryRun",
        ));
    } else {
        one_of(
            side_effects,
            &["None", "NoneOnDryRun"],
            &format!("{path}.sideEffects"),
            causes,
        );
    }
    if let Some(timeout) = webhook["timeoutSeconds"].as_i64()
        && !(1..=30).contains(&timeout)
    {
        causes.push(Cause::invalid(
            &format!("{path}.timeoutSeconds"),
            &timeout.to_string(),
            "the timeout value must be between 1 and 30 seconds",
        ));
    }
    let client = &webhook["clientConfig"];
    if client["url"].is_null() == client["service"].is_null() {
        causes.push(Cause::required(
            &format!("{path}.clientConfig"),
            "exactly one of url or service is required",
        ));
    } else if let Some(url) = client["url"].as_str() {
        let scheme = url.split_once("://").map_or("", |(scheme, _)| scheme);
        if scheme != "https" {
            causes.push(Cause::invalid(
                &format!("{path}.clientConfig.url"),
                &format!("\"{scheme}\""),
                "'https' is the only allowed URL scheme",
            ));
        }
    }
}

/// utilvalidation.IsFullyQualifiedName.
fn validate_name(name: &Value, path: &str, causes: &mut Vec<Cause>) {
    let name = name.as_str().unwrap_or_default();
    if name.is_empty() {
        causes.push(Cause::required(path, ""));
        return;
    }
    if !crate::store::validation::is_dns_subdomain(name) {
        causes.push(Cause::invalid(
            path,
            &format!("\"{name}\""),
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')",
        ));
        return;
    }
    if name.split('.').count() < 3 {
        causes.push(Cause::invalid(
            path,
            &format!("\"{name}\""),
            "should be a domain with at least three segments separated by dots",
        ));
    }
}

fn validate_review_versions(versions: &Value, path: &str, causes: &mut Vec<Cause>) {
    let versions: Vec<&str> = versions
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let accepted = ACCEPTED_REVIEW_VERSIONS.join(", ");
    if versions.is_empty() {
        causes.push(Cause::required(
            path,
            &format!("must specify one of {accepted}"),
        ));
        return;
    }
    if !versions
        .iter()
        .any(|v| ACCEPTED_REVIEW_VERSIONS.contains(v))
    {
        let listed: Vec<String> = versions.iter().map(|v| format!("\"{v}\"")).collect();
        causes.push(Cause::invalid(
            path,
            &format!("[]string{{{}}}", listed.join(", ")),
            &format!("must include at least one of {accepted}"),
        ));
    }
}

fn optional_one_of(value: &Value, supported: &[&str], path: &str, causes: &mut Vec<Cause>) {
    if !value.is_null() {
        one_of(value, supported, path, causes);
    }
}

fn one_of(value: &Value, supported: &[&str], path: &str, causes: &mut Vec<Cause>) {
    let text = value.as_str().unwrap_or_default();
    if !supported.contains(&text) {
        causes.push(Cause::not_supported(path, text, supported));
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::validate;
    use crate::resources::Registry;

    fn kind(plural: &str) -> std::sync::Arc<crate::resources::ResourceType> {
        Registry::default()
            .find_any_version("admissionregistration.k8s.io", plural)
            .unwrap()
    }

    #[test]
    fn a_webhook_without_side_effects_or_review_versions_is_refused_with_both() {
        let configuration = json!({"metadata": {"name": "guard"}, "webhooks": [
            {"name": "guard.example.com", "clientConfig": {"url": "https://guard.example.com/"}},
        ]});
        let error = validate(&kind("validatingwebhookconfigurations"), &configuration).unwrap_err();
        assert_eq!(error.code, 422);
        assert_eq!(
            error.message,
            "ValidatingWebhookConfiguration.admissionregistration.k8s.io \"guard\" is invalid: [webhooks[0].sideEffects: Required value: must specify one of None, NoneOnDryRun, webhooks[0].admissionReviewVersions: Required value: must specify one of v1, v1beta1]"
        );
    }

    #[test]
    fn names_are_qualified_and_unique_and_enumerations_checked() {
        let hook = |name: &str| json!({"name": name, "sideEffects": "None", "admissionReviewVersions": ["v1"], "clientConfig": {"service": {"name": "s", "namespace": "n"}}});
        let mut odd = hook("guard.example.com");
        odd["sideEffects"] = json!("Some");
        odd["timeoutSeconds"] = json!(31);
        let configuration = json!({"metadata": {"name": "guard"}, "webhooks": [hook("guard"), odd, hook("guard.example.com")]});
        let error = validate(&kind("mutatingwebhookconfigurations"), &configuration).unwrap_err();
        assert_eq!(
            error.message,
            "MutatingWebhookConfiguration.admissionregistration.k8s.io \"guard\" is invalid: [webhooks[0].name: Invalid value: \"guard\": should be a domain with at least three segments separated by dots, webhooks[1].sideEffects: Unsupported value: \"Some\": supported values: \"None\", \"NoneOnDryRun\", webhooks[1].timeoutSeconds: Invalid value: 31: the timeout value must be between 1 and 30 seconds, webhooks[2].name: Duplicate value: \"guard.example.com\"]"
        );
    }
}
