//! The demo's world, set up once before the acts: kube-sim with its workloads, one machine (a
//! real elogind) per node, and the agents installed from their charts and running as processes.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use crate::chart;
use crate::cluster::Cluster;
use crate::kubelet::{self, ImageBinaries, PodProcess};
use crate::manifests::{self, describe_all, kind_of};
use crate::node_host::NodeHost;
use crate::probe::http_get_succeeds;
use crate::timeline::{Timeline, seconds};
use crate::wait::{poll_for, poll_until};

pub const NODES: usize = 3;
/// The namespace the charts are installed into (`helm install -n nodegrace`).
pub const AGENTS_NAMESPACE: &str = "nodegrace";
pub const GRACEFUL_SHUTDOWN_AGENT: &str = "graceful-shutdown-agent";
pub const SHUTDOWN_INHIBITOR_AGENT: &str = "shutdown-inhibitor-agent";
pub const OUT_OF_SERVICE_GC: &str = "out-of-service-gc";
pub const TERMINATION_CONTROLLER: &str = "termination-controller";
/// The charts, installed in this order.
const CHARTS: [&str; 4] = [
    SHUTDOWN_INHIBITOR_AGENT,
    GRACEFUL_SHUTDOWN_AGENT,
    OUT_OF_SERVICE_GC,
    TERMINATION_CONTROLLER,
];
/// The demo's machines renew their node Lease every second and count as down after 6 s of
/// silence (the real 10 s and 40 s would make the audience wait).
pub const NODE_LEASE_RENEW_INTERVAL: Duration = Duration::from_secs(1);
pub const NODE_MONITOR_GRACE_PERIOD: Duration = Duration::from_secs(6);
const WORKLOADS: &str = include_str!("../demo/workloads.yaml");
/// Kinds a chart renders that kube-sim does not serve yet (it has no RBAC; every request is
/// allowed). Listed, not silently dropped.
const NOT_SERVED: [&str; 4] = ["ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"];
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// Where the demo finds what it runs.
#[derive(Debug, Clone)]
pub struct Inputs {
    pub binaries: ImageBinaries,
    pub helm: PathBuf,
    pub charts_dir: PathBuf,
    pub values_dir: PathBuf,
    pub work_dir: PathBuf,
}

#[derive(Debug)]
pub struct Stage {
    pub timeline: Timeline,
    pub pods: Vec<PodProcess>,
    pub nodes: Vec<NodeHost>,
    pub cluster: Cluster,
    /// The graceful agent's priority groups as its chart configured them: (priority, period).
    pub shutdown_groups: Vec<(i32, Duration)>,
    pub work_dir: PathBuf,
    binaries: ImageBinaries,
}

impl Stage {
    pub async fn build(inputs: &Inputs, timeline: Timeline) -> Result<Self> {
        let work_dir = &inputs.work_dir;
        if work_dir.exists() {
            std::fs::remove_dir_all(work_dir)
                .with_context(|| format!("clear {}", work_dir.display()))?;
        }
        std::fs::create_dir_all(work_dir.join("logs"))?;
        timeline.heading("Setting up: a cluster, its workloads, one machine per node, the agents");
        let kube_sim = inputs.binaries.binary_for("kube-sim")?;
        let cluster = Cluster::start(
            &kube_sim,
            NODES,
            NODE_LEASE_RENEW_INTERVAL,
            NODE_MONITOR_GRACE_PERIOD,
            work_dir,
        )
        .await?;
        timeline.event(&format!(
            "kube-sim serving {NODES} Ready nodes (pid {})",
            cluster.pid()
        ));
        let client = cluster.client().clone();
        let (created, expected_pods) = create_workloads(&client).await?;
        timeline.event(&format!("created {created}"));
        wait_for_running_pods(&client, expected_pods).await?;
        timeline.event(&format!(
            "{expected_pods} workload pods Running on the {NODES} nodes"
        ));
        timeline.show("kubectl get pods -A -o wide");

        let elogind = logind_harness::provision(&logind_harness::work_dir().join("elogind"))
            .context("provision elogind (downloaded from Debian's archive on first use)")?;
        timeline.event(&format!(
            "elogind from Debian's packages, unpacked at {}",
            elogind.daemon().display()
        ));
        let mut nodes = Vec::new();
        for index in 0..NODES {
            let name = format!("node-{index}");
            let host = NodeHost::boot(&name, index as u8, work_dir).await?;
            timeline.event(&format!(
                "{name}: real elogind on its own system bus (pid {})",
                host.logind()?.elogind_pid().await?
            ));
            nodes.push(host);
        }

        let mut stage = Self {
            timeline,
            pods: Vec::new(),
            nodes,
            cluster,
            shutdown_groups: Vec::new(),
            work_dir: work_dir.clone(),
            binaries: inputs.binaries.clone(),
        };
        stage.install_charts(inputs).await?;
        Ok(stage)
    }

