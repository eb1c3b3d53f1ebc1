//! Admission webhooks: the simulator calls the registered Mutating- and
//! ValidatingWebhookConfigurations for API writes (not for its own controllers' writes), with
//! AdmissionReview v1 over HTTPS trusting the configured `caBundle`.
//!
//! Supported: `clientConfig.url` and `clientConfig.service` (routed to a Ready pod the
//! Service selects), rules (operations, groups, versions, resources with
//! subresources and `*`), `namespaceSelector`, `objectSelector`, `timeoutSeconds`,
//! `failurePolicy`, JSONPatch mutations. Not supported: reinvocation, `matchConditions`.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{Value, json};

use crate::error::ApiError;
use crate::resources::ResourceType;
use crate::selector::LabelSelector;
use crate::store::Store;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    Create,
    Update,
    Delete,
}

impl Operation {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Create => "CREATE",
            Self::Update => "UPDATE",
            Self::Delete => "DELETE",
        }
    }
}

/// One admission request.
#[derive(Debug)]
pub struct Request<'a> {
    pub operation: Operation,
    pub kind: &'a ResourceType,
    pub subresource: Option<&'a str>,
    pub namespace: Option<&'a str>,
    pub name: &'a str,
    /// The (group, version, kind) of the object when it is not the resource's own kind, as for
    /// `pods/eviction` (an Eviction).
    pub object_kind: Option<(&'a str, &'a str, &'a str)>,
    pub old: Option<&'a Value>,
    pub dry_run: bool,
    /// Who asked (the webhooks' `userInfo`).
    pub user: &'a crate::auth::User,
}

/// Whether any webhook is registered at all (the fast path skips admission otherwise).
pub fn any_registered(store: &Store) -> bool {
    [
        "mutatingwebhookconfigurations",
        "validatingwebhookconfigurations",
    ]
    .iter()
    .any(|plural| {
        !store
            .all(&store.kind("admissionregistration.k8s.io", plural))
            .is_empty()
    })
}

/// What admission made of a write: the object as mutated, and the webhooks' warnings for
/// the client (`Warning` headers).
#[derive(Debug)]
pub struct Admitted {
    pub object: Value,
    pub warnings: Vec<String>,
}

/// Runs the mutating webhooks, then the validating ones, on `object` (the new state; the old
/// one for DELETE). A denial keeps the warnings gathered before it, as the API server sends
/// them with the error.
pub async fn admit(
    store: &Store,
    request: &Request<'_>,
    mut object: Value,
) -> Result<Admitted, (ApiError, Vec<String>)> {
    let mut warnings = Vec::new();
    for (plural, mutating) in [
        ("mutatingwebhookconfigurations", true),
        ("validatingwebhookconfigurations", false),
    ] {
        for configuration in store.all(&store.kind("admissionregistration.k8s.io", plural)) {
            for webhook in configuration["webhooks"].as_array().into_iter().flatten() {
                if !applies(store, webhook, request, &object) {
                    continue;
                }
                let name = webhook["name"].as_str().unwrap_or_default();
                let ignore = webhook["failurePolicy"].as_str() == Some("Ignore");
                match call(store, webhook, request, &object, mutating).await {
                    Ok(response) => {
                        warnings
                            .extend(crate::json::strings(&response["warnings"]).map(str::to_owned));
                        if response["allowed"] != true {
                            return Err((denied(name, &response["status"]), warnings));
                        }
                        if mutating && let Some(patch) = response["patch"].as_str() {
                            object = apply_patch(name, &object, patch)
                                .map_err(|error| (error, warnings.clone()))?;
                        }
                    }
                    Err(_) if ignore => {}
                    Err(why) => {
                        return Err((
                            ApiError::internal(format!(
                                "Internal error occurred: failed calling webhook \"{name}\": {why}"
                            )),
                            warnings,
                        ));
                    }
                }
            }
        }
    }
    Ok(Admitted { object, warnings })
}

