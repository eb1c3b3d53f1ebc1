//! Running the simulator: the listener (plain or TLS), fault injection in front of every
//! request, the kubeconfig, and the [`KubeSim`] handle tests use.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use axum::Router;
use axum::body::Body;
use axum::http::Request;
use axum::response::Response;
use base64::Engine;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use crate::api::{self, App};
use crate::error::ApiError;
use crate::faults::{FailureKind, Faults, Verdict};
use crate::requests::{RequestKind, Requests, agent_of};
use crate::store::Store;
use crate::world::{World, WorldOptions};

#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("cannot listen on {address}: {source}")]
    Listen {
        address: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write the kubeconfig {path}: {source}")]
    Kubeconfig {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Tls(#[from] crate::tls::TlsError),
    #[error("cannot build a client for the simulator: {0}")]
    Client(String),
    #[error("cannot make a directory for container logs: {0}")]
    Logs(#[source] std::io::Error),
    #[error("cannot populate the simulated cluster: {0}")]
    Populate(#[from] ApiError),
}

/// How to start the simulator.
#[derive(Debug, Clone)]
pub struct SimOptions {
    pub listen: SocketAddr,
    pub tls: bool,
    /// Ready nodes `node-0..N-1` created at start.
    pub nodes: usize,
    /// Running ReplicaSet-owned pods per pre-created node.
    pub pods_per_node: usize,
    /// Where to write the kubeconfig; a temporary directory when `None`.
    pub kubeconfig: Option<PathBuf>,
    pub world: WorldOptions,
    /// How often watches that allow bookmarks get one. The real server sends them about once
    /// a minute; the default here is shorter so resumed watches stay short.
    pub bookmark_interval: std::time::Duration,
    /// The API server's `WatchList` feature gate: watches may send their initial events
    /// (`sendInitialEvents`). Off, as in 1.33 by default: such a watch is a 422, and client-go's
    /// reflectors fall back to a list and a watch.
    pub watch_list: bool,
    /// The EvictionRequest API (lifecycle.k8s.io/v1alpha1, Kubernetes 1.37 alpha): served, and
    /// its controllers run, only when on — what a real API server needs
    /// `--feature-gates EvictionRequestAPI=true --runtime-config lifecycle.k8s.io/v1alpha1=true`
    /// for.
    pub eviction_request_api: bool,
}

impl Default for SimOptions {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            tls: false,
            nodes: 0,
            pods_per_node: 0,
            kubeconfig: None,
            world: WorldOptions::default(),
            bookmark_interval: std::time::Duration::from_secs(5),
            watch_list: false,
            eviction_request_api: false,
        }
    }
}

/// A running simulator; dropping it stops the server and the simulated world.
pub struct KubeSim {
    url: String,
    kubeconfig: PathBuf,
    _kubeconfig_dir: Option<tempfile::TempDir>,
    store: Store,
    faults: Faults,
    requests: Requests,
    world: World,
    client: kube::Client,
    stop: CancellationToken,
}

impl std::fmt::Debug for KubeSim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeSim")
            .field("url", &self.url)
            .field("kubeconfig", &self.kubeconfig)
            .finish_non_exhaustive()
    }
}