    pub fn client(&self) -> &Client {
        self.cluster.client()
    }

    pub fn node(&self, name: &str) -> Result<&NodeHost> {
        self.nodes
            .iter()
            .find(|node| node.name() == name)
            .with_context(|| format!("no machine for {name}"))
    }

    /// The process of `program`'s pod on `node`.
    pub fn agent(&self, node: &str, program: &str) -> Result<&PodProcess> {
        self.pods
            .iter()
            .find(|pod| pod.node == node && pod.program == program)
            .with_context(|| format!("no {program} runs on {node}"))
    }

    /// `helm install` of each chart, then its workload's pods started on their machines.
    async fn install_charts(&mut self, inputs: &Inputs) -> Result<()> {
        let client = self.client().clone();
        Api::<Namespace>::all(client.clone())
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": AGENTS_NAMESPACE}}))?,
            )
            .await?;
        for program in CHARTS {
            let values = inputs.values_dir.join(format!("{program}.values.yaml"));
            let objects = chart::render(
                &inputs.helm,
                &inputs.charts_dir.join(program),
                program,
                AGENTS_NAMESPACE,
                &values,
            )?;
            let (skipped, served): (Vec<&Value>, Vec<&Value>) = objects
                .iter()
                .partition(|object| NOT_SERVED.contains(&kind_of(object)));
            for object in &served {
                manifests::create(&client, object, AGENTS_NAMESPACE).await?;
            }
            self.timeline.event(&format!(
                "helm template charts/{program} -f e2e/demo/{program}.values.yaml: created {}",
                describe_all(served.iter().copied())
            ));
            if !skipped.is_empty() {
                self.timeline.event(&format!(
                    "  not created (kube-sim has no RBAC yet; every request is allowed): {}",
                    describe_all(skipped.iter().copied())
                ));
            }
            if program == GRACEFUL_SHUTDOWN_AGENT {
                self.shutdown_groups = shutdown_groups(&objects)?;
            }
            self.start_chart_pods(program, expected_pods(&objects))
                .await?;
        }
        self.wait_until_ready(0).await?;
        self.timeline.show(&format!(
            "kubectl -n {AGENTS_NAMESPACE} get daemonsets,deployments,pods -o wide"
        ));
        Ok(())
    }

    /// Waits until the chart's workload has `expected` pods bound to nodes, then starts them.
    async fn start_chart_pods(&mut self, program: &str, expected: usize) -> Result<()> {
        let pods: Api<Pod> = Api::namespaced(self.client().clone(), AGENTS_NAMESPACE);
        let selector = format!("app.kubernetes.io/name={program}");
        let bound = poll_for(READY_TIMEOUT, || async {
            let listed: Vec<Pod> = pods
                .list(&ListParams::default().labels(&selector))
                .await
                .ok()?
                .items
                .into_iter()
                .filter(|pod| {
                    pod.metadata.deletion_timestamp.is_none()
                        && pod
                            .spec
                            .as_ref()
                            .is_some_and(|spec| spec.node_name.is_some())
                })
                .collect();
            (listed.len() == expected).then_some(listed)
        })
        .await;
        let Some(bound) = bound else {
            bail!(
                "the {program} chart has not {expected} pods bound to nodes after {READY_TIMEOUT:?} (label {selector})"
            );
        };
        for pod in &bound {
            self.start_pod(pod).await?;
        }
        Ok(())
    }

    /// What the node's kubelet does for a pod of ours: runs its process on the node's machine.
    async fn start_pod(&mut self, pod: &Pod) -> Result<()> {
        let pod = serde_json::to_value(pod)?;
        let node = self.node(pod["spec"]["nodeName"].as_str().unwrap_or_default())?;
        let process = kubelet::start(
            self.cluster.client(),
            &pod,
            node,
            &self.binaries,
            self.cluster.kubeconfig(),
        )
        .await?;
        self.pods.push(process);
        Ok(())
    }

    /// Waits until the processes from `first` on pass their readiness probes.
    async fn wait_until_ready(&mut self, first: usize) -> Result<()> {
        let started = self.timeline.elapsed();
        for index in first..self.pods.len() {
            let ready = poll_until(READY_TIMEOUT, || {
                let exited = self.pods[index].has_exited();
                let target = self.pods[index].readiness.clone();
                async move {
                    exited
                        || match target {
                            Some((address, path)) => http_get_succeeds(address, &path).await,
                            None => true,
                        }
                }
            })
            .await;
            let pod = &mut self.pods[index];
            let exited = pod.has_exited();
            if !ready || exited {
                bail!(
                    "{} on {} ({}) {}; its log ({}):\n{}",
                    pod.program,
                    pod.node,
                    pod.pod,
                    if exited {
                        "exited"
                    } else {
                        "did not become ready"
                    },
                    pod.log.display(),
                    log_tail(&pod.log)
                );
            }
        }
        self.timeline.event(&format!(
            "{} processes of our pods ready (readiness probes pass) after {}",
            self.pods.len() - first,
            seconds(self.timeline.elapsed().saturating_sub(started))
        ));
        Ok(())
    }

    /// The machine behind `node` loses power: its processes end at once, its logind with them,
    /// and the node's kubelet stops reporting (kube-sim's `sim.nodegrace.io/kubelet: stopped`).
    pub async fn power_off(&mut self, node: &str) -> Result<()> {
        for pod in self.pods.iter_mut().filter(|pod| pod.node == node) {
            pod.kill();
        }
        self.pods.retain(|pod| pod.node != node);
        if let Some(host) = self.nodes.iter_mut().find(|host| host.name() == node) {
            host.power_off();
        }
        Api::<Node>::all(self.client().clone())
            .patch(
                node,
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"metadata": {"annotations": {"sim.nodegrace.io/kubelet": "stopped"}}}),
                ),
            )
            .await
            .with_context(|| format!("stop {node}'s kubelet"))?;
        Ok(())
    }

    /// The machine behind `node` was terminated and its Node is gone: its processes end.
    pub fn machine_terminated(&mut self, node: &str) {
        for pod in self.pods.iter_mut().filter(|pod| pod.node == node) {
            pod.kill();
        }
        self.pods.retain(|pod| pod.node != node);
        if let Some(host) = self.nodes.iter_mut().find(|host| host.name() == node) {
            host.power_off();
        }
    }

    /// The machine behind `node` boots again: a fresh elogind, its kubelet reporting again,
    /// and the processes of our pods still bound to it started anew, as a kubelet restarts its
    /// pods' containers after a reboot.
    pub async fn power_on(&mut self, node: &str) -> Result<()> {
        let index = self
            .nodes
            .iter()
            .position(|host| host.name() == node)
            .with_context(|| format!("no machine for {node}"))?;
        let address_index = u8::try_from(index).context("too many machines")?;
        self.nodes[index] = NodeHost::boot(node, address_index, &self.work_dir).await?;
        Api::<Node>::all(self.client().clone())
            .patch(
                node,
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"metadata": {"annotations": {"sim.nodegrace.io/kubelet": null}}}),
                ),
            )
            .await
            .with_context(|| format!("restart {node}'s kubelet"))?;
        let ours: Vec<Pod> = Api::<Pod>::namespaced(self.client().clone(), AGENTS_NAMESPACE)
            .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
            .await?
            .items
            .into_iter()
            .filter(|pod| pod.metadata.deletion_timestamp.is_none())
            .collect();
        let first = self.pods.len();
        for pod in &ours {
            self.start_pod(pod).await?;
        }
        self.wait_until_ready(first).await
    }

    /// Stops everything, agents first, then the machines, then the cluster.
    pub fn tear_down(mut self) {
        for pod in &mut self.pods {
            pod.kill();
        }
        self.pods.clear();
        self.nodes.clear();
    }

    pub fn kubeconfig(&self) -> &Path {
        self.cluster.kubeconfig()
    }
}

