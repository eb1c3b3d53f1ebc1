//! Command-line options. Every flag also reads `NODEGRACE_<FLAG>` (see nodegrace-core's `cli`).

use std::net::SocketAddr;
use std::time::Duration;

use clap::{Parser, Subcommand};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use nodegrace_controller::{ControllerArgs, InstanceProviderKind};
use nodegrace_core::cli::{KubeArgs, duration_flag, ports};
use nodegrace_core::k8s::selectors::parse_selector;

use crate::webhook::admit::Mode;

#[derive(Debug, Parser)]
#[command(
    name = "termination-controller",
    version,
    about = "Makes `kubectl delete node` safe: holds the Node with a finalizer while it is \
             cordoned, drained through the Eviction API within PodDisruptionBudgets and \
             NodeDisruptionBudgets, and its machine terminated",
    mut_arg("api_qps", |arg| arg.default_value("50")),
    mut_arg("api_burst", |arg| arg.default_value("100")),
    args_conflicts_with_subcommands = true,
)]
pub struct Args {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub controller: ControllerArgs<{ ports::TERMINATION_CONTROLLER }>,
    /// The nodes this controller manages (kubectl's -l syntax, e.g. "pool=batch,!gpu"); the
    /// empty default manages every node.
    #[arg(long, env = "NODEGRACE_NODE_SELECTOR", default_value = "", value_parser = parse_selector)]
    pub node_selector: LabelSelector,
    /// Eviction requests per second, over all nodes and queues.
    #[arg(long, env = "NODEGRACE_EVICTION_QPS", default_value_t = 50.0)]
    pub eviction_qps: f64,
    /// Eviction requests that may go at once before --eviction-qps paces them.
    #[arg(long, env = "NODEGRACE_EVICTION_BURST", default_value_t = 100)]
    pub eviction_burst: u32,
    /// How the drain asks pods to leave: `eviction` calls the Eviction API (pods/eviction);
    /// `eviction-request` hands each pod to its eviction responders through Kubernetes 1.37's
    /// EvictionRequest API (lifecycle.k8s.io/v1alpha1, alpha); `auto` uses EvictionRequest when
    /// the cluster serves it and the Eviction API otherwise, checked each time this replica
    /// starts leading.
    #[arg(long, env = "NODEGRACE_EVICTION_API", value_enum, default_value_t = EvictionApi::Eviction)]
    pub eviction_api: EvictionApi,
    /// Evictions in flight at once per node for pods no PodDisruptionBudget covers.
    #[arg(long, env = "NODEGRACE_EVICTION_CONCURRENCY", default_value_t = 16)]
    pub eviction_concurrency: usize,
    /// First retry delay of a refused eviction (a duration; doubles per refusal, with jitter).
    #[arg(long, env = "NODEGRACE_EVICTION_BACKOFF_MIN", default_value = "100ms", value_parser = duration_flag)]
    pub eviction_backoff_min: Duration,
    /// Longest retry delay of a refused eviction.
    #[arg(long, env = "NODEGRACE_EVICTION_BACKOFF_MAX", default_value = "10s", value_parser = duration_flag)]
    pub eviction_backoff_max: Duration,
    /// Past this long after the node's deletion, the pods still there are deleted with their
    /// grace period cut to the time left (at least 1 s), do-not-evict pods included
    /// (Karpenter's terminationGracePeriod). Off when unset.
    #[arg(long, env = "NODEGRACE_DRAIN_TIMEOUT", value_parser = duration_flag)]
    pub drain_timeout: Option<Duration>,
    /// How long a node waits for its hooks (the annotations `pre-drain.nodegrace.io/<name>`
    /// before the cordon, `pre-terminate.nodegrace.io/<name>` before the machine goes) before
    /// it goes on without them, with a Warning. Unset: it waits until their owners remove them.
    #[arg(long, env = "NODEGRACE_HOOK_TIMEOUT", value_parser = duration_flag)]
    pub hook_timeout: Option<Duration>,
    /// How long to wait for the node's VolumeAttachments to go after the drain before the
    /// machine is terminated anyway.
    #[arg(long, env = "NODEGRACE_VOLUME_DETACH_TIMEOUT", default_value = "5m", value_parser = duration_flag)]
    pub volume_detach_timeout: Duration,
    /// Delete a managed node that has been NotReady this long (Karpenter's design proposes 15m), which starts
    /// its termination. Off when unset.
    #[arg(long, env = "NODEGRACE_NOT_READY_TIMEOUT", value_parser = duration_flag)]
    pub not_ready_timeout: Option<Duration>,
    /// A pod whose deletionTimestamp (its deletion plus its grace period) is this far in the
    /// past no longer holds the drain (Karpenter's rule for pods stuck terminating: no kubelet
    /// to confirm their end, or a finalizer nobody removes).
    #[arg(long, env = "NODEGRACE_STUCK_TERMINATING_AFTER", default_value = "1m", value_parser = duration_flag)]
    pub stuck_terminating_after: Duration,
    /// --not-ready-timeout deletes nothing while more than this fraction of the managed nodes
    /// (or of one zone's, by topology.kubernetes.io/zone) is NotReady, rounded up as
    /// Karpenter's node repair does: that many dead at once is a partition, not dead machines.
    #[arg(long, env = "NODEGRACE_NOT_READY_MAX_FRACTION", default_value_t = 0.2)]
    pub not_ready_max_fraction: f64,
    /// A machine the instance provider does not know counts as gone (its node released) only
    /// once every answer for this long said so: an eventually consistent cloud answers "not
    /// found" for a machine just launched.
    #[arg(long, env = "NODEGRACE_INSTANCE_NOT_FOUND_CONFIRM", default_value = "30s", value_parser = duration_flag)]
    pub instance_not_found_confirm: Duration,
    /// A terminate request the instance provider accepted is sent again once the machine is
    /// still not terminated this long after it: a BMC can take a reset and never carry it out.
    #[arg(long, env = "NODEGRACE_TERMINATE_RESEND_AFTER", default_value = "5m", value_parser = duration_flag)]
    pub terminate_resend_after: Duration,
    #[command(flatten)]
    pub webhook: WebhookArgs,
}

