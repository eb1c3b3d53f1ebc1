//! The HTTP face of the simulator: Kubernetes REST paths onto the store, with the real API
//! server's verbs, parameters and error bodies.

mod access_review;
mod admit;
mod discovery;
mod event_view;
mod logs;
mod objects;
mod protobuf;
mod query;
mod render;
mod scale;
mod table;
mod target;
mod token;
mod watch;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use admit::{Refused, admitted};
use target::{Target, event_view_target, parse_target};

use crate::error::ApiError;
use crate::faults::Faults;
use crate::store::Store;

pub use query::Query;

/// What the API layer works with.
#[derive(Debug, Clone)]
pub struct App {
    pub store: Store,
    pub faults: Faults,
    pub audit: crate::audit::Audit,
    /// Where the kubelet's container logs are (`pods/log`).
    pub logs: crate::world::Logs,
    /// Signs and checks ServiceAccount tokens.
    pub tokens: crate::tokens::TokenIssuer,
    /// How often watches that allow bookmarks get one.
    pub bookmark_interval: std::time::Duration,
    /// The `WatchList` feature gate (`sendInitialEvents`).
    pub watch_list: bool,
    /// Who a request without credentials is: over plain HTTP the cluster admin, as on the
    /// API server's old insecure port (kubectl sends no token over HTTP), over TLS anonymous.
    pub without_credentials: crate::auth::User,
}

/// The router serving every Kubernetes path; `extra` (e.g. the /sim/v1 control routes) is
/// merged in front.
pub fn router(app: App, extra: Router<App>) -> Router {
    extra.fallback(handle).with_state(app)
}

async fn handle(State(app): State<App>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let body = match axum::body::to_bytes(body, 64 * 1024 * 1024).await {
        Ok(body) => body,
        Err(error) => {
            return error_response(&ApiError::bad_request(format!(
                "cannot read the request body: {error}"
            )));
        }
    };
    let query = Query::parse(parts.uri.query());
    let content_type = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let protobuf_post = content_type.contains("protobuf") && parts.method == Method::POST;
    let (body, content_type) = if protobuf_post
        && parts.uri.path() == "/apis/authentication.k8s.io/v1/selfsubjectreviews"
    {
        // A SelfSubjectReview asks nothing: its body does not matter.
        (Bytes::from_static(b"{}"), "application/json")
    } else if content_type.contains("protobuf") && parts.method != Method::PATCH && !body.is_empty()
    {
        match protobuf::object(&body) {
            Ok(object) => (
                Bytes::from(serde_json::to_vec(&object).unwrap_or_default()),
                "application/json",
            ),
            Err(why) => {
                return error_response(
                    &ApiError::unsupported_media_type(content_type).because(&why),
                );
            }
        }
    } else {
        (body, content_type)
    };
    if content_type.contains("protobuf") || content_type.contains("cbor") {
        // Only JSON (and YAML for apply) is spoken here; 415 makes clients fall back to JSON.
        return error_response(&ApiError::unsupported_media_type(content_type));
    }
    let user = match crate::auth::authenticate(&app.store, &app.tokens, &parts.headers)
        .map(|user| user.unwrap_or_else(|| app.without_credentials.clone()))
        .and_then(|user| crate::auth::impersonate(&app.store, user, &parts.headers))
    {
        Ok(user) => user,
        Err(error) => return error_response(&error),
    };
    let attributes =
        crate::auth::Attributes::from_request(&parts.method, parts.uri.path(), parts.uri.query());
    let decision = crate::auth::authorize(&app.store, &user, &attributes);
    if !decision.allowed {
        return error_response(&crate::auth::rbac::forbidden(
            &user,
            &attributes,
            &decision.reason,
        ));
    }
    let target = match parse_target(&app.store, parts.uri.path()) {
        Ok(target) => target,
        Err(error) => return error_response(&error),
    };
    if let Some(core) = event_view_target(&app, &target) {
        let current = match &core {
            Target::Object {
                kind,
                namespace,
                name,
                ..
            } if parts.method == Method::PATCH => {
                app.store.get(kind, namespace.as_deref(), name).ok()
            }
            _ => None,
        };
        let patch_type = crate::patch::PatchType::from_content_type(content_type);
        let response = match event_view::request_to_core(
            &parts.method,
            &query,
            body,
            current.as_deref(),
            patch_type,
        ) {
            Ok((method, query, body)) => {
                serve(&app, &user, &method, core, &query, &parts.headers, body)
                    .await
                    .unwrap_or_else(|error| error_response(&error))
            }
            Err(error) => return error_response(&error),
        };
        return event_view::response_from_core(response, query.is_watch()).await;
    }
    serve(
        &app,
        &user,
        &parts.method,
        target,
        &query,
        &parts.headers,
        body,
    )
    .await
    .unwrap_or_else(|error| error_response(&error))
}

