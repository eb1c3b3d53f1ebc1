//! `cargo xtask e2e --target kind`: the charts on a real cluster. kind's nodes are Docker
//! containers with a real kubelet and containerd; the images are the ones `cargo xtask image`
//! builds, loaded with `kind load image-archive`, and the charts are installed with helm. The
//! scenarios are driven with kubectl, Docker and helm only, so they also read as the commands an
//! operator would type.
//!
//! What runs, and what is skipped:
//! - every chart installed: the controllers' Deployments roll out Ready. The node agents need
//!   the host's D-Bus system bus, and kind's node image installs systemd without D-Bus, so no
//!   logind runs there: the agents' pods wait with a `FailedMount` Event naming the socket,
//!   which is what the chart promises on such a node, and that is what is checked;
//! - out-of-service: a worker's container is stopped (the machine loses power), the operator's
//!   taint goes on once it is NotReady, out-of-service-gc force-deletes its pods and their
//!   replacements run elsewhere; the worker starts again and the taint goes by itself;
//! - node-termination: `kubectl delete node` on a worker running four pods of a Deployment
//!   under a PodDisruptionBudget of maxUnavailable 1: the pods are evicted, the Deployment keeps
//!   at least three Ready pods, and the Node goes;
//! - leader-failover: the termination-controller's leader pod is deleted and the other
//!   replica takes its Lease;
//! - skipped: lease-blocks-shutdown and priority-shutdown, which need a logind on the node.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};

use crate::image::{self, PROGRAMS};
use crate::{helm, output_of, project_root, run_command, setup, target_dir};

const CLUSTER: &str = "nodegrace-e2e";
const NAMESPACE: &str = "nodegrace";
/// One control plane and three workers: one to power off, one to delete, one that stays.
const KIND_CONFIG: &str = "kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
nodes:
  - role: control-plane
  - role: worker
  - role: worker
  - role: worker
";

/// Where the scenarios run: a cluster this run creates (and deletes), or one it is given.
pub struct KindOptions {
    pub kubeconfig: Option<PathBuf>,
    pub keep: bool,
}

pub fn run(options: &KindOptions) -> Result<()> {
    for (command, why) in [
        ("docker", "kind's nodes are Docker containers"),
        ("kind", "it creates the cluster and loads the images"),
        ("kubectl", "the scenarios are driven with it"),
    ] {
        if !setup::on_path(command) {
            bail!("--target kind needs {command} on PATH: {why}");
        }
    }
    let helm = helm::ensure_helm()?;
    image::build_binaries(&PROGRAMS)?;
    let images = image::build_all(&PROGRAMS)?;

    let work = target_dir().join("e2e/kind");
    std::fs::create_dir_all(&work)?;
    let created = options.kubeconfig.is_none();
    let kubeconfig = match &options.kubeconfig {
        Some(path) => path.clone(),
        None => create_cluster(&work)?,
    };
    let cluster = Cluster { kubeconfig, helm };
    let outcome = (|| {
        if created {
            for built in &images {
                run_command(
                    Command::new("kind")
                        .args(["load", "image-archive", "--name", CLUSTER])
                        .arg(&built.archive),
                )?;
            }
        }
        scenarios(&cluster)
    })();
    if created && !options.keep {
        let _ = run_command(Command::new("kind").args(["delete", "cluster", "--name", CLUSTER]));
    }
    outcome
}

fn create_cluster(work: &Path) -> Result<PathBuf> {
    let config = work.join("cluster.yaml");
    std::fs::write(&config, KIND_CONFIG)?;
    let kubeconfig = work.join("kubeconfig");
    let _ = Command::new("kind")
        .args(["delete", "cluster", "--name", CLUSTER])
        .status();
    run_command(
        Command::new("kind")
            .args(["create", "cluster", "--name", CLUSTER, "--wait", "3m"])
            .arg("--config")
            .arg(&config)
            .arg("--kubeconfig")
            .arg(&kubeconfig),
    )?;
    Ok(kubeconfig)
}

struct Cluster {
    kubeconfig: PathBuf,
    helm: PathBuf,
}

impl Cluster {
    fn kubectl(&self, args: &[&str]) -> Result<String> {
        output_of(
            Command::new("kubectl")
                .arg("--kubeconfig")
                .arg(&self.kubeconfig)
                .args(args),
        )
    }

    fn apply(&self, manifest: &str) -> Result<()> {
        let path = target_dir().join("e2e/kind/manifest.yaml");
        std::fs::write(&path, manifest)?;
        self.kubectl(&["apply", "-f", &path.to_string_lossy()])?;
        Ok(())
    }

    fn install(&self, chart: &str, values: &[&str]) -> Result<()> {
        let mut install = Command::new(&self.helm);
        install
            .args(["upgrade", "--install", chart])
            .arg(project_root().join("charts").join(chart))
            .args([
                "--namespace",
                NAMESPACE,
                "--create-namespace",
                "--kubeconfig",
            ])
            .arg(&self.kubeconfig)
            .args(["--set", "logFormat=text"]);
        for value in values {
            install.args(["--set", value]);
        }
        run_command(&mut install)
    }