/// A denial as the API server's `ToStatusErr` reports it: the code (400 when below 400), the
/// webhook's reason, and its message (or reason) after "denied the request".
fn denied(name: &str, status: &Value) -> ApiError {
    const REASONS: [&str; 18] = [
        "Unauthorized",
        "Forbidden",
        "NotFound",
        "AlreadyExists",
        "Conflict",
        "Gone",
        "Invalid",
        "ServerTimeout",
        "Timeout",
        "TooManyRequests",
        "BadRequest",
        "MethodNotAllowed",
        "NotAcceptable",
        "RequestEntityTooLarge",
        "UnsupportedMediaType",
        "InternalError",
        "Expired",
        "ServiceUnavailable",
    ];
    let code = status["code"]
        .as_u64()
        .and_then(|c| u16::try_from(c).ok())
        .filter(|c| *c >= 400)
        .unwrap_or(400);
    let given_reason = status["reason"].as_str().unwrap_or_default();
    let message = status["message"].as_str().unwrap_or_default();
    let denied_by = format!("admission webhook \"{name}\" denied the request");
    let message = if !message.is_empty() {
        format!("{denied_by}: {message}")
    } else if !given_reason.is_empty() {
        format!("{denied_by}: {given_reason}")
    } else {
        format!("{denied_by} without explanation")
    };
    ApiError {
        code,
        reason: REASONS
            .into_iter()
            .find(|reason| *reason == given_reason)
            .unwrap_or(if given_reason.is_empty() {
                ""
            } else {
                "BadRequest"
            }),
        message,
        details: None,
    }
}

fn apply_patch(webhook: &str, object: &Value, encoded: &str) -> Result<Value, ApiError> {
    let invalid = |why: String| {
        ApiError::internal(format!(
            "Internal error occurred: webhook \"{webhook}\" returned an invalid patch: {why}"
        ))
    };
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .map_err(|e| invalid(e.to_string()))?;
    let patch: json_patch::Patch =
        serde_json::from_slice(&bytes).map_err(|e| invalid(e.to_string()))?;
    let mut patched = object.clone();
    json_patch::patch(&mut patched, &patch).map_err(|e| invalid(e.to_string()))?;
    Ok(patched)
}

fn matches_any(list: &Value, value: &str) -> bool {
    list.as_array()
        .is_some_and(|items| items.iter().any(|item| item == "*" || item == value))
}

pub(crate) fn applies(
    store: &Store,
    webhook: &Value,
    request: &Request<'_>,
    object: &Value,
) -> bool {
    let kind = request.kind;
    let resource = match request.subresource {
        Some(sub) => format!("{}/{sub}", kind.plural),
        None => kind.plural.clone(),
    };
    let rule_matches = webhook["rules"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|rule| {
            let resources_match = rule["resources"].as_array().is_some_and(|resources| {
                resources.iter().filter_map(Value::as_str).any(|pattern| {
                    pattern == resource
                        || pattern == "*/*"
                        || (pattern == "*" && request.subresource.is_none())
                        || pattern
                            .strip_suffix("/*")
                            .is_some_and(|p| p == kind.plural && request.subresource.is_some())
                        || pattern
                            .strip_prefix("*/")
                            .is_some_and(|s| Some(s) == request.subresource)
                })
            });
            matches_any(&rule["operations"], request.operation.as_str())
                && matches_any(&rule["apiGroups"], &kind.group)
                && matches_any(&rule["apiVersions"], &kind.version)
                && resources_match
        });
    if !rule_matches {
        return false;
    }
    // An absent selector matches everything (unlike a null LabelSelector elsewhere).
    let everything = json!({});
    let object_selector = LabelSelector::from_object(if webhook["objectSelector"].is_null() {
        &everything
    } else {
        &webhook["objectSelector"]
    });
    let labelled_by =
        |o: Option<&Value>| o.is_some_and(|o| object_selector.as_ref().is_ok_and(|s| s.matches(o)));
    if !(labelled_by(Some(object)) || labelled_by(request.old)) {
        return false;
    }
    if let Some(namespace) = request
        .namespace
        .filter(|_| !webhook["namespaceSelector"].is_null())
    {
        let selector = LabelSelector::from_object(&webhook["namespaceSelector"]);
        let namespace = store.get(&store.kind("", "namespaces"), None, namespace);
        return namespace.is_ok_and(|ns| selector.is_ok_and(|s| s.matches(&ns)));
    }
    true
}