async fn serve(
    app: &App,
    user: &crate::auth::User,
    method: &Method,
    target: Target,
    query: &Query,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let (method, body, bookkeeping, warnings) =
        match admitted(app, user, method, &target, query, headers, body).await {
            Ok(admitted) => admitted,
            Err(Refused { error, warnings }) => {
                return Ok(warned(error_response(&error), &warnings));
            }
        };
    let writes_object = matches!(target, Target::Object { .. }) && method != Method::GET;
    let response = match dispatch(
        app,
        user,
        &method,
        target,
        query,
        headers,
        &body,
        bookkeeping,
    ) {
        Ok(response) => response,
        Err(error) => return Ok(warned(error_response(&error), &warnings)),
    };
    if writes_object && render::Rendering::from_headers(headers) == render::Rendering::Metadata {
        return Ok(warned(metadata_only(response).await, &warnings));
    }
    Ok(warned(response, &warnings))
}

/// Adds admission webhooks' warnings as `Warning: 299 - "text"` headers (what kubectl prints
/// as `Warning: text`).
fn warned(mut response: Response, warnings: &[String]) -> Response {
    for warning in warnings {
        let text: String = warning
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect::<String>()
            .replace('\\', "\\\\")
            .replace('"', "\\\"");
        if let Ok(value) = header::HeaderValue::from_str(&format!("299 - \"{text}\"")) {
            response.headers_mut().append(header::WARNING, value);
        }
    }
    response
}

/// A written object's answer, reduced to its metadata for a client that asked for that.
async fn metadata_only(response: Response) -> Response {
    let (parts, body) = response.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, usize::MAX).await else {
        return Response::from_parts(parts, Body::empty());
    };
    let body = render::partial_body(&bytes).map_or_else(|| Body::from(bytes), Body::from);
    Response::from_parts(parts, body)
}