/// Creates the workloads; returns what was created and how many pods they make.
async fn create_workloads(client: &Client) -> Result<(String, usize)> {
    let objects = manifests::parse_documents(WORKLOADS)?;
    for object in &objects {
        manifests::create(client, object, "default").await?;
    }
    let pods = objects
        .iter()
        .map(|object| match kind_of(object) {
            "ReplicaSet" => object["spec"]["replicas"].as_u64().unwrap_or(1) as usize,
            "DaemonSet" => NODES,
            _ => 0,
        })
        .sum();
    Ok((describe_all(&objects), pods))
}

async fn wait_for_running_pods(client: &Client, expected: usize) -> Result<()> {
    let pods: Api<Pod> = Api::all(client.clone());
    let params = ListParams::default().fields("status.phase=Running");
    let running = poll_until(READY_TIMEOUT, || async {
        pods.list(&params)
            .await
            .is_ok_and(|list| list.items.len() >= expected)
    })
    .await;
    if !running {
        bail!("the workloads did not reach {expected} Running pods within {READY_TIMEOUT:?}");
    }
    Ok(())
}

/// How many pods the rendered workloads make: one per node for a DaemonSet, the replicas of
/// a Deployment.
fn expected_pods(objects: &[Value]) -> usize {
    objects
        .iter()
        .map(|object| match kind_of(object) {
            "DaemonSet" => NODES,
            "Deployment" => object["spec"]["replicas"]
                .as_u64()
                .map_or(1, |replicas| replicas as usize),
            _ => 0,
        })
        .sum()
}

