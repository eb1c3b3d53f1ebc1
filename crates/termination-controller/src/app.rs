//! Assembling the controller and running it until SIGTERM.

use std::num::NonZeroU32;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::Api;
use kube::runtime::watcher;
use nodegrace_controller::assembly::{Connected, Frame};
use nodegrace_controller::instances::Metered;
use nodegrace_core::admin::ReadinessGate;
use nodegrace_core::backoff::Backoff;
use nodegrace_core::clock::{Clock, SystemClock};
use nodegrace_core::k8s::cached_node::CachedNode;
use nodegrace_core::k8s::watched::{WatchCounters, Watched};
use nodegrace_core::k8s::{client, volumes};
use nodegrace_core::program::Started;
use tokio_util::sync::CancellationToken;

use crate::api::{NodeDisruptionBudget, NodeDrainRule};
use crate::cli::{Args, Command, EvictionApi, PlanArgs, PlanFormat, ReleaseNodesArgs, WebhookArgs};
use crate::conditions::MAINTENANCE_PLANNED;
use crate::controller::Controller;
use crate::fresh_nodes::FreshNodes;
use crate::grants::Budgets;
use crate::handover::Handover;
use crate::metrics::Metrics;
use crate::plan;
use crate::shared::{Settings, Shared};
use crate::uninstall::{self, Release};
use crate::webhook::admit::{Admission, Mode};
use crate::webhook::certs::{self, Issuing};
use crate::webhook::server::{self, ServingCertificate};
use crate::webhook::{self, CertificateSource};

pub const PROGRAM: &str = "termination-controller";

/// Runs the controller until `stop` is cancelled, or the subcommand given.
pub async fn run(mut args: Args, stop: CancellationToken) -> Result<()> {
    match args.command.take() {
        Some(Command::Plan(plan)) => print_plan(plan).await,
        Some(Command::ReleaseNodes(release)) => release_nodes(release).await,
        None => Box::pin(start(args, stop)).await?.wait().await,
    }
}

async fn release_nodes(args: ReleaseNodesArgs) -> Result<()> {
    let client = client::client(&args.kube, PROGRAM)
        .await
        .context("build the Kubernetes client")?;
    let release = Release {
        namespace: args.namespace,
        deployment: args.deployment,
        stop_timeout: args.stop_timeout,
    };
    let released = uninstall::release_nodes(&client, &release).await?;
    println!(
        "released {} node(s) from the finalizer nodegrace.io/termination{}{}",
        released.len(),
        if released.is_empty() { "" } else { ": " },
        released.join(", ")
    );
    Ok(())
}

async fn print_plan(args: PlanArgs) -> Result<()> {
    let client = client::client(&args.kube, PROGRAM)
        .await
        .context("build the Kubernetes client")?;
    let cluster = plan::gather(&client, &args.node).await?;
    let plan = plan::plan(&cluster, args.instance_provider, jiff::Timestamp::now());
    let text = match args.output {
        PlanFormat::Table => plan.table(),
        PlanFormat::Json => serde_json::to_string_pretty(&plan)? + "\n",
    };
    std::io::Write::write_all(&mut std::io::stdout().lock(), text.as_bytes())
        .context("write the plan to stdout")
}

/// The webhook's settings, checked.
fn webhook_settings(
    args: WebhookArgs,
) -> Result<Option<(std::net::SocketAddr, Mode, CertificateSource)>> {
    let WebhookArgs {
        webhook_listen,
        webhook_mode,
        webhook_secret,
        webhook_secret_namespace,
        webhook_issue_certificates,
        webhook_dns_names,
        webhook_cert_validity,
        webhook_configurations,
    } = args;
    let Some(listen) = webhook_listen else {
        return Ok(None);
    };
    let Some(secret) = webhook_secret else {
        bail!(
            "--webhook-listen needs --webhook-secret: the Secret (in --webhook-secret-namespace) \
             that holds the serving certificate"
        );
    };
    let issuing = if webhook_issue_certificates {
        if webhook_dns_names.iter().all(|name| name.trim().is_empty()) {
            bail!(
                "--webhook-issue-certificates needs --webhook-dns-names: the names the API server \
                 calls the webhook by (the Service's <name>.<namespace>.svc)"
            );
        }
        if webhook_cert_validity < certs::MIN_VALIDITY {
            bail!(
                "--webhook-cert-validity must be at least {:?}, got {webhook_cert_validity:?}",
                certs::MIN_VALIDITY
            );
        }
        Some(Issuing {
            dns_names: webhook_dns_names,
            validity: webhook_cert_validity,
            configurations: webhook_configurations,
        })
    } else {
        None
    };
    Ok(Some((
        listen,
        webhook_mode,
        CertificateSource {
            secret,
            namespace: webhook_secret_namespace,
            issuing,
        },
    )))
}

