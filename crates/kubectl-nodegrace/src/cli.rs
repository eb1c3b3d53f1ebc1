//! The plugin's command line, in kubectl's conventions: kubectl hands every argument after
//! `nodegrace` to the plugin, so the plugin reads `--kubeconfig`, `--context` and `-n` itself.

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};
use nodegrace_controller::InstanceProviderKind;

#[derive(Debug, Clone, Parser)]
#[command(
    name = "kubectl-nodegrace",
    bin_name = "kubectl nodegrace",
    version,
    about = "Every node's lifecycle under the nodegrace programs: where it stands, why it waits, \
             and what would move it. Reads only; works with whichever programs are installed."
)]
pub struct Cli {
    /// The kubeconfig to use (default: $KUBECONFIG, then ~/.kube/config, then in-cluster).
    #[arg(long, global = true)]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use (default: its current context).
    #[arg(long, global = true)]
    pub context: Option<String>,
    /// The namespace of a pod named without one (default: the context's namespace).
    #[arg(short = 'n', long, global = true)]
    pub namespace: Option<String>,
    /// Output format: a table for people, json or yaml for scripts (the schema is in
    /// docs/kubectl-nodegrace.md).
    #[arg(short = 'o', long, global = true, value_enum, default_value_t = Output::Table)]
    pub output: Output,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Table,
    Json,
    Yaml,
}

#[derive(Debug, Clone, Subcommand)]
pub enum Command {
    /// A row per node in a lifecycle state (shutting down, shutdown blocked, out of service,
    /// cleaning, fenced, recovering, deleting): since when, blocked by what, and what would
    /// move it. Healthy nodes appear only when named.
    Status {
        /// Only these nodes (a named healthy node appears as healthy).
        nodes: Vec<String>,
        /// Print again at every change of a node, until interrupted.
        #[arg(short = 'w', long)]
        watch: bool,
    },
    /// A node's story or a pod's: `explain node NODE`, `explain pod [NAMESPACE/]POD`.
    Explain {
        #[command(subcommand)]
        what: Explain,
    },
    /// The drain plan of a node, as `termination-controller plan --node NODE` prints it (the
    /// same code): its pods by tier, their PodDisruptionBudget queues, blockers and an
    /// estimated minimum drain time. Changes nothing.
    Plan {
        node: String,
        /// The instance provider the controller runs with (default: the one its Deployment
        /// names, else none).
        #[arg(long, value_enum)]
        instance_provider: Option<InstanceProviderKind>,
    },
}

#[derive(Debug, Clone, Subcommand)]
pub enum Explain {
    /// The node's timeline (its Events and conditions), what blocks it now, with the object,
    /// and the one command that would unblock it, when there is one.
    Node { node: String },
    /// Why a pod was evicted, force-deleted or terminated, and by which program: its
    /// DisruptionTarget condition while it exists, its Events after it is gone.
    Pod {
        /// `NAMESPACE/POD`, or `POD` with `-n`.
        pod: String,
    },
}
