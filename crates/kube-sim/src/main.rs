//! `kube-sim serve`: the simulator as a process, for kubectl and the e2e scenarios.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use kube_sim::{KubeSim, SimOptions};

#[derive(Debug, Parser)]
#[command(
    name = "kube-sim",
    version,
    about = "An in-memory Kubernetes API server with a simulated kubelet and control plane"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serves until SIGTERM or SIGINT.
    Serve(Box<Serve>),
    /// The container init the kubelet starts a container process through: mounts the volumes
    /// the spec names in a mount namespace of its own, then runs the program. Not for people.
    #[command(hide = true)]
    RunContainer {
        /// The container's launch spec (JSON), as the kubelet wrote it.
        spec: PathBuf,
        /// The simulator that started it: a container whose parent is no longer this process
        /// does not start (the simulator ended while it was being started).
        #[arg(long)]
        simulator_pid: Option<u32>,
    },
}

#[derive(Debug, clap::Args)]
struct Serve {
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Written (atomically) once the server accepts requests and its URL is on stdout, so a
    /// script that waits for this file can read the URL at once.
    #[arg(long)]
    kubeconfig_out: PathBuf,
    /// Ready nodes node-0..N-1 to create.
    #[arg(long, default_value_t = 0)]
    nodes: usize,
    /// Running ReplicaSet pods on each created node.
    #[arg(long, default_value_t = 0)]
    pods_per_node: usize,
    /// Serve HTTPS with a generated CA (put in the kubeconfig).
    #[arg(long)]
    tls: bool,
    /// PATTERN=DIR: run containers whose image matches PATTERN (exact, or a prefix ending
    /// in '*') as local processes, their command[0] (or the image name) taken from DIR;
    /// `kubectl logs` shows their output. Repeatable. Example: 'busybox:*=/bin'.
    #[arg(long = "run-image", value_name = "PATTERN=DIR")]
    run_images: Vec<kube_sim::ImageRule>,
    /// How long a node's Lease may go unrenewed before the node turns Ready=Unknown
    /// (kube-controller-manager's flag of the same name).
    #[arg(long, default_value = "40s", value_parser = duration)]
    node_monitor_grace_period: Duration,
    /// How often each running kubelet renews its node's Lease.
    #[arg(long, default_value = "10s", value_parser = duration)]
    node_lease_renew_interval: Duration,
    /// DIR/<node> is each node's own filesystem: hostPath volumes of pods on that node are
    /// found (and made) there. Without it, hostPaths are this host's own paths.
    #[arg(long, value_name = "DIR")]
    node_roots: Option<PathBuf>,
    /// Run HTTP probes at least this often, whatever their periodSeconds (shortens the
    /// kubelet's 10 s default for demos).
    #[arg(long, value_parser = duration, value_name = "DURATION")]
    probe_period_max: Option<Duration>,
    /// The not-ready/unreachable tolerations the DefaultTolerationSeconds admission gives
    /// pods (the API server's --default-not-ready-toleration-seconds and
    /// --default-unreachable-toleration-seconds).
    #[arg(long, default_value_t = 300)]
    default_toleration_seconds: u32,
    /// Finished pods the pod garbage collector keeps before it deletes the oldest
    /// (kube-controller-manager's flag of the same name); 0 keeps them all.
    #[arg(long, default_value_t = 12_500)]
    terminated_pod_gc_threshold: usize,
    /// How often the pod garbage collector sweeps (a constant upstream, 20 s; shorter for
    /// tests and demos).
    #[arg(long, default_value = "20s", value_parser = duration)]
    pod_gc_period: Duration,
    /// How long the pod garbage collector waits before it takes a node missing from its
    /// caches for deleted and deletes the pods bound to it (a constant upstream, 40 s).
    #[arg(long, default_value = "40s", value_parser = duration)]
    pod_gc_quarantine: Duration,
    /// The API server's feature gates, as `NAME=true|false` (kube-apiserver's flag). Known:
    /// `WatchList` (watches that send their initial events; off by default, as in 1.33) and
    /// `EvictionRequestAPI` (1.37 alpha; needs --runtime-config lifecycle.k8s.io/v1alpha1=true).
    #[arg(long, value_name = "NAME=BOOL", value_parser = feature_gate, value_delimiter = ',')]
    feature_gates: Vec<(String, bool)>,
    /// API group versions to serve beyond the default ones, as `GROUP/VERSION=true`
    /// (kube-apiserver's flag). Known: `lifecycle.k8s.io/v1alpha1` (with the
    /// EvictionRequestAPI gate).
    #[arg(long, value_name = "GROUP/VERSION=BOOL", value_parser = runtime_config, value_delimiter = ',')]
    runtime_config: Vec<(String, bool)>,
    /// How long an Active eviction responder may go without a heartbeat before the
    /// evictionrequest-controller passes the eviction to the next (20 minutes upstream, a
    /// constant there; shorter for tests and demos).
    #[arg(long, default_value = "20m", value_parser = duration)]
    eviction_responder_heartbeat_deadline: Duration,
}

