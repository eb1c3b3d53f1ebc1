//! An HTTP interposer in front of a provider's test server (moto): it forwards requests and
//! can stop answering for the server at a chosen moment, as a cloud endpoint that accepted a
//! request and then went away does. Reads each Query API form, so the moment can be "right
//! after a TerminateInstances was accepted".

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// What the interposer does with the next requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    Forward,
    /// Forwards until a request with this `Action` has been answered, then fails everything.
    FailAfter(String),
    /// Answers every request 503 `Unavailable`, as EC2 does when it cannot serve.
    Fail,
}

/// A request that reached the interposer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub body: String,
}

#[derive(Debug)]
pub struct Interposer {
    pub address: SocketAddr,
    mode: Arc<Mutex<Mode>>,
    failed: Arc<Mutex<u64>>,
    seen: Arc<Mutex<Vec<Seen>>>,
    serving: JoinHandle<()>,
}

impl Drop for Interposer {
    fn drop(&mut self) {
        self.serving.abort();
    }
}

const UNAVAILABLE: &str = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error>\
    <Code>Unavailable</Code><Message>The server is unavailable (interposed)</Message></Error>\
    </Errors><RequestID>interposed</RequestID></Response>";

impl Interposer {
    pub async fn start(upstream: &str) -> std::io::Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let address = listener.local_addr()?;
        let mode = Arc::new(Mutex::new(Mode::Forward));
        let failed = Arc::new(Mutex::new(0));
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let client: Client<HttpConnector, Full<Bytes>> =
            Client::builder(TokioExecutor::new()).build_http();
        let upstream = upstream.trim_end_matches('/').to_owned();
        let state = Arc::new(Relay {
            mode: Arc::clone(&mode),
            failed: Arc::clone(&failed),
            seen: Arc::clone(&seen),
            client,
            upstream,
        });
        let serving = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let state = Arc::clone(&state);
                tokio::spawn(async move {
                    let service = service_fn(move |request| {
                        let state = Arc::clone(&state);
                        async move { Ok::<_, Infallible>(state.relay(request).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(Self {
            address,
            mode,
            failed,
            seen,
            serving,
        })
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.address)
    }

    pub fn set(&self, mode: Mode) {
        *self.mode.lock().unwrap_or_else(PoisonError::into_inner) = mode;
    }

    pub fn mode(&self) -> Mode {
        self.mode
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Requests answered with a failure so far.
    pub fn failed(&self) -> u64 {
        *self.failed.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Every request that reached the interposer, forwarded or failed.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

struct Relay {
    mode: Arc<Mutex<Mode>>,
    failed: Arc<Mutex<u64>>,
    seen: Arc<Mutex<Vec<Seen>>>,
    client: Client<HttpConnector, Full<Bytes>>,
    upstream: String,
}

impl Relay {
    async fn relay(&self, request: http::Request<Incoming>) -> http::Response<Full<Bytes>> {
        let unavailable = || {
            *self.failed.lock().unwrap_or_else(PoisonError::into_inner) += 1;
            http::Response::builder()
                .status(http::StatusCode::SERVICE_UNAVAILABLE)
                .body(Full::new(Bytes::from_static(UNAVAILABLE.as_bytes())))
                .expect("a valid response")
        };
        let (parts, body) = request.into_parts();
        let Ok(body) = body
            .collect()
            .await
            .map(http_body_util::Collected::to_bytes)
        else {
            return unavailable();
        };
        let path = parts
            .uri
            .path_and_query()
            .map_or("/", http::uri::PathAndQuery::as_str)
            .to_owned();
        self.seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Seen {
                method: parts.method.to_string(),
                path: path.clone(),
                body: String::from_utf8_lossy(&body).into_owned(),
            });
        let current = self
            .mode
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if current == Mode::Fail {
            return unavailable();
        }
        let action = form_urlencoded::parse(&body)
            .find(|(key, _)| key == "Action")
            .map(|(_, value)| value.into_owned());
        let mut forwarded = http::Request::builder()
            .method(parts.method.clone())
            .uri(format!("{}{path}", self.upstream));
        for (name, value) in &parts.headers {
            forwarded = forwarded.header(name, value);
        }
        let Ok(forwarded) = forwarded.body(Full::new(body)) else {
            return unavailable();
        };
        let Ok(answer) = self.client.request(forwarded).await else {
            return unavailable();
        };
        let (parts, body) = answer.into_parts();
        let body = body
            .collect()
            .await
            .map(http_body_util::Collected::to_bytes)
            .unwrap_or_default();
        if let Mode::FailAfter(after) = current
            && action.as_deref() == Some(after.as_str())
        {
            *self.mode.lock().unwrap_or_else(PoisonError::into_inner) = Mode::Fail;
        }
        http::Response::from_parts(parts, Full::new(body))
    }
}
