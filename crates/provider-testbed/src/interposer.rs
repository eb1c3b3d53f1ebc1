//! An HTTP interposer in front of a provider's test server (moto, sushy-tools): it forwards
//! requests and puts a cloud's faults between the program and the server, as EC2 shows them:
//! throttling, 500s, an answer lost after the request took effect, an endpoint gone after a
//! chosen call, and the eventual consistency of a machine just launched (DescribeInstances
//! does not know it yet). Reads each Query API form, so a fault can follow an `Action` and a
//! hook can mirror what reached the server.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// What the interposer does with the next requests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Mode {
    #[default]
    Forward,
    /// Forwards until a request with this `Action` has been answered, then fails everything.
    FailAfter(String),
    /// Answers every request 503 `Unavailable`, as EC2 does when it cannot serve.
    Fail,
    /// Answers 503 `RequestLimitExceeded` without forwarding: EC2's throttling.
    Throttle,
    /// Answers 500 `InternalError` without forwarding.
    InternalError,
    /// Forwards (the request takes effect), then answers nothing for [`LOST_ANSWER_HOLD`] and
    /// closes the connection: the client's timeout fires after the cloud acted.
    LoseAnswers,
    /// Answers requests with this Query API `Action` (or, for a REST API such as Redfish,
    /// whose path contains it) 403 without forwarding them: EC2's `UnauthorizedOperation` for
    /// an IAM policy that lacks the action, Redfish's `InsufficientPrivilege` for a BMC
    /// account of too low a role. Forwards the others.
    Refuse(String),
    /// Holds requests with this `Action` (or path part) unanswered for [`LOST_ANSWER_HOLD`]
    /// without forwarding them: an endpoint that hangs past the client's timeout.
    Hang(String),
    /// Answers every request 200 with a document that is not EC2's (S3's bucket listing): a
    /// `--aws-endpoint-url` that points at another service.
    ForeignDocument,
    /// Answers every request 401 without forwarding: a BMC whose account was changed under
    /// the Secret (a rotated password, a locked-out user).
    Unauthorized,
    /// Answers requests whose path contains this 204, as accepted, without forwarding them: a
    /// BMC that takes a `ComputerSystem.Reset` and never carries it out.
    Swallow(String),
}

/// How long a lost answer holds its connection: longer than any client timeout under test.
pub const LOST_ANSWER_HOLD: Duration = Duration::from_secs(20);

/// A request that reached the interposer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub body: String,
    /// When it arrived (wall clock, for a judge that reports in it).
    pub at: std::time::SystemTime,
    /// Answered `RequestLimitExceeded` by the interposer: one of the client's own retries of
    /// a throttled call, not a call of its own.
    pub throttled: bool,
}

impl Seen {
    /// A Query API request's form field (`Action`, `InstanceId.1`).
    pub fn field(&self, name: &str) -> Option<String> {
        form_urlencoded::parse(self.body.as_bytes())
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.into_owned())
    }

    /// A Redfish `ComputerSystem.Reset`'s system id and `ResetType`.
    pub fn redfish_reset(&self) -> Option<(String, String)> {
        redfish_reset(&self.method, &self.path, &self.body)
    }

    /// The values of `InstanceId.N` of a Query API request.
    pub fn instance_ids(&self) -> Vec<String> {
        form_urlencoded::parse(self.body.as_bytes())
            .filter(|(key, _)| key.starts_with("InstanceId."))
            .map(|(_, value)| value.into_owned())
            .collect()
    }
}

/// A request about to be forwarded to the server, for the hook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forwarding {
    /// A Query API request's `Action`; empty for a REST request (Redfish).
    pub action: String,
    /// The values of `InstanceId.N`.
    pub instance_ids: Vec<String>,
    pub method: String,
    pub path: String,
    pub body: String,
    /// The client will not get the answer (mode [`Mode::LoseAnswers`]).
    pub answer_lost: bool,
}

impl Forwarding {
    /// A Redfish `ComputerSystem.Reset`: the system's id (its path's part after `Systems/`)
    /// and the `ResetType` asked for.
    pub fn redfish_reset(&self) -> Option<(String, String)> {
        redfish_reset(&self.method, &self.path, &self.body)
    }
}

/// A Redfish `ComputerSystem.Reset` request's system id and `ResetType`.
pub fn redfish_reset(method: &str, path: &str, body: &str) -> Option<(String, String)> {
    if method != "POST" || !path.contains("/Actions/ComputerSystem.Reset") {
        return None;
    }
    let system = path
        .split("/Systems/")
        .nth(1)?
        .split('/')
        .next()?
        .to_owned();
    let body: serde_json::Value = serde_json::from_str(body).ok()?;
    Some((system, body["ResetType"].as_str()?.to_owned()))
}