/// The admission webhook (HTTPS), served by every replica.
#[derive(Debug, Clone, clap::Args)]
pub struct WebhookArgs {
    /// Serve the admission webhook on this address, e.g. [::]:9443 (paths /validate-node
    /// for DELETE, /mutate-node for CREATE). Off when unset.
    #[arg(long, env = "NODEGRACE_WEBHOOK_LISTEN")]
    pub webhook_listen: Option<SocketAddr>,
    /// What a node DELETE the NodeDisruptionBudgets do not allow now gets: queue admits it
    /// (with a warning) and the node waits for its grant; deny refuses it.
    #[arg(long, env = "NODEGRACE_WEBHOOK_MODE", value_enum, default_value_t = Mode::Queue)]
    pub webhook_mode: Mode,
    /// The Secret holding the serving certificate (tls.crt, tls.key); needed with
    /// --webhook-listen.
    #[arg(long, env = "NODEGRACE_WEBHOOK_SECRET")]
    pub webhook_secret: Option<String>,
    /// Namespace of --webhook-secret; in a pod, the pod's namespace.
    #[arg(
        long,
        env = "NODEGRACE_WEBHOOK_SECRET_NAMESPACE",
        default_value = "kube-system"
    )]
    pub webhook_secret_namespace: String,
    /// Issue the certificate into --webhook-secret, rotate it before it expires, and set the
    /// caBundle of --webhook-configurations. Off: something else (cert-manager) writes the
    /// Secret and the caBundle.
    #[arg(long, env = "NODEGRACE_WEBHOOK_ISSUE_CERTIFICATES", default_value_t = false, action = clap::ArgAction::Set)]
    pub webhook_issue_certificates: bool,
    /// Names an issued certificate is valid for, comma-separated: the Service's DNS names
    /// (svc.namespace.svc), or IP addresses.
    #[arg(long, env = "NODEGRACE_WEBHOOK_DNS_NAMES", value_delimiter = ',')]
    pub webhook_dns_names: Vec<String>,
    /// How long an issued certificate is valid (a duration, at least 10s); the next one is
    /// issued when a third is left.
    #[arg(long, env = "NODEGRACE_WEBHOOK_CERT_VALIDITY", default_value = "2160h", value_parser = duration_flag)]
    pub webhook_cert_validity: Duration,
    /// The Validating- and MutatingWebhookConfigurations (by name, comma-separated) whose
    /// caBundle is set to the issued CAs.
    #[arg(long, env = "NODEGRACE_WEBHOOK_CONFIGURATIONS", value_delimiter = ',')]
    pub webhook_configurations: Vec<String>,
}

#[derive(Debug, Clone, Subcommand)]
pub enum Command {
    /// Print what draining a node would do, changing nothing: its pods by tier, each pod's
    /// PodDisruptionBudget queue and the budget's numbers, do-not-evict blockers, pods no
    /// budget will ever let go, the NodeDisruptionBudget verdict, and an estimated minimum
    /// drain time.
    Plan(PlanArgs),
    /// Stop the controller and remove its finalizer from every node: what the chart's
    /// pre-delete hook runs on `helm uninstall`, so no later Node delete waits for a
    /// controller that is gone. Scales the controller's Deployment to 0 first (a replica would
    /// add the finalizers again).
    ReleaseNodes(ReleaseNodesArgs),
}

#[derive(Debug, Clone, clap::Args)]
pub struct ReleaseNodesArgs {
    /// Namespace of the controller's Deployment.
    #[arg(long, env = "NODEGRACE_NAMESPACE")]
    pub namespace: String,
    /// Name of the controller's Deployment, scaled to 0 before the finalizers go.
    #[arg(long, env = "NODEGRACE_DEPLOYMENT")]
    pub deployment: String,
    /// How long to wait for the controller's pods to stop before giving up (the finalizers
    /// then stay, and the command exits 1).
    #[arg(long, env = "NODEGRACE_STOP_TIMEOUT", default_value = "2m", value_parser = duration_flag)]
    pub stop_timeout: Duration,
    #[command(flatten)]
    pub kube: KubeArgs,
}

#[derive(Debug, Clone, clap::Args)]
pub struct PlanArgs {
    /// The node to plan for.
    #[arg(long, env = "NODEGRACE_NODE")]
    pub node: String,
    /// Output format: a table for people, json for scripts.
    #[arg(short = 'o', long, env = "NODEGRACE_OUTPUT", value_enum, default_value_t = PlanFormat::Table)]
    pub output: PlanFormat,
    /// The instance provider the controller runs with, to say what happens to the machine.
    #[arg(long, env = "NODEGRACE_INSTANCE_PROVIDER", value_enum, default_value_t = InstanceProviderKind::None)]
    pub instance_provider: InstanceProviderKind,
    #[command(flatten)]
    pub kube: KubeArgs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum EvictionApi {
    Auto,
    Eviction,
    EvictionRequest,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PlanFormat {
    Table,
    Json,
}