    /// Waits until `check` holds, re-reading the cluster every second (these waits are on a
    /// real cluster's controllers, minutes at most; there is no event to wake on from here).
    fn wait_for(
        &self,
        what: &str,
        deadline: Duration,
        check: impl Fn(&Self) -> Result<bool>,
    ) -> Result<Duration> {
        let started = Instant::now();
        loop {
            if check(self).unwrap_or(false) {
                println!("   {:>6.1}s  {what}", started.elapsed().as_secs_f64());
                return Ok(started.elapsed());
            }
            if started.elapsed() > deadline {
                bail!("not within {} s: {what}", deadline.as_secs());
            }
            std::thread::sleep(Duration::from_secs(1));
        }
    }

    fn workers(&self) -> Result<Vec<String>> {
        let names = self.kubectl(&[
            "get",
            "nodes",
            "-l",
            "!node-role.kubernetes.io/control-plane",
            "-o",
            "jsonpath={.items[*].metadata.name}",
        ])?;
        Ok(names.split_whitespace().map(str::to_owned).collect())
    }
}

fn scenarios(cluster: &Cluster) -> Result<()> {
    let workers = cluster.workers()?;
    let [stays, powered_off, deleted] = workers.as_slice() else {
        bail!(
            "the kind cluster needs three workers, it has {}",
            workers.len()
        );
    };
    println!("\n==> kind: every chart installed with helm from the loaded images");
    install_charts(cluster, stays)?;
    println!("\n==> kind: out-of-service ({powered_off} loses power)");
    out_of_service(cluster, powered_off)?;
    println!("\n==> kind: node-termination (kubectl delete node {deleted})");
    node_termination(cluster, deleted, stays)?;
    println!("\n==> kind: leader-failover");
    leader_failover(cluster)?;
    println!(
        "\n==> kind: skipped lease-blocks-shutdown and priority-shutdown: kind's node image runs \
         systemd without D-Bus, so no logind answers on its nodes"
    );
    Ok(())
}

fn install_charts(cluster: &Cluster, stays: &str) -> Result<()> {
    let pin = format!("nodeSelector.kubernetes\\.io/hostname={stays}");
    cluster.install("shutdown-inhibitor-agent", &[])?;
    cluster.install(
        "graceful-shutdown-agent",
        &["config.shutdownGracePeriod=30s"],
    )?;
    cluster.install(
        "out-of-service-gc",
        &[
            "replicas=1",
            &pin,
            "autoUntaint=true",
            "livenessGuardWindow=45s",
        ],
    )?;
    // Both replicas pinned to the node that stays: the chart's required anti-affinity would
    // keep the second one Pending.
    cluster.install(
        "termination-controller",
        &[&pin, "podAntiAffinity=preferred"],
    )?;
    for deployment in ["out-of-service-gc", "termination-controller"] {
        cluster.kubectl(&[
            "-n",
            NAMESPACE,
            "rollout",
            "status",
            &format!("deployment/{deployment}"),
            "--timeout=180s",
        ])?;
        println!("   {deployment}: rolled out, Ready");
    }
    for agent in ["shutdown-inhibitor-agent", "graceful-shutdown-agent"] {
        cluster.wait_for(
            &format!("{agent}: its pods wait for the host's D-Bus socket (FailedMount), as the chart promises on a node without logind"),
            Duration::from_secs(120),
            |cluster| {
                let events = cluster.kubectl(&[
                    "-n",
                    NAMESPACE,
                    "get",
                    "events",
                    "--field-selector",
                    "reason=FailedMount",
                    "-o",
                    "jsonpath={range .items[*]}{.involvedObject.name} {.message}{\"\\n\"}{end}",
                ])?;
                Ok(events
                    .lines()
                    .any(|line| line.starts_with(agent) && line.contains("system_bus_socket")))
            },
        )?;
    }
    Ok(())
}