fn trim_budget(pdb: &mut PodDisruptionBudget) {
    pdb.metadata.managed_fields = None;
    if let Some(status) = pdb.status.as_mut() {
        status.disrupted_pods = None;
        status.conditions = None;
    }
}

/// Of a node's conditions, the controller reads Ready (NotReady nodes, budgets) and its own
/// `MaintenancePlanned` (set False once a waiting node is granted); a kubelet posts five more,
/// some 1 KiB a node with their messages.
fn trim_node(node: &mut CachedNode) {
    node.metadata.managed_fields = None;
    if let Some(conditions) = node
        .status
        .as_mut()
        .and_then(|status| status.conditions.as_mut())
    {
        conditions.retain(|condition| {
            condition.type_ == "Ready" || condition.type_ == MAINTENANCE_PLANNED
        });
    }
}

fn trim_ndb(budget: &mut NodeDisruptionBudget) {
    budget.metadata.managed_fields = None;
}

/// Only the labels matter (the rules' namespace selectors).
fn trim_namespace(namespace: &mut Namespace) {
    namespace.metadata.managed_fields = None;
    namespace.metadata.annotations = None;
    namespace.spec = None;
    namespace.status = None;
}

/// The NodeDrainRules, watched; none when the cluster does not serve the kind (`helm upgrade`
/// does not add a chart's new CRD), with a warning saying how to add it.
async fn drain_rules(client: &kube::Client) -> Watched<NodeDrainRule> {
    let api = Api::<NodeDrainRule>::all(client.clone());
    match api.list(&kube::api::ListParams::default().limit(1)).await {
        Err(error) if nodegrace_core::k8s::api_errors::status_code(&error) == Some(404) => {
            tracing::warn!(
                "the NodeDrainRule CRD is not installed (helm installs a chart's CRDs only on its \
                 first install): draining without drain rules; add it with `kubectl apply -f \
                 charts/termination-controller/crds/` and restart the controller"
            );
            Watched::empty()
        }
        _ => Watched::start_trimmed(
            api,
            watcher::Config::default(),
            WatchCounters::default(),
            |rule: &mut NodeDrainRule| rule.metadata.managed_fields = None,
        ),
    }
}

/// Starts the admin server, then the controller in a task of its own.
pub async fn start(args: Args, stop: CancellationToken) -> Result<Started<anyhow::Error>> {
    start_with_clock(args, Arc::new(SystemClock), stop).await
}

