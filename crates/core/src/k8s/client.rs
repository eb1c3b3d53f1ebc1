//! The Kubernetes client: kubeconfig or in-cluster, behind a client-side rate limit so a busy
//! program cannot flood the API server (the `--api-qps`/`--api-burst` flags).

use std::future::Future;
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use clap::Args;
use governor::clock::Clock;
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use tower::{Layer, Service};

/// Requests sent at once, whatever the rate allows. Over HTTP/1.1 each one in flight holds a
/// connection of its own, with its buffers (about 30 KiB), and the client keeps a connection
/// it opened for a minute and a half: a rollout whose 500 granted nodes each asked at once
/// opened a thousand, 45 MiB of a 158 MiB peak. Waiting requests queue in the client's buffer.
/// The permit is held until the answer's head arrives, so a watch holds none while it streams.
const REQUESTS_IN_FLIGHT: usize = 32;

/// How to reach the API server, and how hard to use it.
#[derive(Debug, Clone, Args)]
pub struct KubeArgs {
    /// Kubeconfig file. Without it: $KUBECONFIG or ~/.kube/config, else the in-cluster config.
    #[arg(long, env = "NODEGRACE_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Kubeconfig context (default: the file's current context).
    #[arg(long, env = "NODEGRACE_CONTEXT")]
    pub context: Option<String>,
    /// Sustained API requests per second (client-side limit).
    #[arg(long, env = "NODEGRACE_API_QPS", default_value_t = 20.0)]
    pub api_qps: f64,
    /// Requests allowed at once above the sustained rate (a count of requests).
    #[arg(long, env = "NODEGRACE_API_BURST", default_value_t = 40)]
    pub api_burst: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("--api-qps must be a positive number of requests per second, got {0}")]
    Qps(f64),
    #[error("--api-burst must be at least 1")]
    Burst,
    #[error("cannot read kubeconfig {path}: {source}")]
    Kubeconfig {
        path: String,
        #[source]
        source: kube::config::KubeconfigError,
    },
    #[error("no Kubernetes configuration: set --kubeconfig, $KUBECONFIG, or run in a pod ({0})")]
    Infer(#[source] kube::config::InferConfigError),
    #[error("cannot build the Kubernetes client: {0}")]
    Build(#[source] kube::Error),
}

/// Builds a client from the flags; `user_agent` names the program in the API server's logs.
/// It retries 429/503/504 answers itself (kube's default policy).
pub async fn client(args: &KubeArgs, user_agent: &str) -> Result<Client, ClientError> {
    build(args, user_agent, true).await
}

/// Like [`client`], without kube's retry of 429/503/504: for a caller whose 429 means
/// something (an eviction refused by a budget) and who schedules its own retry.
pub async fn client_without_retries(
    args: &KubeArgs,
    user_agent: &str,
) -> Result<Client, ClientError> {
    build(args, user_agent, false).await
}

async fn build(args: &KubeArgs, user_agent: &str, retries: bool) -> Result<Client, ClientError> {
    let limiter = rate_limiter(args.api_qps, args.api_burst)?;
    let mut config = match &args.kubeconfig {
        Some(path) => {
            let kubeconfig_error = |source| ClientError::Kubeconfig {
                path: path.display().to_string(),
                source,
            };
            let kubeconfig = Kubeconfig::read_from(path).map_err(kubeconfig_error)?;
            let options = KubeConfigOptions {
                context: args.context.clone(),
                ..KubeConfigOptions::default()
            };
            Config::from_custom_kubeconfig(kubeconfig, &options)
                .await
                .map_err(kubeconfig_error)?
        }
        None if args.context.is_some() => {
            let options = KubeConfigOptions {
                context: args.context.clone(),
                ..KubeConfigOptions::default()
            };
            Config::from_kubeconfig(&options)
                .await
                .map_err(|source| ClientError::Kubeconfig {
                    path: "$KUBECONFIG or ~/.kube/config".to_owned(),
                    source,
                })?
        }
        None => Config::infer().await.map_err(ClientError::Infer)?,
    };
    config.default_retry = retries;
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_str(&format!("nodegrace-{user_agent}"))
            .unwrap_or_else(|_| http::HeaderValue::from_static("nodegrace")),
    ));
    let builder = kube::client::ClientBuilder::try_from(config).map_err(ClientError::Build)?;
    Ok(builder
        .with_layer(&tower::limit::ConcurrencyLimitLayer::new(
            REQUESTS_IN_FLIGHT,
        ))
        .with_layer(&RateLimitLayer { limiter })
        .build())
}

