//! API errors as the real API server reports them: a `metav1.Status` with the HTTP code, a
//! machine-readable `reason`, a message in the API server's words, and details.

use serde_json::{Value, json};

/// A failed request, convertible to the `Status` body kube-rs and kubectl parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code} {reason}: {message}")]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    pub details: Option<Value>,
}

/// One field problem of a 422 Invalid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cause {
    /// `FieldValueRequired`, `FieldValueInvalid`, `FieldValueNotSupported`, `FieldValueForbidden`…
    pub reason: &'static str,
    pub field: String,
    pub message: String,
}

/// The causes in apimachinery's field.Error wording (`field.Required`, `field.Invalid`, …).
impl Cause {
    fn at(reason: &'static str, field: &str, message: String) -> Self {
        Self {
            reason,
            field: field.to_owned(),
            message,
        }
    }

    /// `Required value`, followed by `detail` when there is one.
    pub fn required(field: &str, detail: &str) -> Self {
        let message = if detail.is_empty() {
            "Required value".to_owned()
        } else {
            format!("Required value: {detail}")
        };
        Self::at("FieldValueRequired", field, message)
    }

    /// `Invalid value: <value>: <detail>`, `value` written as Go's field errors quote it.
    pub fn invalid(field: &str, value: &str, detail: &str) -> Self {
        Self::at(
            "FieldValueInvalid",
            field,
            format!("Invalid value: {value}: {detail}"),
        )
    }

    /// `Unsupported value: "<value>": supported values: "a", "b"`.
    pub fn not_supported(field: &str, value: &str, supported: &[&str]) -> Self {
        let listed: Vec<String> = supported.iter().map(|s| format!("\"{s}\"")).collect();
        Self::at(
            "FieldValueNotSupported",
            field,
            format!(
                "Unsupported value: \"{value}\": supported values: {}",
                listed.join(", ")
            ),
        )
    }

    /// `Duplicate value: "<value>"`.
    pub fn duplicate(field: &str, value: &str) -> Self {
        Self::at(
            "FieldValueDuplicate",
            field,
            format!("Duplicate value: \"{value}\""),
        )
    }

    /// `Forbidden: <detail>`.
    pub fn forbidden(field: &str, detail: &str) -> Self {
        Self::at("FieldValueForbidden", field, format!("Forbidden: {detail}"))
    }
}

