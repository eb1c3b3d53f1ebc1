//! The controller process killed with SIGKILL at random points while three nodes are drained
//! under PodDisruptionBudgets and a NodeDisruptionBudget, and started again each time (or, with
//! two replicas, the leader killed and restarted while the other takes over). The points are
//! random numbers of cluster changes (pod, node and budget watch events), so a kill lands
//! anywhere: mid-grant, mid-cordon, between an eviction and its answer, before the terminate
//! stamp, after the terminate, before the finalizer goes.

use std::collections::BTreeSet;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Context, Result};
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use kube_sim::KubeSim;
use rand::{Rng, SeedableRng};
use serde_json::json;
use termination_controller::api::{FINALIZER, NodeDisruptionBudget};
use tokio::process::{Child, Command};

use nodegrace_testing::Admin;

use crate::common::{
    app, cluster, delete_node, finalizer_on_every_node, log_daemonset, sim, terminate_calls,
    wait_for, wait_ready, web, workers_budget, world,
};

const BINARY: &str = env!("CARGO_BIN_EXE_termination-controller");
const DRAINED: [&str; 3] = ["node-0", "node-1", "node-2"];

#[derive(Debug, Clone, Copy)]
pub struct Chaos {
    pub kills: u32,
    pub replicas: usize,
    /// Replicas of the PDB-covered Deployment spread over the five nodes: more make longer
    /// drains, with room for more kills.
    pub web_replicas: i32,
    pub seed: u64,
    /// Drain through EvictionRequests (`--eviction-api=eviction-request`, the simulator
    /// serving the API) rather than the Eviction API.
    pub eviction_requests: bool,
}

#[derive(Debug, Clone, Copy, Default)]
pub struct Report {
    pub kills: u32,
    pub drains_completed: usize,
    /// PodDisruptionBudget breaches (kube-sim's audit) plus every node disrupted beyond one at
    /// a time; the two parts below say which.
    pub violations: usize,
    pub pdb_breaches: usize,
    pub most_nodes_disrupted: usize,
    pub terminations_per_instance_max: u32,
    pub finalizers_left: usize,
    /// EvictionRequests of ours still there once the drains finished.
    pub requests_left: usize,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "chaos kills={} drains-completed={} violations={} (pdb-breaches={} most-nodes-disrupted-at-once={}) terminations-per-instance-max={} finalizers-left={} requests-left={}",
            self.kills,
            self.drains_completed,
            self.violations,
            self.pdb_breaches,
            self.most_nodes_disrupted,
            self.terminations_per_instance_max,
            self.finalizers_left,
            self.requests_left
        )
    }
}

struct Replica {
    identity: String,
    child: Child,
    admin: Admin,
}

fn start(sim: &KubeSim, identity: &str, elected: bool, requests: bool) -> Result<Replica> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let mut command = Command::new(BINARY);
    command
        .arg(format!("--kubeconfig={}", sim.kubeconfig_path().display()))
        .arg(format!("--admin-listen=127.0.0.1:{port}"))
        .arg("--instance-provider=sim")
        .arg("--eviction-backoff-max=1s")
        .arg("--log-level=warn")
        .arg(if requests {
            "--eviction-api=eviction-request"
        } else {
            "--eviction-api=eviction"
        })
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    if elected {
        command
            .arg("--leader-elect=true")
            .arg("--leader-election-namespace=default")
            .arg(format!("--leader-election-identity={identity}"))
            .arg("--leader-election-lease-duration=2s")
            .arg("--leader-election-renew-margin=1s");
    } else {
        command.arg("--leader-elect=false");
    }
    Ok(Replica {
        identity: identity.to_owned(),
        child: command.spawn().context("start termination-controller")?,
        admin: Admin {
            address: std::net::SocketAddr::from(([127, 0, 0, 1], port)),
            prefix: "nodegrace_termination_controller",
        },
    })
}

/// Counts cluster changes, and the most nodes disrupted (cordoned, not yet gone) at once.
#[derive(Debug, Default)]
struct Observed {
    changes: AtomicU64,
    disrupting: std::sync::Mutex<(BTreeSet<String>, usize)>,
}