async fn call(
    store: &Store,
    webhook: &Value,
    request: &Request<'_>,
    object: &Value,
    mutating: bool,
) -> Result<Value, String> {
    let destination = destination(store, &webhook["clientConfig"])?;
    let timeout = Duration::from_secs(
        webhook["timeoutSeconds"]
            .as_u64()
            .unwrap_or(10)
            .clamp(1, 30),
    );
    let ca = webhook["clientConfig"]["caBundle"]
        .as_str()
        .unwrap_or_default();
    let uid = crate::store::names::new_uid();
    let kind = request.kind;
    let (new_object, old_object) = match request.operation {
        Operation::Delete => (Value::Null, request.old.cloned().unwrap_or(Value::Null)),
        _ => (object.clone(), request.old.cloned().unwrap_or(Value::Null)),
    };
    let (group, version, object_kind) = request.object_kind.unwrap_or((
        kind.group.as_str(),
        kind.version.as_str(),
        kind.kind.as_str(),
    ));
    let object_kind = json!({"group": group, "version": version, "kind": object_kind});
    let review = json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": object_kind,
            "resource": {"group": kind.group, "version": kind.version, "resource": kind.plural},
            "subResource": request.subresource,
            "requestKind": object_kind,
            "requestResource": {"group": kind.group, "version": kind.version, "resource": kind.plural},
            "name": request.name,
            "namespace": request.namespace,
            "operation": request.operation.as_str(),
            "userInfo": request.user.to_json(),
            "object": new_object,
            "oldObject": old_object,
            "dryRun": request.dry_run,
        },
    });
    let response = tokio::time::timeout(timeout, post(&destination, ca, &review))
        .await
        .map_err(|_| format!("context deadline exceeded ({}s)", timeout.as_secs()))??;
    // The checks of the API server's VerifyAdmissionResponse, in its words.
    let answer = &response["response"];
    if answer.is_null() {
        return Err("webhook response was absent".to_owned());
    }
    if answer["uid"] != uid.as_str() {
        return Err(format!(
            "expected response.uid={uid:?}, got {}",
            answer["uid"]
        ));
    }
    let group_version_kind = (
        response["apiVersion"].as_str().unwrap_or_default(),
        response["kind"].as_str().unwrap_or_default(),
    );
    if group_version_kind != ("admission.k8s.io/v1", "AdmissionReview") {
        return Err(format!(
            "expected webhook response of admission.k8s.io/v1, Kind=AdmissionReview, got {}, Kind={}",
            group_version_kind.0, group_version_kind.1
        ));
    }
    let has_patch = answer["patch"]
        .as_str()
        .is_some_and(|patch| !patch.is_empty());
    let has_patch_type = !answer["patchType"].is_null();
    if mutating {
        if has_patch && !has_patch_type {
            return Err("webhook returned response.patch but not response.patchType".to_owned());
        }
        if !has_patch && has_patch_type {
            return Err("webhook returned response.patchType but not response.patch".to_owned());
        }
    } else if has_patch {
        return Err("validating webhook may not return response.patch".to_owned());
    } else if has_patch_type {
        return Err("validating webhook may not return response.patchType".to_owned());
    }
    Ok(answer.clone())
}

/// Where a webhook is called: the address to connect to, the name its certificate must
/// carry, and the request path.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Destination {
    host: String,
    port: u16,
    server_name: String,
    path: String,
}