#[allow(clippy::too_many_arguments)]
fn dispatch(
    app: &App,
    user: &crate::auth::User,
    method: &Method,
    target: Target,
    query: &Query,
    headers: &HeaderMap,
    body: &Bytes,
    bookkeeping: objects::Bookkeeping,
) -> Result<Response, ApiError> {
    let rendering = render::Rendering::from_headers(headers);
    match target {
        Target::Version => Ok(json_response(StatusCode::OK, &discovery::version())),
        // An empty OpenAPI v2 document (an empty protobuf message): kubectl then finds no schema
        // and skips client-side validation, where it would otherwise refuse to apply.
        Target::OpenApiV2 => Ok((
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "application/com.github.proto-openapi.spec.v2.v1.0+protobuf",
            )],
            Body::empty(),
        )
            .into_response()),
        Target::ApiVersions | Target::ApiGroups => {
            let core = matches!(target, Target::ApiVersions);
            let accept = headers
                .get(header::ACCEPT)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default();
            if let Some(version) = discovery::aggregated_wanted(accept) {
                let document = discovery::aggregated(app.store.registry(), core, version);
                let mut response = json_response(StatusCode::OK, &document);
                if let Ok(content_type) =
                    header::HeaderValue::from_str(&discovery::aggregated_content_type(version))
                {
                    response
                        .headers_mut()
                        .insert(header::CONTENT_TYPE, content_type);
                }
                return Ok(response);
            }
            Ok(json_response(
                StatusCode::OK,
                &if core {
                    discovery::api_versions()
                } else {
                    discovery::api_groups(app.store.registry())
                },
            ))
        }
        Target::ResourceList { group, version } => Ok(json_response(
            StatusCode::OK,
            &discovery::resource_list(app.store.registry(), &group, &version),
        )),
        Target::Collection { kind, namespace } => {
            let namespace = namespace.as_deref();
            match *method {
                Method::GET if query.is_watch() => {
                    watch::serve(app, &kind, namespace, query, rendering)
                }
                Method::POST if kind.plural == "tokenreviews" => token::review(app, body),
                Method::POST if kind.plural == "selfsubjectreviews" => {
                    Ok(access_review::whoami(user))
                }
                Method::POST if kind.group == "authorization.k8s.io" => {
                    access_review::review(app, user, &kind.plural, namespace, body)
                }
                _ if kind.is_review() => Err(ApiError::method_not_allowed(format!(
                    "{method} is not supported on {}: they can only be created",
                    kind.plural
                ))),
                Method::GET => objects::list(app, &kind, namespace, query, rendering),
                Method::POST => objects::create(app, &kind, namespace, query, headers, body),
                Method::DELETE => {
                    objects::delete_collection(app, &user.name, &kind, namespace, query, body)
                }
                _ => Err(ApiError::method_not_allowed(format!(
                    "{method} is not supported on a collection"
                ))),
            }
        }
        Target::Object {
            kind,
            namespace,
            name,
            sub,
        } => {
            let namespace = namespace.as_deref();
            let part = match sub.as_deref() {
                None => crate::store::Part::Main,
                Some("status") if kind.has_status => crate::store::Part::Status,
                Some("eviction")
                    if kind.group.is_empty()
                        && kind.plural == "pods"
                        && *method == Method::POST =>
                {
                    return objects::evict(
                        app,
                        &user.name,
                        namespace.unwrap_or_default(),
                        &name,
                        query,
                        body,
                    );
                }
                Some("scale") if kind.scale.is_some() => {
                    return scale::serve(
                        app, method, &kind, namespace, &name, query, headers, body,
                    );
                }
                Some("log")
                    if kind.group.is_empty() && kind.plural == "pods" && *method == Method::GET =>
                {
                    return logs::serve(app, namespace.unwrap_or_default(), &name, query);
                }
                Some("token")
                    if kind.group.is_empty()
                        && kind.plural == "serviceaccounts"
                        && *method == Method::POST =>
                {
                    return token::create(app, namespace.unwrap_or_default(), &name, body);
                }
                Some(other) => {
                    return Err(ApiError::not_found(
                        &kind.group,
                        &format!("{}/{other}", kind.plural),
                        &name,
                    ));
                }
            };
            let node_written = kind.group.is_empty()
                && kind.plural == "nodes"
                && matches!(*method, Method::PUT | Method::PATCH);
            let answer = match *method {
                Method::GET => objects::get(app, &kind, namespace, &name, rendering),
                Method::PUT => objects::update(
                    app,
                    &kind,
                    namespace,
                    &name,
                    part,
                    query,
                    headers,
                    body,
                    bookkeeping,
                ),
                Method::PATCH => {
                    objects::patch(app, &kind, namespace, &name, part, query, headers, body)
                }
                Method::DELETE if part == crate::store::Part::Main => {
                    objects::delete(app, &user.name, &kind, namespace, &name, query, body)
                }
                _ => Err(ApiError::method_not_allowed(format!(
                    "{method} is not supported here"
                ))),
            };
            if node_written && answer.is_ok() {
                app.audit
                    .node_written(&name, part == crate::store::Part::Status, &user.name);
            }
            answer
        }
    }
}

pub fn json_response(code: StatusCode, value: &Value) -> Response {
    bytes_response(code, serde_json::to_vec(value).unwrap_or_default())
}

pub fn bytes_response(code: StatusCode, bytes: Vec<u8>) -> Response {
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        Body::from(bytes),
    )
        .into_response()
}

pub fn error_response(error: &ApiError) -> Response {
    let code = StatusCode::from_u16(error.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = json_response(code, &error.to_status());
    if let Some(seconds) = error.retry_after_seconds() {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, header::HeaderValue::from(seconds));
    }
    response
}