fn out_of_service(cluster: &Cluster, node: &str) -> Result<()> {
    cluster.apply(&format!(
        "apiVersion: v1
kind: Namespace
metadata: {{name: payments}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: ledger, namespace: payments}}
spec:
  replicas: 1
  selector: {{matchLabels: {{app: ledger}}}}
  template:
    metadata: {{labels: {{app: ledger}}}}
    spec:
      affinity:
        nodeAffinity:
          preferredDuringSchedulingIgnoredDuringExecution:
            - weight: 100
              preference: {{matchExpressions: [{{key: kubernetes.io/hostname, operator: In, values: [{node}]}}]}}
      containers:
        - {{name: ledger, image: registry.k8s.io/pause:3.10}}
"
    ))?;
    let on_node = |cluster: &Cluster| -> Result<Vec<String>> {
        let pods = cluster.kubectl(&[
            "-n",
            "payments",
            "get",
            "pods",
            "--field-selector",
            &format!("spec.nodeName={node}"),
            "-o",
            "jsonpath={.items[*].metadata.name}",
        ])?;
        Ok(pods.split_whitespace().map(str::to_owned).collect())
    };
    cluster.wait_for(
        "payments/ledger runs on the node",
        Duration::from_secs(120),
        |c| Ok(!on_node(c)?.is_empty()),
    )?;
    run_command(Command::new("docker").args(["stop", node]))?;
    cluster.wait_for("the node is NotReady", Duration::from_secs(180), |c| {
        let ready = c.kubectl(&[
            "get",
            "node",
            node,
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
        ])?;
        Ok(ready.trim() != "True")
    })?;
    cluster.kubectl(&[
        "taint",
        "nodes",
        node,
        "node.kubernetes.io/out-of-service=nodeshutdown:NoExecute",
    ])?;
    cluster.wait_for(
        "out-of-service-gc force-deleted the node's pods; the replacement runs elsewhere",
        Duration::from_secs(180),
        |c| {
            let running_elsewhere = c.kubectl(&[
                "-n",
                "payments",
                "get",
                "pods",
                "--field-selector",
                &format!("spec.nodeName!={node},status.phase=Running"),
                "-o",
                "name",
            ])?;
            Ok(on_node(c)?.is_empty() && !running_elsewhere.trim().is_empty())
        },
    )?;
    run_command(Command::new("docker").args(["start", node]))?;
    cluster.wait_for(
        "the node is back and out-of-service-gc removed its taint",
        Duration::from_secs(240),
        |c| {
            let taints =
                c.kubectl(&["get", "node", node, "-o", "jsonpath={.spec.taints[*].key}"])?;
            Ok(!taints.contains("node.kubernetes.io/out-of-service"))
        },
    )?;
    Ok(())
}

fn node_termination(cluster: &Cluster, node: &str, stays: &str) -> Result<()> {
    // Every worker but this one cordoned while the Deployment starts: its four pods land here.
    let others: Vec<String> = cluster
        .workers()?
        .into_iter()
        .filter(|worker| worker != node)
        .collect();
    for other in &others {
        cluster.kubectl(&["cordon", other])?;
    }
    cluster.apply(
        "apiVersion: v1
kind: Namespace
metadata: {name: fleet}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: fleet}
spec:
  replicas: 4
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers:
        - {name: web, image: registry.k8s.io/pause:3.10}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: web, namespace: fleet}
spec:
  maxUnavailable: 1
  selector: {matchLabels: {app: web}}
",
    )?;
    cluster.kubectl(&[
        "-n",
        "fleet",
        "rollout",
        "status",
        "deployment/web",
        "--timeout=180s",
    ])?;
    for other in &others {
        cluster.kubectl(&["uncordon", other])?;
    }
    cluster.kubectl(&["delete", "node", node, "--wait=false"])?;
    let fewest_ready = std::cell::Cell::new(4_u32);
    cluster.wait_for(
        "the node drained through the Eviction API and went (the Deployment kept ≥ 3 Ready pods)",
        Duration::from_secs(300),
        |c| {
            let ready = c.kubectl(&[
                "-n",
                "fleet",
                "get",
                "deployment",
                "web",
                "-o",
                "jsonpath={.status.readyReplicas}",
            ])?;
            fewest_ready.set(fewest_ready.get().min(ready.trim().parse().unwrap_or(0)));
            let nodes = c.kubectl(&["get", "nodes", "-o", "name"])?;
            Ok(!nodes.lines().any(|line| line == format!("node/{node}")))
        },
    )?;
    if fewest_ready.get() < 3 {
        bail!(
            "the Deployment fell to {} Ready pods during the drain: the PodDisruptionBudget allows one down",
            fewest_ready.get()
        );
    }
    let evicted = cluster.kubectl(&[
        "-n",
        "fleet",
        "get",
        "events",
        "--field-selector",
        "reason=Evicted",
        "-o",
        "name",
    ])?;
    if evicted.lines().count() < 4 {
        bail!("expected an Evicted Event for each of the four pods, found:\n{evicted}");
    }
    println!("   the pods now run on {stays} and the other worker");
    Ok(())
}

fn leader_failover(cluster: &Cluster) -> Result<()> {
    let holder = |c: &Cluster| -> Result<String> {
        Ok(c.kubectl(&[
            "-n",
            NAMESPACE,
            "get",
            "lease",
            "termination-controller",
            "-o",
            "jsonpath={.spec.holderIdentity}",
        ])?
        .trim()
        .to_owned())
    };
    let leader = holder(cluster)?;
    if leader.is_empty() {
        bail!("the termination-controller's Lease has no holder");
    }
    cluster.kubectl(&["-n", NAMESPACE, "delete", "pod", &leader, "--wait=false"])?;
    cluster.wait_for(
        &format!("the other replica took the Lease from {leader}"),
        Duration::from_secs(60),
        |c| {
            let now = holder(c)?;
            Ok(!now.is_empty() && now != leader)
        },
    )?;
    Ok(())
}
