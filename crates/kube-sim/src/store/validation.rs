//! Field validation as the API server words it: an `Invalid` 422 naming the field
//! (apimachinery/pkg/api/validation, pkg/apis/core/validation), and the name rules most kinds
//! share. Used by the strategies and the workload defaults alike.

use crate::error::{ApiError, Cause};
use crate::resources::ResourceType;

pub fn invalid(
    kind: &ResourceType,
    name: &str,
    field: &str,
    reason: &'static str,
    message: String,
) -> ApiError {
    ApiError::invalid(
        &kind.group,
        &kind.kind,
        name,
        &[Cause {
            reason,
            field: field.to_owned(),
            message,
        }],
    )
}

/// An RFC 1123 subdomain: what most object names must be.
pub fn is_dns_subdomain(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
}
