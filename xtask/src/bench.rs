//! Benchmarks live as `harness = false` bench targets next to the code they measure; this
//! module only knows where each one is, so `cargo test` never builds or runs them.

use anyhow::Result;
use clap::Subcommand;

use crate::{cargo, run_command};

#[derive(Debug, Subcommand)]
pub enum Which {
    /// kube-sim: load time, RSS, paginated list latency, watch latency under write load.
    Sim,
    /// graceful-shutdown-agent: release latency, shutdown overhead, RSS, binary size.
    Shutdown,
    /// shutdown-inhibitor-agent: block/unblock latency, unrelated watch events, RSS.
    Inhibitor,
    /// out-of-service-gc: taint → pods force-deleted (1 and 100 nodes), StatefulSet failover vs
    /// the pod GC sweep, RSS at 5,000 nodes / 150,000 pods.
    Oos,
    /// termination-controller: one node of 110 pods under 10 PDBs drained by it and by
    /// `kubectl drain`, against the budget chains' lower bound; RSS at 5,000 nodes.
    Drain,
    /// termination-controller's proofs at full size: 200,000 fuzzed reviews, the controller
    /// SIGKILLed 24 times during three drains (and the leader of two replicas 6 times), and
    /// the webhook's latency under 100 concurrent clients.
    Termination,
    /// kubectl nodegrace: `status` through the real kubectl on 5,000 nodes, 1,200 of them in a
    /// program's work.
    Plugin,
    /// The explorer: as many random histories as fit in the time, printing
    /// `explore runs=… events=… violations=… seeds-failed=…`.
    Explore {
        /// How long to keep starting runs.
        #[arg(long, default_value_t = 600)]
        seconds: u64,
        /// The first seed (default: from the clock, so each bench explores anew).
        #[arg(long)]
        seed: Option<u64>,
    },
}

pub fn run(which: &Which) -> Result<()> {
    let (package, bench) = match which {
        Which::Explore { seconds, seed } => return crate::explore::bench(*seconds, *seed),
        Which::Sim => ("kube-sim", "sim"),
        Which::Shutdown => ("graceful-shutdown-agent", "shutdown"),
        Which::Inhibitor => ("shutdown-inhibitor-agent", "inhibitor"),
        Which::Oos => ("out-of-service-gc", "oos"),
        Which::Drain => ("termination-controller", "drain"),
        Which::Termination => ("termination-controller", "termination"),
        Which::Plugin => ("kubectl-nodegrace", "status"),
    };
    run_command(cargo().args(["bench", "--package", package, "--bench", bench]))
}