/// [`start`] with the wall clock that grants and maintenance windows are read off (a test's
/// clock stands at the instant it tests).
pub async fn start_with_clock(
    args: Args,
    clock: Arc<dyn Clock>,
    stop: CancellationToken,
) -> Result<Started<anyhow::Error>> {
    // Every option is used here: a new flag that nothing reads does not compile.
    let Args {
        command: _,
        controller,
        node_selector,
        eviction_qps,
        eviction_burst,
        eviction_api,
        eviction_concurrency,
        eviction_backoff_min,
        eviction_backoff_max,
        drain_timeout,
        hook_timeout,
        volume_detach_timeout,
        not_ready_timeout,
        stuck_terminating_after,
        not_ready_max_fraction,
        instance_not_found_confirm,
        terminate_resend_after,
        webhook,
    } = args;
    let webhook = webhook_settings(webhook)?;
    let eviction_limiter = eviction_limiter(eviction_qps, eviction_burst)?;
    if eviction_concurrency == 0 {
        bail!("--eviction-concurrency must be at least 1");
    }
    if eviction_backoff_min.is_zero() || eviction_backoff_min > eviction_backoff_max {
        bail!(
            "--eviction-backoff-min must be more than 0 and at most --eviction-backoff-max \
             (got {eviction_backoff_min:?} and {eviction_backoff_max:?})"
        );
    }
    if !(0.0..=1.0).contains(&not_ready_max_fraction) {
        bail!(
            "--not-ready-max-fraction must be a fraction from 0 to 1 (0.2 = 20 % of the managed \
             nodes), got {not_ready_max_fraction}"
        );
    }
    let settings = Settings {
        node_selector,
        eviction_concurrency,
        eviction_backoff: Backoff {
            first: eviction_backoff_min,
            longest: eviction_backoff_max,
        },
        drain_timeout,
        hook_timeout,
        volume_detach_timeout,
        not_ready_timeout,
        stuck_terminating_after,
        not_ready_max_fraction,
        instance_not_found_confirm,
        terminate_resend_after,
        eviction_api,
    };
    let mut frame = Frame::new(PROGRAM, controller);
    let metrics = Metrics::register(frame.registry());
    // Bound now, so a port in use fails the start rather than the first review.
    let webhook = match webhook {
        Some((listen, mode, source)) => {
            let listener = tokio::net::TcpListener::bind(listen)
                .await
                .with_context(|| format!("listen on --webhook-listen {listen}"))?;
            tracing::info!(address = %listener.local_addr()?, mode = mode.as_str(), "webhook listening");
            Some((listener, mode, source, frame.gate("webhook-certificate")))
        }
        None => None,
    };
    let parts = Parts {
        settings,
        eviction_limiter,
        metrics,
        webhook,
        clock,
    };
    let started = frame.start(stop, move |cluster| lead(cluster, parts));
    Ok(started.await?)
}

/// `--eviction-qps` and `--eviction-burst` as the evictions' rate limiter.
fn eviction_limiter(qps: f64, burst: u32) -> Result<Arc<DefaultDirectRateLimiter>> {
    if !(qps.is_finite() && qps > 0.0) {
        bail!("--eviction-qps must be a positive number of requests per second, got {qps}");
    }
    let Some(burst) = NonZeroU32::new(burst) else {
        bail!("--eviction-burst must be at least 1");
    };
    let quota = Quota::with_period(std::time::Duration::from_secs_f64(1.0 / qps))
        .context("--eviction-qps is too high")?
        .allow_burst(burst);
    Ok(Arc::new(RateLimiter::direct(quota)))
}

/// What the start made of the flags, for the leader's side.
struct Parts {
    settings: Settings,
    eviction_limiter: Arc<DefaultDirectRateLimiter>,
    metrics: Metrics,
    webhook: Option<(
        tokio::net::TcpListener,
        Mode,
        CertificateSource,
        ReadinessGate,
    )>,
    clock: Arc<dyn Clock>,
}