fn details(group: &str, kind: &str, name: &str) -> Value {
    json!({"name": name, "group": group, "kind": kind})
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    fn with_details(mut self, details: Value) -> Self {
        self.details = Some(details);
        self
    }

    /// `pods "x" not found` (resource is the plural, qualified by group for named groups).
    pub fn not_found(group: &str, plural: &str, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", qualified(group, plural)),
        )
        .with_details(details(group, plural, name))
    }

    pub fn already_exists(group: &str, plural: &str, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", qualified(group, plural)),
        )
        .with_details(details(group, plural, name))
    }

    /// The optimistic-concurrency failure, worded as the API server words it.
    pub fn conflict(group: &str, plural: &str, name: &str, why: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": {why}",
                qualified(group, plural)
            ),
        )
        .with_details(details(group, plural, name))
    }

    pub fn stale(group: &str, plural: &str, name: &str) -> Self {
        Self::conflict(
            group,
            plural,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    /// 422 with one cause per bad field.
    pub fn invalid(group: &str, kind: &str, name: &str, causes: &[Cause]) -> Self {
        let summary: Vec<String> = causes
            .iter()
            .map(|cause| format!("{}: {}", cause.field, cause.message))
            .collect();
        let causes_json: Vec<Value> = causes
            .iter()
            .map(|cause| json!({"reason": cause.reason, "message": cause.message, "field": cause.field}))
            .collect();
        let mut details = details(group, kind, name);
        details["causes"] = Value::Array(causes_json);
        // errors.NewInvalid: the kind qualified by its group, one error as it is, several as
        // an aggregate in brackets.
        let qualified_kind = if group.is_empty() {
            kind.to_owned()
        } else {
            format!("{kind}.{group}")
        };
        let summary = match summary.as_slice() {
            [one] => one.clone(),
            several => format!("[{}]", several.join(", ")),
        };
        Self::new(
            422,
            "Invalid",
            format!("{qualified_kind} \"{name}\" is invalid: {summary}"),
        )
        .with_details(details)
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(405, "MethodNotAllowed", message)
    }

    pub fn unsupported_media_type(content_type: &str) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json, application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json, application/apply-patch+yaml (got {content_type:?})"
            ),
        )
    }

    /// The same error, its message followed by why.
    #[must_use]
    pub fn because(mut self, why: &str) -> Self {
        self.message = format!("{}: {why}", self.message);
        self
    }

    /// 429; a positive `retry_after_seconds` becomes the `Retry-After` header, as
    /// apiserver's responsewriters.ErrorNegotiated writes it.
    pub fn too_many_requests(
        message: impl Into<String>,
        causes: &[(&str, String)],
        retry_after_seconds: u32,
    ) -> Self {
        let mut details = json!({});
        if !causes.is_empty() {
            details["causes"] = causes
                .iter()
                .map(|(reason, message)| json!({"reason": reason, "message": message}))
                .collect();
        }
        if retry_after_seconds > 0 {
            details["retryAfterSeconds"] = json!(retry_after_seconds);
        }
        Self::new(429, "TooManyRequests", message).with_details(details)
    }

    /// The seconds a client should wait before retrying, when the error says.
    pub fn retry_after_seconds(&self) -> Option<u64> {
        self.details
            .as_ref()
            .and_then(|details| details["retryAfterSeconds"].as_u64())
            .filter(|seconds| *seconds > 0)
    }

    /// A `metav1.Status` failure carried as a result rather than an error: it has a code and a
    /// message but no reason (the eviction REST's answer to a pod with several budgets).
    pub fn failure_status(code: u16, message: impl Into<String>) -> Self {
        Self::new(code, "", message)
    }

    /// A watch or continue token older than the kept history.
    pub fn gone(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "InternalError", message)
    }

    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(403, "Forbidden", message)
    }

    /// `errors.NewForbidden(resource, name, why)`: `<resource> "<name>" is forbidden: <why>`.
    /// Without a resource `forbidden: <why>`, without a name `<resource> is forbidden: <why>`.
    pub fn forbidden_object(group: &str, resource: &str, name: &str, why: &str) -> Self {
        let message = match (resource, name) {
            ("", _) => format!("forbidden: {why}"),
            (_, "") => format!("{} is forbidden: {why}", qualified(group, resource)),
            _ => format!(
                "{} \"{name}\" is forbidden: {why}",
                qualified(group, resource)
            ),
        };
        Self::new(403, "Forbidden", message).with_details(details(group, resource, name))
    }

    /// A request whose credentials authenticate no one.
    pub fn unauthorized() -> Self {
        Self::new(401, "Unauthorized", "Unauthorized")
    }

    /// The `metav1.Status` body.
    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if self.reason.is_empty() {
            status.as_object_mut().map(|status| status.remove("reason"));
        }
        if let Some(details) = &self.details {
            status["details"] = details.clone();
        }
        status
    }
}

/// `pods` for the core group, `leases.coordination.k8s.io` otherwise.
pub fn qualified(group: &str, plural: &str) -> String {
    if group.is_empty() {
        plural.to_owned()
    } else {
        format!("{plural}.{group}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_found_reads_like_the_api_server() {
        let error = ApiError::not_found("coordination.k8s.io", "leases", "n1");
        let status = error.to_status();
        assert_eq!(status["code"], 404);
        assert_eq!(status["reason"], "NotFound");
        assert_eq!(
            status["message"],
            "leases.coordination.k8s.io \"n1\" not found"
        );
        assert_eq!(status["details"]["kind"], "leases");
    }

    #[test]
    fn conflict_and_invalid_carry_details() {
        let stale = ApiError::stale("", "nodes", "n1").to_status();
        assert_eq!(stale["code"], 409);
        assert_eq!(stale["reason"], "Conflict");
        assert!(
            stale["message"]
                .as_str()
                .unwrap()
                .contains("the object has been modified")
        );
        let invalid = ApiError::invalid(
            "",
            "Pod",
            "p",
            &[Cause {
                reason: "FieldValueRequired",
                field: "spec.containers".to_owned(),
                message: "Required value".to_owned(),
            }],
        )
        .to_status();
        assert_eq!(invalid["code"], 422);
        assert_eq!(invalid["details"]["causes"][0]["field"], "spec.containers");
        assert_eq!(
            invalid["message"],
            "Pod \"p\" is invalid: spec.containers: Required value"
        );
    }
}