fn observe(client: &Client) -> Arc<Observed> {
    let observed = Arc::new(Observed::default());
    let pods: Api<Pod> = Api::all(client.clone());
    let seen = Arc::clone(&observed);
    tokio::spawn(async move {
        let mut events =
            std::pin::pin!(watcher(pods, watcher::Config::default()).default_backoff());
        while events.next().await.is_some() {
            seen.changes.fetch_add(1, Ordering::Relaxed);
        }
    });
    let budgets: Api<NodeDisruptionBudget> = Api::all(client.clone());
    let seen = Arc::clone(&observed);
    tokio::spawn(async move {
        let mut events =
            std::pin::pin!(watcher(budgets, watcher::Config::default()).default_backoff());
        while events.next().await.is_some() {
            seen.changes.fetch_add(1, Ordering::Relaxed);
        }
    });
    let nodes: Api<Node> = Api::all(client.clone());
    let seen = Arc::clone(&observed);
    tokio::spawn(async move {
        let mut events =
            std::pin::pin!(watcher(nodes, watcher::Config::default()).default_backoff());
        // A re-list (after a watch error) rebuilds the set: a node deleted while the watch was
        // down sends no Delete and must not stay counted.
        let mut relisted = BTreeSet::new();
        while let Some(Ok(event)) = events.next().await {
            seen.changes.fetch_add(1, Ordering::Relaxed);
            let mut disrupting = seen.disrupting.lock().expect("disrupting");
            let cordoned =
                |node: &Node| node.spec.as_ref().and_then(|spec| spec.unschedulable) == Some(true);
            let name = |node: Node| node.metadata.name.unwrap_or_default();
            match event {
                watcher::Event::Init => relisted.clear(),
                watcher::Event::InitApply(node) => {
                    if cordoned(&node) {
                        relisted.insert(name(node));
                    }
                }
                watcher::Event::InitDone => disrupting.0 = std::mem::take(&mut relisted),
                watcher::Event::Apply(node) => {
                    if cordoned(&node) {
                        disrupting.0.insert(name(node));
                    } else {
                        disrupting.0.remove(&name(node));
                    }
                }
                watcher::Event::Delete(node) => {
                    disrupting.0.remove(&name(node));
                }
            }
            if disrupting.0.len() > 1 {
                eprintln!("chaos: nodes cordoned at once: {:?}", disrupting.0);
            }
            disrupting.1 = disrupting.1.max(disrupting.0.len());
        }
    });
    observed
}

async fn leader(client: &Client) -> Result<Option<String>> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), "default");
    Ok(leases
        .get_opt("termination-controller")
        .await?
        .and_then(|lease| lease.spec?.holder_identity))
}

async fn deleted_nodes_gone(client: &Client) -> Result<usize> {
    let nodes: Api<Node> = Api::all(client.clone());
    let mut gone = 0;
    for node in DRAINED {
        gone += usize::from(nodes.get_opt(node).await?.is_none());
    }
    Ok(gone)
}