/// Once connected: the caches synced, then the controller (and the webhook beside it) as long
/// as this process leads.
async fn lead(cluster: Connected, parts: Parts) -> Result<()> {
    let Parts {
        settings,
        eviction_limiter,
        metrics,
        webhook,
        clock,
    } = parts;
    let evictions = cluster.client_without_retries().await?;
    let handover = handover(&cluster.client, settings.eviction_api).await?;
    let nodes = cluster.watch_nodes(trim_node);
    let ndbs = cluster.watch_all(trim_ndb);
    let pdbs = cluster.watch_all(trim_budget);
    let drain_rules = drain_rules(&cluster.client).await;
    let namespaces = cluster.watch_all(trim_namespace);
    let attachments = cluster.watch_all(volumes::trim_for_cache);
    let caches = async {
        nodes.synced().await?;
        ndbs.synced().await?;
        pdbs.synced().await?;
        drain_rules.synced().await?;
        namespaces.synced().await?;
        if let Some(handover) = &handover {
            handover.synced().await?;
        }
        attachments.synced().await
    };
    let what = "nodes, NodeDisruptionBudgets, PodDisruptionBudgets, NodeDrainRules, namespaces \
                and VolumeAttachments";
    if !cluster.synced(what, caches).await? {
        return Ok(());
    }
    let client = cluster.client.clone();
    let budgets = Budgets {
        api: Api::all(client.clone()),
        cache: ndbs,
        nodes: nodes.clone(),
        fresh: Arc::new(FreshNodes::new(Api::all(client.clone()))),
        clock,
        waits: crate::waits::Waits::default(),
        index: Arc::default(),
    };
    let webhook = webhook.map(|(listener, mode, source, loaded)| {
        let admission = Arc::new(Admission {
            mode,
            settings: settings.clone(),
            budgets: budgets.clone(),
            metrics: metrics.clone(),
        });
        let stop = cluster.stop.clone();
        serve_webhook(client.clone(), listener, admission, source, loaded, stop)
    });
    let provider = cluster
        .provider
        .clone()
        .map(|provider| Metered::wrap(provider, metrics.provider.clone()));
    let controller = Controller {
        shared: Arc::new(Shared {
            client,
            evictions,
            eviction_limiter,
            reporter: cluster.reporter.clone(),
            metrics,
            settings,
            nodes,
            budgets,
            pdbs,
            drain_rules,
            namespaces,
            attachments,
            provider,
            turns: crate::turns::Turns::default(),
            rejudged: nodegrace_core::dirty::Dirty::default(),
            handover,
        }),
        dirty: Arc::clone(&cluster.dirty),
    };
    match webhook {
        Some(webhook) => cluster.lead_beside(controller, webhook).await,
        None => Ok(cluster.lead(controller).await?),
    }
}

/// `--eviction-api` for this term as leader: with `auto`, EvictionRequest when discovery lists
/// it.
async fn handover(client: &kube::Client, api: EvictionApi) -> Result<Option<Handover>> {
    let use_requests = match api {
        EvictionApi::Eviction => false,
        EvictionApi::EvictionRequest => {
            if !crate::handover::served(client).await {
                bail!(
                    "--eviction-api=eviction-request, but the cluster does not serve {} \
                     (Kubernetes 1.37 or later, its API server started with --feature-gates \
                     EvictionRequestAPI=true --runtime-config {}=true): use \
                     --eviction-api=auto to fall back to the Eviction API, or eviction",
                    crate::handover::GROUP_VERSION,
                    crate::handover::GROUP_VERSION
                );
            }
            true
        }
        EvictionApi::Auto => {
            let served = crate::handover::served(client).await;
            tracing::info!(
                served,
                "--eviction-api=auto: draining through {}",
                if served {
                    "EvictionRequests (lifecycle.k8s.io/v1alpha1 is served)"
                } else {
                    "the Eviction API (lifecycle.k8s.io/v1alpha1 is not served)"
                }
            );
            served
        }
    };
    Ok(use_requests.then(|| Handover::start(client)))
}

/// Serves the webhook once its certificate is loaded, keeping the certificate current.
async fn serve_webhook(
    client: kube::Client,
    listener: tokio::net::TcpListener,
    admission: Arc<Admission>,
    source: CertificateSource,
    loaded: ReadinessGate,
    stop: CancellationToken,
) -> Result<()> {
    let serving = Arc::new(ServingCertificate::default());
    let keeping = webhook::keep_certificate(client, source, Arc::clone(&serving), stop.clone());
    let serve = async {
        // Until the first certificate arrives there is nothing to present, and the admin
        // server says not ready.
        serving.wait_loaded().await;
        loaded.set(true);
        server::serve(listener, Arc::clone(&serving), admission, stop).await
    };
    tokio::select! {
        result = keeping => result,
        result = serve => result.context("serve the webhook"),
    }
}