/// `clientConfig.url`, or `clientConfig.service` routed as the API server's service resolver
/// does — to the Service's port, then to a ready endpoint (a Ready pod the selector picks) on
/// the target port — verified as `<service>.<namespace>.svc`.
fn destination(store: &Store, client_config: &Value) -> Result<Destination, String> {
    if let Some(url) = client_config["url"].as_str() {
        let uri: http::Uri = url
            .parse()
            .map_err(|e| format!("invalid url {url:?}: {e}"))?;
        if uri.scheme_str() != Some("https") {
            return Err(format!("webhook url {url:?} must be https"));
        }
        let host = uri
            .host()
            .ok_or("the url has no host")?
            .trim_matches(['[', ']'])
            .to_owned();
        return Ok(Destination {
            server_name: host.clone(),
            host,
            port: uri.port_u16().unwrap_or(443),
            path: uri.path_and_query().map_or("/", |p| p.as_str()).to_owned(),
        });
    }
    let service = &client_config["service"];
    let (namespace, name) = (
        service["namespace"].as_str().unwrap_or_default(),
        service["name"].as_str().unwrap_or_default(),
    );
    if name.is_empty() {
        return Err("clientConfig names neither a url nor a service".to_owned());
    }
    let port = service["port"].as_u64().unwrap_or(443);
    let found = store
        .get(&store.kind("", "services"), Some(namespace), name)
        .map_err(|_| format!("service \"{name}\" not found"))?;
    let service_port = found["spec"]["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["port"].as_u64() == Some(port))
        .ok_or_else(|| format!("no service port {port} found for service \"{name}\""))?;
    let selector = LabelSelector::from_object(&json!({"matchLabels": found["spec"]["selector"]}))
        .map_err(|e| e.to_string())?;
    let pods = store.list(&store.kind("", "pods"), Some(namespace), None, 0, &|pod| {
        selector.matches(pod)
            && pod["metadata"]["deletionTimestamp"].is_null()
            && pod["status"]["podIP"].is_string()
            && pod["status"]["conditions"].as_array().is_some_and(|c| {
                c.iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            })
    });
    let pod = pods
        .items
        .first()
        .ok_or_else(|| format!("no endpoints available for service \"{name}\""))?;
    let target = match &service_port["targetPort"] {
        Value::Number(number) => number.as_u64(),
        Value::String(port_name) => pod["spec"]["containers"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|c| c["ports"].as_array().cloned().unwrap_or_default())
            .find(|p| p["name"] == port_name.as_str())
            .and_then(|p| p["containerPort"].as_u64()),
        _ => Some(port),
    }
    .and_then(|p| u16::try_from(p).ok())
    .ok_or_else(|| format!("service \"{name}\" has no usable target port for port {port}"))?;
    Ok(Destination {
        host: pod["status"]["podIP"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        port: target,
        server_name: format!("{name}.{namespace}.svc"),
        path: service["path"].as_str().unwrap_or("/").to_owned(),
    })
}

async fn post(destination: &Destination, ca_bundle: &str, review: &Value) -> Result<Value, String> {
    let Destination {
        host,
        port,
        server_name,
        path,
    } = destination;
    let port = *port;
    let pem = base64::engine::general_purpose::STANDARD
        .decode(ca_bundle)
        .map_err(|e| format!("caBundle is not base64: {e}"))?;
    let mut roots = rustls::RootCertStore::empty();
    for certificate in CertificateDer::pem_slice_iter(&pem) {
        roots
            .add(certificate.map_err(|e| format!("caBundle: {e}"))?)
            .map_err(|e| format!("caBundle: {e}"))?;
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let stream = tokio::net::TcpStream::connect((host.as_str(), port))
        .await
        .map_err(|e| format!("dial tcp {host}:{port}: {e}"))?;
    let verified_name = ServerName::try_from(server_name.clone()).map_err(|e| e.to_string())?;
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(verified_name, stream)
        .await
        .map_err(|e| format!("tls: {e}"))?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .map_err(|e| e.to_string())?;
    tokio::spawn(connection);
    let body = serde_json::to_vec(review).map_err(|e| e.to_string())?;
    let request = http::Request::post(path.as_str())
        .header(http::header::HOST, format!("{server_name}:{port}"))
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| e.to_string())?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| e.to_string())?;
    let status = response.status();
    let bytes = response
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    if !status.is_success() {
        return Err(format!("the webhook answered {status}"));
    }
    serde_json::from_slice(&bytes)
        .map_err(|e| format!("the webhook's answer is not an AdmissionReview: {e}"))
}