fn main() -> Result<()> {
    match Cli::parse().command {
        // Before any thread exists: a mount namespace is per process only while it has one.
        Command::RunContainer {
            spec,
            simulator_pid,
        } => {
            let error = kube_sim::container_init::run(&spec, simulator_pid);
            eprintln!("kube-sim run-container: {error}");
            std::process::exit(128);
        }
        Command::Serve(serve_args) => {
            let Serve {
                listen,
                kubeconfig_out,
                nodes,
                pods_per_node,
                tls,
                run_images,
                node_monitor_grace_period,
                node_lease_renew_interval,
                node_roots,
                probe_period_max,
                default_toleration_seconds,
                terminated_pod_gc_threshold,
                pod_gc_period,
                pod_gc_quarantine,
                feature_gates,
                runtime_config,
                eviction_responder_heartbeat_deadline,
            } = *serve_args;
            let gate = |name: &str| {
                feature_gates
                    .iter()
                    .rev()
                    .find(|(gate, _)| gate == name)
                    .is_some_and(|(_, on)| *on)
            };
            let eviction_request_api = eviction_request_api(
                gate("EvictionRequestAPI"),
                runtime_config
                    .iter()
                    .rev()
                    .find(|(group_version, _)| group_version == LIFECYCLE_ALPHA)
                    .is_some_and(|(_, on)| *on),
            )?;
            let options = SimOptions {
                listen,
                tls,
                nodes,
                pods_per_node,
                world: kube_sim::WorldOptions {
                    run_images,
                    node_monitor_grace: node_monitor_grace_period,
                    lease_renew_interval: node_lease_renew_interval,
                    container_init: std::env::current_exe().ok(),
                    node_roots,
                    probe_period_max,
                    default_toleration_seconds: i64::from(default_toleration_seconds),
                    terminated_pod_gc_threshold,
                    pod_gc_period,
                    pod_gc_quarantine,
                    responder_heartbeat_deadline: eviction_responder_heartbeat_deadline,
                    ..kube_sim::WorldOptions::default()
                },
                watch_list: gate("WatchList"),
                eviction_request_api,
                ..SimOptions::default()
            };
            tokio::runtime::Runtime::new()?.block_on(serve(options, &kubeconfig_out))
        }
    }
}

async fn serve(options: SimOptions, kubeconfig_out: &std::path::Path) -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let sim = KubeSim::start(options).await.context("start kube-sim")?;
    println!("{}", sim.url());
    sim.write_kubeconfig_to(kubeconfig_out)?;
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = terminate.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    sim.stop();
    Ok(())
}

const LIFECYCLE_ALPHA: &str = "lifecycle.k8s.io/v1alpha1";

/// The EvictionRequest API is served when both its gate and its group version are on; as a
/// real API server, kube-sim refuses to start with only one of them.
fn eviction_request_api(gate: bool, group_version: bool) -> Result<bool> {
    match (gate, group_version) {
        (true, false) => anyhow::bail!(
            "the feature gate EvictionRequestAPI is enabled but evictions.lifecycle.k8s.io and evictionrequests.lifecycle.k8s.io are not served: add --runtime-config {LIFECYCLE_ALPHA}=true"
        ),
        (false, true) => anyhow::bail!(
            "--runtime-config {LIFECYCLE_ALPHA}=true serves resources that need the feature gate EvictionRequestAPI: add --feature-gates EvictionRequestAPI=true"
        ),
        (both, _) => Ok(both),
    }
}

/// `lifecycle.k8s.io/v1alpha1=true`: a group version kube-sim can serve, and whether to.
fn runtime_config(text: &str) -> Result<(String, bool), String> {
    let (group_version, value) = text.split_once('=').unwrap_or((text, "true"));
    if group_version != LIFECYCLE_ALPHA {
        return Err(format!(
            "{group_version:?}: not an API group version kube-sim can turn on (it knows {LIFECYCLE_ALPHA})"
        ));
    }
    let on = value
        .parse()
        .map_err(|_| format!("{text:?}: the value must be true or false"))?;
    Ok((group_version.to_owned(), on))
}

/// `WatchList=true`: a gate kube-sim knows, and its setting.
fn feature_gate(text: &str) -> Result<(String, bool), String> {
    let (gate, value) = text.split_once('=').ok_or_else(|| {
        format!("{text:?}: expected NAME=true or NAME=false, like WatchList=true")
    })?;
    if !matches!(gate, "WatchList" | "EvictionRequestAPI") {
        return Err(format!(
            "{gate:?}: not a feature gate kube-sim knows (it knows WatchList and EvictionRequestAPI)"
        ));
    }
    let on = value
        .parse()
        .map_err(|_| format!("{text:?}: the value must be true or false"))?;
    Ok((gate.to_owned(), on))
}

/// `500ms`, `10s`, `2m`: a whole number above zero and a unit.
fn duration(text: &str) -> Result<Duration, String> {
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number.parse().map_err(|_| {
        format!("{text:?}: expected a whole number and a unit (ms, s, m), like 10s")
    })?;
    if number == 0 {
        return Err(format!("{text:?}: must be more than zero"));
    }
    match unit {
        "ms" => Ok(Duration::from_millis(number)),
        "s" => Ok(Duration::from_secs(number)),
        "m" => Ok(Duration::from_secs(number.saturating_mul(60))),
        _ => Err(format!("{text:?}: the unit must be ms, s or m, like 10s")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_a_unit() {
        assert_eq!(duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(duration("6s"), Ok(Duration::from_secs(6)));
        assert_eq!(duration("2m"), Ok(Duration::from_secs(120)));
        for bad in ["6", "s", "1h", "-1s", "1.5s", "", "0s"] {
            assert!(duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_eviction_request_api_needs_its_gate_and_its_group_version() {
        assert!(eviction_request_api(true, true).unwrap());
        assert!(!eviction_request_api(false, false).unwrap());
        let gate_only = eviction_request_api(true, false).unwrap_err().to_string();
        assert!(gate_only.contains("--runtime-config lifecycle.k8s.io/v1alpha1=true"));
        let group_only = eviction_request_api(false, true).unwrap_err().to_string();
        assert!(group_only.contains("--feature-gates EvictionRequestAPI=true"));
        assert!(runtime_config("lifecycle.k8s.io/v1alpha1=true").unwrap().1);
        assert!(runtime_config("batch/v2=true").is_err());
        assert!(feature_gate("EvictionRequestAPI=true").unwrap().1);
    }
}