impl KubeSim {
    pub async fn start(options: SimOptions) -> Result<Self, SimError> {
        let store = Store::default();
        if options.eviction_request_api {
            store
                .registry()
                .serve(crate::resources::eviction_request_api());
        }
        store.set_default_toleration_seconds(options.world.default_toleration_seconds);
        let faults = Faults::default();
        let requests = Requests::default();
        let stop = CancellationToken::new();
        crate::populate::populate(&store, options.nodes, options.pods_per_node)?;
        let audit = crate::audit::Audit::default();
        let logs = crate::world::Logs::new().map_err(SimError::Logs)?;
        let listener =
            TcpListener::bind(options.listen)
                .await
                .map_err(|source| SimError::Listen {
                    address: options.listen,
                    source,
                })?;
        let address = listener.local_addr().map_err(|source| SimError::Listen {
            address: options.listen,
            source,
        })?;
        let tls = options.tls.then(crate::tls::generate).transpose()?;
        let scheme = if tls.is_some() { "https" } else { "http" };
        let url = format!("{scheme}://{address}");
        let tokens = crate::tokens::TokenIssuer::default();
        let in_cluster = crate::world::InCluster {
            host: address.ip().to_string(),
            port: address.port(),
            ca_pem: tls
                .as_ref()
                .map(|tls| tls.ca_pem.clone())
                .unwrap_or_default(),
            tokens: tokens.clone(),
        };
        let world = World::start(
            store.clone(),
            audit.clone(),
            logs,
            in_cluster,
            &options.world,
            &stop.child_token(),
        );
        let app = App {
            store: store.clone(),
            faults: faults.clone(),
            audit: world.audit().clone(),
            logs: world.logs().clone(),
            tokens,
            bookmark_interval: options.bookmark_interval,
            watch_list: options.watch_list,
            without_credentials: if tls.is_some() {
                crate::auth::User::anonymous()
            } else {
                crate::auth::User::admin()
            },
        };
        let router = api::router(
            app,
            world
                .control_router()
                .merge(crate::control::router(faults.clone(), store.clone())),
        );
        let acceptor = tls.as_ref().map(|tls| tls.acceptor.clone());
        tokio::spawn(accept_loop(
            listener,
            acceptor,
            FaultyService {
                router,
                faults: faults.clone(),
                requests: requests.clone(),
            },
            stop.clone(),
        ));

        let (kubeconfig_dir, kubeconfig) = if let Some(path) = options.kubeconfig {
            (None, path)
        } else {
            let dir = tempfile::tempdir().map_err(|source| SimError::Kubeconfig {
                path: PathBuf::from("<tempdir>"),
                source,
            })?;
            let path = dir.path().join("kubeconfig");
            (Some(dir), path)
        };
        let contents = kubeconfig_yaml(&url, tls.as_ref().map(|tls| tls.ca_pem.as_str()));
        write_atomically(&kubeconfig, &contents).map_err(|source| SimError::Kubeconfig {
            path: kubeconfig.clone(),
            source,
        })?;
        let client = client_for(&kubeconfig, true).await?;
        Ok(Self {
            url,
            kubeconfig,
            _kubeconfig_dir: kubeconfig_dir,
            store,
            faults,
            requests,
            world,
            client,
            stop,
        })
    }

    /// A kube client for the simulator.
    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// A client that does not retry 429/503 answers itself (kube-rs clients do by default),
    /// for tests that look at those answers.
    pub async fn client_without_retries(&self) -> Result<kube::Client, SimError> {
        client_for(&self.kubeconfig, false).await
    }

    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// Writes (atomically) a copy of the kubeconfig to `path`.
    pub fn write_kubeconfig_to(&self, path: &Path) -> Result<(), SimError> {
        let kubeconfig_error = |source| SimError::Kubeconfig {
            path: path.to_path_buf(),
            source,
        };
        let contents = std::fs::read_to_string(&self.kubeconfig).map_err(kubeconfig_error)?;
        write_atomically(path, &contents).map_err(kubeconfig_error)
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    pub fn faults(&self) -> &Faults {
        &self.faults
    }

    /// Every request served, counted by client and kind.
    pub fn requests(&self) -> &Requests {
        &self.requests
    }

    pub fn world(&self) -> &World {
        &self.world
    }

    /// Stops serving (also done on drop).
    pub fn stop(&self) {
        self.stop.cancel();
    }
}

impl Drop for KubeSim {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn client_for(kubeconfig: &Path, retries: bool) -> Result<kube::Client, SimError> {
    let error = |e: &dyn std::fmt::Display| SimError::Client(e.to_string());
    let file = kube::config::Kubeconfig::read_from(kubeconfig).map_err(|e| error(&e))?;
    let mut config =
        kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
            .await
            .map_err(|e| error(&e))?;
    config.default_retry = retries;
    kube::Client::try_from(config).map_err(|e| error(&e))
}

fn kubeconfig_yaml(url: &str, ca_pem: Option<&str>) -> String {
    let ca = ca_pem
        .map(|pem| {
            format!(
                "\n    certificate-authority-data: {}",
                base64::engine::general_purpose::STANDARD.encode(pem)
            )
        })
        .unwrap_or_default();
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: kube-sim\n  cluster:\n    server: {url}{ca}\n\
         users:\n- name: kube-sim\n  user:\n    token: kube-sim\n\
         contexts:\n- name: kube-sim\n  context:\n    cluster: kube-sim\n    user: kube-sim\n    namespace: default\n\
         current-context: kube-sim\n"
    )
}

/// Readers never see half a kubeconfig: it appears whole once the server accepts requests.
pub fn write_atomically(path: &Path, contents: &str) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let temporary = path.with_extension("partial");
    std::fs::write(&temporary, contents)?;
    std::fs::rename(&temporary, path)
}