pub async fn run(chaos: Chaos) -> Result<Report> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(chaos.seed);
    let sim = if chaos.eviction_requests {
        cluster(5)
            .options(kube_sim::SimOptions {
                eviction_request_api: true,
                world: world(),
                ..kube_sim::SimOptions::default()
            })
            .start()
            .await?
    } else {
        sim(5).await?
    };
    let client = sim.client();
    workers_budget(&client).await?;
    web(chaos.web_replicas).create(&client).await?;
    app("api", 5)
        .budget(json!({"minAvailable": 3}))
        .create(&client)
        .await?;
    log_daemonset(&client).await?;
    wait_ready(&client, "web", usize::try_from(chaos.web_replicas)?).await?;
    wait_ready(&client, "api", 5).await?;
    let elected = chaos.replicas > 1;
    let mut replicas = (0..chaos.replicas)
        .map(|index| {
            start(
                &sim,
                &format!("replica-{index}"),
                elected,
                chaos.eviction_requests,
            )
        })
        .collect::<Result<Vec<_>>>()?;
    finalizer_on_every_node(&client, 5).await?;
    let observed = observe(&client);
    for node in DRAINED {
        delete_node(&client, node).await?;
    }
    let mut kills = 0;
    while kills < chaos.kills && deleted_nodes_gone(&client).await? < DRAINED.len() {
        let victim = if elected {
            let Some(holder) = leader(&client).await? else {
                continue;
            };
            replicas
                .iter()
                .position(|replica| replica.identity == holder)
                .context("the leader is one of ours")?
        } else {
            0
        };
        // A random point: one kill in four while the process starts and syncs its caches;
        // the others once it is ready, after 1 to 8 more changes in the cluster.
        if rng.random_bool(0.75) {
            let admin = replicas[victim].admin;
            let ready = wait_for("the replica to be ready", || async move {
                Ok(admin.is_ready().await.unwrap_or(false))
            })
            .await;
            if ready.is_err() {
                break;
            }
        }
        let target = observed.changes.load(Ordering::Relaxed) + rng.random_range(1..=8);
        let progressed = wait_for("the next kill point", || {
            let observed = Arc::clone(&observed);
            async move { Ok(observed.changes.load(Ordering::Relaxed) >= target) }
        })
        .await;
        if progressed.is_err() {
            break;
        }
        let replica = &mut replicas[victim];
        replica.child.start_kill().context("SIGKILL")?;
        replica.child.wait().await?;
        kills += 1;
        let identity = replica.identity.clone();
        // A killed leader comes back as a new pod would, under a new name, so the other
        // replica has to take over once the Lease expires.
        let next = if elected {
            format!("replica-{victim}-{kills}")
        } else {
            identity.clone()
        };
        *replica = start(&sim, &next, elected, chaos.eviction_requests)?;
        if elected {
            // The next kill is of the replica that took over, once it has.
            let took_over = wait_for("another replica to take over", || {
                let client = client.clone();
                let identity = identity.clone();
                async move {
                    Ok(leader(&client)
                        .await?
                        .is_some_and(|holder| holder != identity))
                }
            })
            .await;
            if took_over.is_err() || deleted_nodes_gone(&client).await? == DRAINED.len() {
                break;
            }
        }
    }
    let finished = wait_for("the three drains to finish", || {
        let client = client.clone();
        async move { Ok(deleted_nodes_gone(&client).await? == DRAINED.len()) }
    })
    .await;
    if let Err(error) = finished {
        eprintln!("chaos: {error}");
    }
    let nodes: Api<Node> = Api::all(client.clone());
    let mut finalizers_left = 0;
    for node in nodes.list(&kube::api::ListParams::default()).await?.items {
        let deleting = node.metadata.deletion_timestamp.is_some();
        let ours = node
            .metadata
            .finalizers
            .iter()
            .flatten()
            .any(|f| f == FINALIZER);
        finalizers_left += usize::from(deleting && ours);
    }
    // The sweep closes what a killed process left within its period (30 s).
    let requests_left = if chaos.eviction_requests {
        let closed = wait_for("no EvictionRequest of ours left", || {
            let client = client.clone();
            async move {
                Ok(termination_controller::handover::list(&client)
                    .await?
                    .is_empty())
            }
        })
        .await;
        if let Err(error) = closed {
            eprintln!("chaos: {error}");
        }
        termination_controller::handover::list(&client).await?.len()
    } else {
        0
    };
    let most_disrupting = observed.disrupting.lock().expect("disrupting").1;
    let breaches = sim.world().audit().violations();
    if !breaches.is_empty() {
        eprintln!("chaos: PodDisruptionBudget breaches: {breaches:?}");
    }
    let report = Report {
        kills,
        drains_completed: deleted_nodes_gone(&client).await?,
        violations: breaches.len() + most_disrupting.saturating_sub(1),
        pdb_breaches: breaches.len(),
        most_nodes_disrupted: most_disrupting,
        terminations_per_instance_max: DRAINED
            .iter()
            .map(|node| terminate_calls(&sim, node))
            .max()
            .unwrap_or(0),
        finalizers_left,
        requests_left,
    };
    for replica in &mut replicas {
        let _ = replica.child.start_kill();
        let _ = replica.child.wait().await;
    }
    drop(sim);
    Ok(report)
}
