//! The query parameters of API requests.

use std::collections::HashMap;
use std::time::Duration;

use crate::error::ApiError;

#[derive(Debug, Clone, Default)]
pub struct Query {
    params: HashMap<String, String>,
}

impl Query {
    pub fn parse(raw: Option<&str>) -> Self {
        let params = raw
            .map(|raw| {
                form_urlencoded::parse(raw.as_bytes())
                    .into_owned()
                    .collect()
            })
            .unwrap_or_default();
        Self { params }
    }

    /// A copy with `name` set to `value`.
    #[must_use]
    pub fn with(&self, name: &str, value: &str) -> Self {
        let mut params = self.params.clone();
        params.insert(name.to_owned(), value.to_owned());
        Self { params }
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.params
            .get(name)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }

    pub fn flag(&self, name: &str) -> bool {
        matches!(self.get(name), Some("true" | "1"))
    }

    pub fn is_watch(&self) -> bool {
        self.flag("watch")
    }

    pub fn dry_run(&self) -> bool {
        self.get("dryRun").is_some()
    }

    pub fn limit(&self) -> Result<usize, ApiError> {
        self.get("limit").map_or(Ok(0), |limit| {
            limit
                .parse::<i64>()
                .map(|limit| usize::try_from(limit).unwrap_or(0))
                .map_err(|_| {
                    ApiError::bad_request(format!(
                        "limit: Invalid value: {limit:?}: must be an integer"
                    ))
                })
        })
    }

    /// `resourceVersion` as a number; empty and "0" mean "any", as for the real server.
    pub fn resource_version(&self) -> Result<u64, ApiError> {
        self.get("resourceVersion").map_or(Ok(0), |version| {
            version.parse().map_err(|_| {
                ApiError::bad_request(format!(
                    "resourceVersion: Invalid value: {version:?}: must be a non-negative integer"
                ))
            })
        })
    }

    pub fn timeout(&self) -> Option<Duration> {
        self.get("timeoutSeconds")
            .and_then(|seconds| seconds.parse::<u64>().ok())
            .map(Duration::from_secs)
    }

    pub fn grace_period_seconds(&self) -> Result<Option<i64>, ApiError> {
        self.get("gracePeriodSeconds")
            .map(|grace| {
                grace.parse().map_err(|_| {
                    ApiError::bad_request(format!("gracePeriodSeconds: Invalid value: {grace:?}"))
                })
            })
            .transpose()
    }
}