fn rate_limiter(qps: f64, burst: u32) -> Result<Arc<DefaultDirectRateLimiter>, ClientError> {
    if !(qps.is_finite() && qps > 0.0) {
        return Err(ClientError::Qps(qps));
    }
    let burst = NonZeroU32::new(burst).ok_or(ClientError::Burst)?;
    let period = std::time::Duration::from_secs_f64(1.0 / qps);
    let quota = Quota::with_period(period)
        .ok_or(ClientError::Qps(qps))?
        .allow_burst(burst);
    Ok(Arc::new(RateLimiter::direct(quota)))
}

/// A tower layer that waits for the shared limiter before each request.
#[derive(Debug, Clone)]
pub struct RateLimitLayer {
    limiter: Arc<DefaultDirectRateLimiter>,
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimited<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimited {
            inner,
            limiter: Arc::clone(&self.limiter),
            wait: None,
            permitted: false,
        }
    }
}

/// The waiting happens in `poll_ready`, so the client's buffer holds requests back instead of
/// piling them onto the connection.
pub struct RateLimited<S> {
    inner: S,
    limiter: Arc<DefaultDirectRateLimiter>,
    wait: Option<Pin<Box<tokio::time::Sleep>>>,
    permitted: bool,
}

impl<S> std::fmt::Debug for RateLimited<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimited")
            .field("permitted", &self.permitted)
            .finish_non_exhaustive()
    }
}

impl<S, Request> Service<Request> for RateLimited<S>
where
    S: Service<Request>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        while !self.permitted {
            if let Some(wait) = self.wait.as_mut() {
                ready!(Future::poll(wait.as_mut(), cx));
                self.wait = None;
            }
            match self.limiter.check() {
                Ok(()) => self.permitted = true,
                Err(not_until) => {
                    // The limiter's own clock: a new one per refusal asked the CPU for its
                    // features each time (CPUID, a trap on a virtual machine).
                    let pause = not_until.wait_time_from(self.limiter.clock().now());
                    self.wait = Some(Box::pin(tokio::time::sleep(pause)));
                }
            }
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        self.permitted = false;
        self.inner.call(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::convert::Infallible;
    use std::time::Duration;
    use tower::ServiceExt;

    #[test]
    fn invalid_limits_name_the_flag() {
        assert!(
            rate_limiter(0.0, 10)
                .unwrap_err()
                .to_string()
                .contains("--api-qps")
        );
        assert!(
            rate_limiter(f64::NAN, 10)
                .unwrap_err()
                .to_string()
                .contains("--api-qps")
        );
        assert!(
            rate_limiter(5.0, 0)
                .unwrap_err()
                .to_string()
                .contains("--api-burst")
        );
    }

    #[tokio::test]
    async fn requests_beyond_the_burst_wait_for_the_rate() {
        // One request per 10 s with a burst of 3: three pass at once, the fourth must wait far
        // longer than this test looks.
        let limiter = rate_limiter(0.1, 3).unwrap();
        let mut service =
            RateLimitLayer { limiter }.layer(tower::service_fn(|n: u32| async move {
                Ok::<_, Infallible>(n)
            }));
        for n in 0..3 {
            let ready = tokio::time::timeout(Duration::from_secs(5), service.ready()).await;
            assert!(ready.is_ok(), "request {n} should pass within the burst");
            assert_eq!(service.call(n).await.unwrap(), n);
        }
        let fourth = tokio::time::timeout(Duration::from_millis(100), service.ready()).await;
        assert!(fourth.is_err(), "the fourth request must wait for the rate");
    }
}