/// `shutdownGracePeriodByPodPriority` from the rendered ConfigMap, lowest priority first.
fn shutdown_groups(objects: &[Value]) -> Result<Vec<(i32, Duration)>> {
    let config = objects
        .iter()
        .find(|object| kind_of(object) == "ConfigMap")
        .and_then(|config_map| config_map["data"]["config.yaml"].as_str())
        .context("the graceful-shutdown-agent chart rendered no ConfigMap with config.yaml")?;
    let config: Value = serde_yaml_ng::from_str(config).context("parse the agent's config.yaml")?;
    let mut groups: Vec<(i32, Duration)> = config["shutdownGracePeriodByPodPriority"]
        .as_array()
        .context("the demo's values give shutdownGracePeriodByPodPriority")?
        .iter()
        .map(|group| {
            let priority = group["priority"]
                .as_i64()
                .and_then(|p| i32::try_from(p).ok());
            let period = group["shutdownGracePeriodSeconds"].as_u64();
            priority
                .zip(period)
                .map(|(priority, period)| (priority, Duration::from_secs(period)))
                .context("a priority group without priority or shutdownGracePeriodSeconds")
        })
        .collect::<Result<_>>()?;
    groups.sort_by_key(|(priority, _)| *priority);
    Ok(groups)
}

pub fn log_tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}
