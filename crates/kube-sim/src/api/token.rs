//! `serviceaccounts/{name}/token` (TokenRequest: pkg/registry/core/serviceaccount/storage/
//! token.go) and `tokenreviews` (TokenReview: pkg/registry/authentication/tokenreview), with
//! tokens from the server's [`TokenIssuer`](crate::tokens::TokenIssuer).

use axum::body::Bytes;
use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{Value, json};

use super::{App, json_response};
use crate::auth::authenticate::service_account_user;
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
    let (bound, node) = bind(app, namespace, &request["spec"]["boundObjectRef"])?;
    let claims = service_account_claims(
        namespace,
        &account,
        &audiences,
        seconds,
        &bound,
        node.as_ref(),
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
    let status = match service_account_user(&app.store, &app.tokens, &token, &wanted) {
        Ok((user, audiences)) => {
            json!({"authenticated": true, "user": user.to_json(), "audiences": audiences})
        }
        Err(error) => json!({"authenticated": false, "user": {}, "error": error}),
    };
    review["kind"] = json!("TokenReview");
    review["apiVersion"] = json!("authentication.k8s.io/v1");
    review["metadata"] = json!({"creationTimestamp": null});
    review["status"] = status;
    Ok(json_response(StatusCode::CREATED, &review))
}

/// The object a token is bound to, with its uid, and for a pod its node (the
/// ServiceAccountTokenPodNodeInfo claims); the object must exist with the uid given.
fn bind(app: &App, namespace: &str, bound: &Value) -> Result<(Value, Option<Value>), ApiError> {
    let Some(kind) = bound["kind"].as_str() else {
        return Ok((Value::Null, None));
    };
    let name = bound["name"].as_str().unwrap_or_default();
    let plural = match kind {
        "Pod" => "pods",
        "Secret" => "secrets",
        "Node" => "nodes",
        other => {
            return Err(ApiError::bad_request(format!(
                "cannot bind token to object of type {other}: only Pod, Secret and Node are supported"
            )));
        }
    };
    let object = app
        .store
        .get(
            &app.store.kind("", plural),
            (kind != "Node").then_some(namespace),
            name,
        )
        .map_err(|_| ApiError::not_found("", plural, name))?;
    if bound["uid"]
        .as_str()
        .is_some_and(|uid| object["metadata"]["uid"] != uid)
    {
        return Err(ApiError::conflict(
            "",
            plural,
            name,
            "the UID in the bound object reference does not match the object's",
        ));
    }
    let bound = json!({"kind": kind, "name": name, "uid": object["metadata"]["uid"]});
    let Some(node_name) = object["spec"]["nodeName"]
        .as_str()
        .filter(|_| kind == "Pod")
    else {
        return Ok((bound, None));
    };
    let node = app
        .store
        .get(&app.store.kind("", "nodes"), None, node_name)
        .map_err(|_| ApiError::not_found("", "nodes", node_name))?;
    Ok((
        bound,
        Some(json!({"name": node_name, "uid": node["metadata"]["uid"]})),
    ))
}