async fn accept_loop(
    listener: TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    service: FaultyService,
    stop: CancellationToken,
) {
    loop {
        let accepted = tokio::select! {
            () = stop.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let Ok((stream, _)) = accepted else { continue };
        if service.faults.in_outage() {
            // An outage: the connection goes as soon as it came.
            drop(stream);
            continue;
        }
        let _ = stream.set_nodelay(true);
        let service = service.clone();
        let stop = stop.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            let hyper_service = hyper_util::service::TowerToHyperService::new(service);
            if let Some(acceptor) = tls {
                let Ok(stream) = acceptor.accept(stream).await else {
                    return;
                };
                let connection =
                    builder.serve_connection_with_upgrades(TokioIo::new(stream), hyper_service);
                tokio::select! { () = stop.cancelled() => {}, _ = connection => {} }
            } else {
                let connection =
                    builder.serve_connection_with_upgrades(TokioIo::new(stream), hyper_service);
                tokio::select! { () = stop.cancelled() => {}, _ = connection => {} }
            }
        });
    }
}

/// Applies injected faults in front of the API.
#[derive(Clone)]
struct FaultyService {
    router: Router,
    faults: Faults,
    requests: Requests,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl tower::Service<Request<Incoming>> for FaultyService {
    type Response = Response;
    type Error = BoxError;
    type Future =
        std::pin::Pin<Box<dyn std::future::Future<Output = Result<Response, BoxError>> + Send>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), BoxError>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Incoming>) -> Self::Future {
        let router = self.router.clone();
        let faults = self.faults.clone();
        let (verb, resource, subresource) = classify(&request);
        let agent = request
            .headers()
            .get(axum::http::header::USER_AGENT)
            .and_then(|agent| agent.to_str().ok());
        self.requests.count(RequestKind {
            agent: agent_of(agent),
            verb,
            resource: resource.clone(),
            subresource,
        });
        Box::pin(async move {
            match faults.judge(verb, &resource) {
                Verdict::Serve => {}
                // Failing the service makes hyper drop the connection unanswered.
                Verdict::Fail(FailureKind::ConnectionReset) => {
                    return Err(
                        Box::new(std::io::Error::from(std::io::ErrorKind::ConnectionReset))
                            as BoxError,
                    );
                }
                Verdict::Fail(FailureKind::InternalError) => {
                    return Ok(api::error_response(&ApiError::internal("injected fault")));
                }
                Verdict::Fail(FailureKind::Conflict) => {
                    return Ok(api::error_response(&ApiError::conflict(
                        "",
                        &resource,
                        "",
                        "injected fault: the object has been modified; please apply your changes to the latest version and try again",
                    )));
                }
                Verdict::Fail(FailureKind::TooManyRequests) => {
                    return Ok(api::error_response(&ApiError::too_many_requests(
                        "injected fault: too many requests, please try again later",
                        &[],
                        1,
                    )));
                }
            }
            let latency = faults.latency();
            if !latency.is_zero() {
                tokio::time::sleep(latency).await;
            }
            let response = router
                .oneshot(request.map(Body::new))
                .await
                .unwrap_or_else(|never| match never {});
            Ok(response)
        })
    }
}

/// The verb, resource and subresource of a request, for fault rules and the counts.
fn classify(request: &Request<Incoming>) -> (&'static str, String, String) {
    let path: Vec<&str> = request.uri().path().trim_matches('/').split('/').collect();
    let rest: &[&str] = match path.as_slice() {
        ["api", _, rest @ ..] | ["apis", _, _, rest @ ..] => rest,
        _ => &[],
    };
    let rest = match rest {
        ["namespaces", _, plural, tail @ ..] if !plural.is_empty() => {
            let mut v = vec![*plural];
            v.extend_from_slice(tail);
            v
        }
        other => other.to_vec(),
    };
    let resource = rest.first().map(|s| (*s).to_owned()).unwrap_or_default();
    let subresource = rest.get(2).map(|s| (*s).to_owned()).unwrap_or_default();
    let is_object = rest.len() > 1;
    let watch = request
        .uri()
        .query()
        .is_some_and(|q| q.contains("watch=true") || q.contains("watch=1"));
    let verb = match (request.method().as_str(), is_object) {
        ("GET", true) => "get",
        ("GET", false) if watch => "watch",
        ("GET", false) => "list",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        _ => "other",
    };
    (verb, resource, subresource)
}
