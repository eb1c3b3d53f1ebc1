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
        Self::new(
            422,
            "Invalid",
            format!("{kind} \"{name}\" is invalid: {}", summary.join(", ")),
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

    pub fn too_many_requests(message: impl Into<String>, details: Option<Value>) -> Self {
        Self {
            details,
            ..Self::new(429, "TooManyRequests", message)
        }
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

/// The body of a successful deletion where the API returns a Status instead of the object.
pub fn success_status(group: &str, plural: &str, name: &str, uid: &str) -> Value {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": {"name": name, "group": group, "kind": plural, "uid": uid},
    })
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
