//! `serviceaccounts/{name}/token` (TokenRequest): a token for the ServiceAccount, with the
//! audiences, expiry and bound object asked for (pkg/registry/core/serviceaccount/storage/token.go).
//! The token is a JWT with the real claims, but unsigned: the simulator authenticates nobody.

use axum::body::Bytes;
use axum::http::StatusCode;
use axum::response::Response;
use base64::Engine;
use serde_json::{Value, json};

use super::{App, json_response};
use crate::error::{ApiError, Cause};
use crate::store::timestamps::format_time;

const DEFAULT_AUDIENCE: &str = "https://kubernetes.default.svc.cluster.local";
const DEFAULT_SECONDS: i64 = 3600;
const MIN_SECONDS: i64 = 600;

pub fn create(app: &App, namespace: &str, name: &str, body: &Bytes) -> Result<Response, ApiError> {
    let accounts = app.store.kind("", "serviceaccounts");
    let account = app.store.get(&accounts, Some(namespace), name)?;
    let mut request: Value = if body.is_empty() {
        json!({})
    } else {
        serde_json::from_slice(body).map_err(|e| {
            ApiError::bad_request(format!("the request body is not valid JSON: {e}"))
        })?
    };
    let seconds = request["spec"]["expirationSeconds"]
        .as_i64()
        .unwrap_or(DEFAULT_SECONDS);
    if seconds < MIN_SECONDS {
        return Err(ApiError::invalid(
            "authentication.k8s.io",
            "TokenRequest",
            name,
            &[Cause {
                reason: "FieldValueInvalid",
                field: "spec.expirationSeconds".to_owned(),
                message: format!(
                    "Invalid value: {seconds}: may not specify a duration less than 10 minutes"
                ),
            }],
        ));
    }
    let audiences = match request["spec"]["audiences"].as_array() {
        Some(audiences) if !audiences.is_empty() => Value::Array(audiences.clone()),
        _ => json!([DEFAULT_AUDIENCE]),
    };
    let now = jiff::Timestamp::now();
    let expires = now
        .checked_add(jiff::SignedDuration::from_secs(seconds))
        .unwrap_or(now);
    let mut private = json!({
        "namespace": namespace,
        "serviceaccount": {"name": name, "uid": account["metadata"]["uid"]},
    });
    let bound = &request["spec"]["boundObjectRef"];
    if let Some(kind) = bound["kind"].as_str() {
        private[kind.to_lowercase()] = json!({"name": bound["name"], "uid": bound["uid"]});
    }
    let claims = json!({
        "aud": audiences,
        "exp": expires.as_second(),
        "iat": now.as_second(),
        "nbf": now.as_second(),
        "iss": DEFAULT_AUDIENCE,
        "sub": format!("system:serviceaccount:{namespace}:{name}"),
        "kubernetes.io": private,
    });
    let encode = |value: &Value| {
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(serde_json::to_vec(value).unwrap_or_default())
    };
    let token = format!("{}.{}.", encode(&json!({"alg": "none"})), encode(&claims));
    request["kind"] = json!("TokenRequest");
    request["apiVersion"] = json!("authentication.k8s.io/v1");
    request["metadata"]["name"] = json!(name);
    request["metadata"]["namespace"] = json!(namespace);
    request["metadata"]["creationTimestamp"] = Value::Null;
    request["spec"]["audiences"] = audiences;
    request["spec"]["expirationSeconds"] = json!(seconds);
    request["status"] = json!({"token": token, "expirationTimestamp": format_time(expires)});
    Ok(json_response(StatusCode::CREATED, &request))
}