/// Called before each forwarded request reaches the server, and awaited.
pub type Hook = Arc<dyn Fn(Forwarding) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

#[derive(Default)]
struct Shared {
    mode: Mode,
    failed: u64,
    seen: Vec<Seen>,
    /// Instance ids DescribeInstances answers leave out, and until when.
    hidden: HashMap<String, Instant>,
    /// DescribeInstances answers that left a machine out.
    hiding_answers: u64,
    hook: Option<Hook>,
}

pub struct Interposer {
    pub address: SocketAddr,
    shared: Arc<Mutex<Shared>>,
    serving: JoinHandle<()>,
}

impl std::fmt::Debug for Interposer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Interposer")
            .field("address", &self.address)
            .finish_non_exhaustive()
    }
}

impl Drop for Interposer {
    fn drop(&mut self) {
        self.serving.abort();
    }
}

fn error_document(code: &str, message: &str) -> Bytes {
    Bytes::from(format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error><Code>{code}</Code>\
         <Message>{message} (interposed)</Message></Error></Errors><RequestID>interposed</RequestID>\
         </Response>"
    ))
}

impl Interposer {
    pub async fn start(upstream: &str) -> std::io::Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let address = listener.local_addr()?;
        let shared: Arc<Mutex<Shared>> = Arc::default();
        let relay = Arc::new(Relay {
            shared: Arc::clone(&shared),
            client: Client::builder(TokioExecutor::new()).build_http(),
            upstream: upstream.trim_end_matches('/').to_owned(),
        });
        let serving = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let relay = Arc::clone(&relay);
                tokio::spawn(async move {
                    let service = service_fn(move |request| {
                        let relay = Arc::clone(&relay);
                        async move { relay.relay(request).await }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(Self {
            address,
            shared,
            serving,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.address)
    }

    pub fn set(&self, mode: Mode) {
        self.lock().mode = mode;
    }

    pub fn mode(&self) -> Mode {
        self.lock().mode.clone()
    }

    /// Mirrors what reaches the server: the hook runs before each forwarded request.
    pub fn set_hook(&self, hook: Hook) {
        self.lock().hook = Some(hook);
    }

    /// DescribeInstances answers leave instance `id` out until `until`, as EC2 does for a
    /// machine it has not yet propagated. A later call moves the end.
    pub fn hide(&self, id: &str, until: Instant) {
        self.lock().hidden.insert(id.to_owned(), until);
    }

    /// Requests answered with a failure so far (a lost answer counts).
    pub fn failed(&self) -> u64 {
        self.lock().failed
    }

    /// DescribeInstances answers so far that left a hidden machine out.
    pub fn hiding_answers(&self) -> u64 {
        self.lock().hiding_answers
    }

    /// Every request that reached the interposer, forwarded or failed.
    /// How many requests with this Query API `Action` reached the interposer, refused or
    /// forwarded.
    pub fn calls(&self, action: &str) -> usize {
        let wanted = format!("Action={action}&");
        self.lock()
            .seen
            .iter()
            .filter(|seen| {
                seen.body.starts_with(&wanted) || seen.body.contains(&format!("&{wanted}"))
            })
            .count()
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.lock().seen.clone()
    }

    /// How many Redfish `ComputerSystem.Reset` requests of `reset_type` (`ForceOff`, `On`) for
    /// the system `system` (its id) reached the interposer.
    pub fn redfish_resets(&self, system: &str, reset_type: &str) -> usize {
        self.lock()
            .seen
            .iter()
            .filter(|seen| {
                seen.redfish_reset()
                    .is_some_and(|(id, asked)| id == system && asked == reset_type)
            })
            .count()
    }
}

struct Relay {
    shared: Arc<Mutex<Shared>>,
    client: Client<HttpConnector, Full<Bytes>>,
    upstream: String,
}

/// Why a request got no answer: hyper closes the connection.
#[derive(Debug)]
struct AnswerLost;

impl std::fmt::Display for AnswerLost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the answer was lost (interposed)")
    }
}

impl std::error::Error for AnswerLost {}

impl Relay {
    fn lock(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn failure(
        &self,
        status: http::StatusCode,
        code: &str,
        message: &str,
    ) -> http::Response<Full<Bytes>> {
        self.failed_with(status, error_document(code, message), "text/xml")
    }

    /// A failure as a BMC answers it: a Redfish error document.
    fn redfish_failure(
        &self,
        status: http::StatusCode,
        code: &str,
        message: &str,
    ) -> http::Response<Full<Bytes>> {
        let body = serde_json::json!({"error": {
            "code": code,
            "message": format!("{message} (interposed)"),
        }});
        self.failed_with(status, Bytes::from(body.to_string()), "application/json")
    }

    fn failed_with(
        &self,
        status: http::StatusCode,
        body: Bytes,
        content_type: &'static str,
    ) -> http::Response<Full<Bytes>> {
        self.lock().failed += 1;
        http::Response::builder()
            .status(status)
            .header(http::header::CONTENT_TYPE, content_type)
            .body(Full::new(body))
            .expect("a valid response")
    }

    fn unavailable(&self) -> http::Response<Full<Bytes>> {
        self.failure(
            http::StatusCode::SERVICE_UNAVAILABLE,
            "Unavailable",
            "The server is unavailable",
        )
    }

    /// The faults that answer every request without the server.
    fn answered_without_upstream(
        &self,
        mode: &Mode,
        path: &str,
    ) -> Option<http::Response<Full<Bytes>>> {
        Some(match mode {
            Mode::InternalError if path.starts_with("/redfish") => self.redfish_failure(
                http::StatusCode::INTERNAL_SERVER_ERROR,
                "Base.1.0.InternalError",
                "The request failed due to an internal service error.",
            ),
            Mode::Fail => self.unavailable(),
            Mode::Throttle => self.failure(
                http::StatusCode::SERVICE_UNAVAILABLE,
                "RequestLimitExceeded",
                "Request limit exceeded.",
            ),
            Mode::InternalError => self.failure(
                http::StatusCode::INTERNAL_SERVER_ERROR,
                "InternalError",
                "An internal error has occurred",
            ),
            Mode::ForeignDocument => http::Response::new(Full::new(Bytes::from_static(
                b"<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<ListBucketResult \
                  xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><Name>nodes</Name>\
                  <KeyCount>0</KeyCount></ListBucketResult>",
            ))),
            Mode::Unauthorized => {
                let mut answer = self.redfish_failure(
                    http::StatusCode::UNAUTHORIZED,
                    "Base.1.0.GeneralError",
                    "The request could not be authorized.",
                );
                answer.headers_mut().insert(
                    http::header::WWW_AUTHENTICATE,
                    http::HeaderValue::from_static("Basic realm=\"Redfish\""),
                );
                answer
            }
            Mode::Forward
            | Mode::FailAfter(_)
            | Mode::LoseAnswers
            | Mode::Refuse(_)
            | Mode::Hang(_)
            | Mode::Swallow(_) => return None,
        })
    }

    /// The faults of one action (or path): refused, or held unanswered.
    async fn refused_or_hung(
        &self,
        mode: &Mode,
        action: Option<&str>,
        path: &str,
        body: &[u8],
    ) -> Option<Result<http::Response<Full<Bytes>>, AnswerLost>> {
        // A REST request is matched by a part of its path or of its body (`"On"`: a
        // power-on's reset, not a power-off's).
        let rest =
            |wanted: &str| path.contains(wanted) || String::from_utf8_lossy(body).contains(wanted);
        let matches = |wanted: &String| action == Some(wanted.as_str()) || rest(wanted);
        match mode {
            Mode::Refuse(refused) if action == Some(refused.as_str()) => Some(Ok(self.failure(
                http::StatusCode::FORBIDDEN,
                "UnauthorizedOperation",
                "You are not authorized to perform this operation.",
            ))),
            Mode::Refuse(refused) if rest(refused) => Some(Ok(self.redfish_failure(
                http::StatusCode::FORBIDDEN,
                "Base.1.0.InsufficientPrivilege",
                "There are insufficient privileges for the account or credentials associated with the current session to perform the requested operation.",
            ))),
            Mode::Hang(hung) if matches(hung) => {
                self.lock().failed += 1;
                tokio::time::sleep(LOST_ANSWER_HOLD).await;
                Some(Err(AnswerLost))
            }
            Mode::Swallow(swallowed) if path.contains(swallowed.as_str()) => {
                Some(Ok(http::Response::builder()
                    .status(http::StatusCode::NO_CONTENT)
                    .body(Full::new(Bytes::new()))
                    .expect("a valid response")))
            }
            _ => None,
        }
    }

    async fn relay(
        &self,
        request: http::Request<Incoming>,
    ) -> Result<http::Response<Full<Bytes>>, AnswerLost> {
        let (parts, body) = request.into_parts();
        let Ok(body) = body
            .collect()
            .await
            .map(http_body_util::Collected::to_bytes)
        else {
            return Ok(self.unavailable());
        };
        let path = parts
            .uri
            .path_and_query()
            .map_or("/", http::uri::PathAndQuery::as_str)
            .to_owned();
        let (mode, hook) = {
            let mut shared = self.lock();
            let throttled = shared.mode == Mode::Throttle;
            shared.seen.push(Seen {
                method: parts.method.to_string(),
                path: path.clone(),
                body: String::from_utf8_lossy(&body).into_owned(),
                at: std::time::SystemTime::now(),
                throttled,
            });
            (shared.mode.clone(), shared.hook.clone())
        };
        if let Some(answer) = self.answered_without_upstream(&mode, &path) {
            return Ok(answer);
        }
        let form: Vec<(String, String)> = form_urlencoded::parse(&body).into_owned().collect();
        let action = form
            .iter()
            .find(|(key, _)| key == "Action")
            .map(|(_, value)| value.clone());
        if let Some(answer) = self
            .refused_or_hung(&mode, action.as_deref(), &path, &body)
            .await
        {
            return answer;
        }
        let answer_lost = mode == Mode::LoseAnswers;
        if let Some(hook) = hook {
            let instance_ids = form
                .iter()
                .filter(|(key, _)| key.starts_with("InstanceId."))
                .map(|(_, value)| value.clone())
                .collect();
            hook(Forwarding {
                action: action.clone().unwrap_or_default(),
                instance_ids,
                method: parts.method.to_string(),
                path: path.clone(),
                body: String::from_utf8_lossy(&body).into_owned(),
                answer_lost,
            })
            .await;
        }
        let mut forwarded = http::Request::builder()
            .method(parts.method.clone())
            .uri(format!("{}{path}", self.upstream));
        for (name, value) in &parts.headers {
            forwarded = forwarded.header(name, value);
        }
        let Ok(forwarded) = forwarded.body(Full::new(body)) else {
            return Ok(self.unavailable());
        };
        let Ok(answer) = self.client.request(forwarded).await else {
            return Ok(self.unavailable());
        };
        let (mut parts, body) = answer.into_parts();
        // The body may be cut below: hyper sets the length of the one sent.
        parts.headers.remove(http::header::CONTENT_LENGTH);
        let body = body
            .collect()
            .await
            .map(http_body_util::Collected::to_bytes)
            .unwrap_or_default();
        if answer_lost {
            self.lock().failed += 1;
            tokio::time::sleep(LOST_ANSWER_HOLD).await;
            return Err(AnswerLost);
        }
        if let Mode::FailAfter(after) = mode
            && action.as_deref() == Some(after.as_str())
        {
            self.lock().mode = Mode::Fail;
        }
        let body = if action.as_deref() == Some("DescribeInstances") && parts.status.is_success() {
            self.without_hidden(body)
        } else {
            body
        };
        Ok(http::Response::from_parts(parts, Full::new(body)))
    }

    /// A DescribeInstances answer less the instances hidden now: each one's `item` of its
    /// reservation's `instancesSet` cut out of the document.
    fn without_hidden(&self, body: Bytes) -> Bytes {
        let now = Instant::now();
        let hidden: Vec<String> = {
            let mut shared = self.lock();
            shared.hidden.retain(|_, until| *until > now);
            shared.hidden.keys().cloned().collect()
        };
        if hidden.is_empty() {
            return body;
        }
        let Ok(text) = std::str::from_utf8(&body) else {
            return body;
        };
        let Ok(document) = roxmltree::Document::parse(text) else {
            return body;
        };
        let mut cuts: Vec<std::ops::Range<usize>> = document
            .descendants()
            .filter(|node| node.tag_name().name() == "instanceId")
            .filter(|node| node.text().is_some_and(|id| hidden.iter().any(|h| h == id)))
            .filter_map(|node| node.parent())
            .filter(|item| {
                item.parent()
                    .is_some_and(|set| set.tag_name().name() == "instancesSet")
            })
            .map(|item| item.range())
            .collect();
        if cuts.is_empty() {
            return body;
        }
        self.lock().hiding_answers += 1;
        cuts.sort_by_key(|range| range.start);
        let mut kept = String::with_capacity(text.len());
        let mut from = 0;
        for cut in cuts {
            kept.push_str(&text[from..cut.start]);
            from = cut.end;
        }
        kept.push_str(&text[from..]);
        Bytes::from(kept)
    }
}
