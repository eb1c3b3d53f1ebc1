//! The admin server every program runs: `/metrics` for Prometheus, `/livez` and `/readyz` for
//! the kubelet's probes.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::encoding::text::encode;
use prometheus_client::registry::Registry;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Named conditions that must all hold before the program reports ready.
#[derive(Debug, Clone, Default)]
pub struct Readiness {
    gates: Arc<Mutex<BTreeMap<String, bool>>>,
}

/// One readiness condition (e.g. "caches-synced", "logind"); starts not ready.
#[derive(Debug, Clone)]
pub struct ReadinessGate {
    name: String,
    gates: Arc<Mutex<BTreeMap<String, bool>>>,
}

impl Readiness {
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers a gate, not ready until set.
    pub fn gate(&self, name: &str) -> ReadinessGate {
        self.lock().insert(name.to_owned(), false);
        ReadinessGate {
            name: name.to_owned(),
            gates: Arc::clone(&self.gates),
        }
    }

    /// The gates that are not ready, in name order; empty means ready.
    pub fn not_ready(&self) -> Vec<String> {
        self.lock()
            .iter()
            .filter(|(_, ready)| !**ready)
            .map(|(name, _)| name.clone())
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, bool>> {
        // A panic elsewhere while holding this lock cannot leave the map half-updated.
        self.gates.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl ReadinessGate {
    pub fn set(&self, ready: bool) {
        self.gates
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(self.name.clone(), ready);
    }
}

#[derive(Debug)]
pub struct AdminServer {
    local_addr: SocketAddr,
    task: JoinHandle<Result<(), std::io::Error>>,
}

impl AdminServer {
    /// The bound address (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Waits until the server has stopped (after the cancellation token fired).
    pub async fn stopped(self) -> Result<(), std::io::Error> {
        self.task.await.unwrap_or(Ok(()))
    }
}

#[derive(Clone)]
struct AppState {
    registry: Arc<Registry>,
    readiness: Readiness,
}

/// Binds `addr` and serves until `stop` is cancelled.
pub async fn serve(
    addr: SocketAddr,
    registry: Registry,
    readiness: Readiness,
    stop: CancellationToken,
) -> Result<AdminServer, std::io::Error> {
    let state = AppState {
        registry: Arc::new(registry),
        readiness,
    };
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/livez", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(state);
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let local_addr = listener.local_addr()?;
    let task = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await
    });
    Ok(AdminServer { local_addr, task })
}

async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    let mut body = String::new();
    match encode(&mut body, &state.registry) {
        Ok(()) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            body,
        ),
        Err(error) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            format!("cannot encode metrics: {error}"),
        ),
    }
}

async fn readyz(State(state): State<AppState>) -> impl IntoResponse {
    let waiting = state.readiness.not_ready();
    if waiting.is_empty() {
        (StatusCode::OK, "ok".to_owned())
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {}", waiting.join(", ")),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::counter::Counter;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn get(addr: SocketAddr, path: &str) -> String {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        response
    }

    #[tokio::test]
    async fn serves_metrics_probes_and_stops_on_cancel() {
        let mut registry = Registry::with_prefix("nodegrace_test");
        let counter = Counter::<u64>::default();
        registry.register("things", "things seen", counter.clone());
        counter.inc();
        let readiness = Readiness::new();
        let synced = readiness.gate("caches-synced");
        let logind = readiness.gate("logind");
        let stop = CancellationToken::new();
        let server = serve(
            "127.0.0.1:0".parse().unwrap(),
            registry,
            readiness,
            stop.clone(),
        )
        .await
        .unwrap();
        let addr = server.local_addr();

        assert!(get(addr, "/livez").await.starts_with("HTTP/1.1 200"));
        let metrics = get(addr, "/metrics").await;
        assert!(
            metrics.contains("nodegrace_test_things_total 1"),
            "{metrics}"
        );

        let not_ready = get(addr, "/readyz").await;
        assert!(not_ready.starts_with("HTTP/1.1 503"), "{not_ready}");
        assert!(not_ready.contains("caches-synced, logind"), "{not_ready}");
        synced.set(true);
        let still = get(addr, "/readyz").await;
        assert!(
            still.contains("not ready: logind") && !still.contains("caches-synced"),
            "{still}"
        );
        logind.set(true);
        assert!(get(addr, "/readyz").await.starts_with("HTTP/1.1 200"));

        stop.cancel();
        server.stopped().await.unwrap();
        assert!(tokio::net::TcpStream::connect(addr).await.is_err());
    }

    /// The programs' default: `[::]` takes IPv6 and IPv4 (dual-stack), so an IPv6-only cluster
    /// probes it as an IPv4 one does.
    #[tokio::test]
    async fn the_unspecified_ipv6_address_serves_ipv6_and_ipv4() {
        let stop = CancellationToken::new();
        let server = serve(
            "[::]:0".parse().unwrap(),
            Registry::default(),
            Readiness::new(),
            stop.clone(),
        )
        .await
        .unwrap();
        let port = server.local_addr().port();
        for host in ["[::1]", "127.0.0.1"] {
            let addr: SocketAddr = format!("{host}:{port}").parse().unwrap();
            let answer = get(addr, "/livez").await;
            assert!(answer.starts_with("HTTP/1.1 200"), "{host}: {answer}");
        }
        stop.cancel();
        server.stopped().await.unwrap();
    }
}
