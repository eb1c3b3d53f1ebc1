//! `serviceaccounts/{name}/token` (TokenRequest: pkg/registry/core/serviceaccount/storage/
//! token.go) and `tokenreviews` (TokenReview: pkg/registry/authentication/tokenreview), with
//! tokens from the server's [`TokenIssuer`](crate::tokens::TokenIssuer).

use axum::body::Bytes;
use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{Value, json};

use super::{App, json_response};
use crate::error::{ApiError, Cause};
use crate::store::timestamps::format_time;
use crate::tokens::{API_AUDIENCE, service_account_claims};

const DEFAULT_SECONDS: i64 = 3600;
const MIN_SECONDS: i64 = 600;

fn parse(body: &Bytes) -> Result<Value, ApiError> {
    if body.is_empty() {
        return Ok(json!({}));
    }
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the request body is not valid JSON: {e}")))
}

pub fn create(app: &App, namespace: &str, name: &str, body: &Bytes) -> Result<Response, ApiError> {
    let accounts = app.store.kind("", "serviceaccounts");
    let account = app.store.get(&accounts, Some(namespace), name)?;
    let mut request = parse(body)?;
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
        _ => json!([API_AUDIENCE]),
    };
    let claims = service_account_claims(
        namespace,
        &account,
        &audiences,
        seconds,
        &request["spec"]["boundObjectRef"],
    );
    let expires = jiff::Timestamp::from_second(claims["exp"].as_i64().unwrap_or_default())
        .unwrap_or_else(|_| jiff::Timestamp::now());
    request["kind"] = json!("TokenRequest");
    request["apiVersion"] = json!("authentication.k8s.io/v1");
    request["metadata"]["name"] = json!(name);
    request["metadata"]["namespace"] = json!(namespace);
    request["metadata"]["creationTimestamp"] = Value::Null;
    request["spec"]["audiences"] = audiences;
    request["spec"]["expirationSeconds"] = json!(seconds);
    request["status"] =
        json!({"token": app.tokens.issue(&claims), "expirationTimestamp": format_time(expires)});
    Ok(json_response(StatusCode::CREATED, &request))
}

/// Whether a token is one of ours, unexpired, for one of the audiences asked about, and its
/// ServiceAccount still the one it was issued for.
pub fn review(app: &App, body: &Bytes) -> Result<Response, ApiError> {
    let mut review = parse(body)?;
    let token = review["spec"]["token"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let wanted: Vec<Value> = match review["spec"]["audiences"].as_array() {
        Some(audiences) if !audiences.is_empty() => audiences.clone(),
        _ => vec![json!(API_AUDIENCE)],
    };
    let status = match authenticate(app, &token, &wanted) {
        Ok((user, audiences)) => {
            json!({"authenticated": true, "user": user, "audiences": audiences})
        }
        Err(error) => json!({"authenticated": false, "user": {}, "error": error}),
    };
    review["kind"] = json!("TokenReview");
    review["apiVersion"] = json!("authentication.k8s.io/v1");
    review["metadata"] = json!({"creationTimestamp": null});
    review["status"] = status;
    Ok(json_response(StatusCode::CREATED, &review))
}

fn authenticate(app: &App, token: &str, wanted: &[Value]) -> Result<(Value, Vec<Value>), String> {
    let claims = app.tokens.verify(token).map_err(str::to_owned)?;
    let granted: Vec<Value> = claims["aud"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|aud| wanted.contains(aud))
        .cloned()
        .collect();
    if granted.is_empty() {
        return Err("token audiences is invalid for the target audiences".to_owned());
    }
    let private = &claims["kubernetes.io"];
    let namespace = private["namespace"].as_str().unwrap_or_default();
    let name = private["serviceaccount"]["name"]
        .as_str()
        .unwrap_or_default();
    let accounts = app.store.kind("", "serviceaccounts");
    let account = app
        .store
        .get(&accounts, Some(namespace), name)
        .map_err(|_| format!("serviceaccounts \"{name}\" not found"))?;
    if account["metadata"]["uid"] != private["serviceaccount"]["uid"] {
        return Err("the ServiceAccount the token was issued for no longer exists".to_owned());
    }
    let user = json!({
        "username": format!("system:serviceaccount:{namespace}:{name}"),
        "uid": account["metadata"]["uid"],
        "groups": ["system:serviceaccounts", format!("system:serviceaccounts:{namespace}"), "system:authenticated"],
    });
    Ok((user, granted))
}
