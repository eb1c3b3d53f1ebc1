//! The demo's world, set up once before the acts: one machine (a real elogind) per node,
//! kube-sim with its workloads, and the four charts installed with helm, their pods run by
//! kube-sim's kubelets as processes with their ServiceAccounts' tokens.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use crate::chart;
use crate::cluster::Cluster;
use crate::images::ImageBinaries;
use crate::manifests::{self, describe_all, kind_of};
use crate::node_host::NodeHost;
use crate::rbac::{self, RuleRef};
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
pub const CHARTS: [&str; 4] = [
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
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// Where the demo finds what it runs.
#[derive(Debug, Clone)]
pub struct Inputs {
    pub binaries: ImageBinaries,
    pub helm: PathBuf,
    pub charts_dir: PathBuf,
    pub values_dir: PathBuf,
    pub work_dir: PathBuf,
    /// The charts to install (a subset of [`CHARTS`], in its order).
    pub charts: Vec<String>,
    /// A chart installed from its rendering with this one RBAC rule removed, instead of with
    /// helm, to show the rule is needed (its pods are not waited for: they may never be Ready).
    pub without_rule: Option<RuleRef>,
    /// `helm --set` values for the charts, beside their demo values files (a least-privilege
    /// proof's variant of a chart).
    pub values_set: Vec<String>,
}

#[derive(Debug)]
pub struct Stage {
    pub timeline: Timeline,
    pub nodes: Vec<NodeHost>,
    pub cluster: Cluster,
    /// The graceful agent's priority groups as its chart configured them: (priority, period).
    pub shutdown_groups: Vec<(i32, Duration)>,
    pub work_dir: PathBuf,
    /// The helm the charts were installed with, from `charts_dir` with the values files of
    /// `values_dir`.
    pub helm: PathBuf,
    pub charts_dir: PathBuf,
    pub values_dir: PathBuf,
    /// Where the programs' binaries are, `kubectl-nodegrace` among them.
    pub bin_dir: PathBuf,
    /// Each chart's pods once installed: (program, how many).
    installed: Vec<(String, usize)>,
}

/// Where the machines' filesystems are (`kube-sim serve --node-roots`).
fn machine_roots(work_dir: &Path) -> PathBuf {
    work_dir.join("nodes")
}

impl Stage {
    pub async fn build(inputs: &Inputs, timeline: Timeline) -> Result<Self> {
        let work_dir = &inputs.work_dir;
        if work_dir.exists() {
            std::fs::remove_dir_all(work_dir)
                .with_context(|| format!("clear {}", work_dir.display()))?;
        }
        std::fs::create_dir_all(work_dir.join("logs"))?;
        timeline.heading("Setting up: one machine per node, a cluster, its workloads, the charts");
        let elogind = logind_harness::provision(&logind_harness::work_dir().join("elogind"))
            .context("provision elogind (downloaded from Debian's archive on first use)")?;
        timeline.event(&format!(
            "elogind from Debian's packages, unpacked at {}",
            elogind.daemon().display()
        ));
        let roots = machine_roots(work_dir);
        let mut nodes = Vec::new();
        for index in 0..NODES {
            let name = format!("node-{index}");
            let host = NodeHost::boot(&name, &roots).await?;
            timeline.event(&format!(
                "{name}: real elogind on its own system bus (pid {})",
                host.logind()?.elogind_pid().await?
            ));
            nodes.push(host);
        }
        let kube_sim = inputs.binaries.binary("kube-sim")?;
        let mut args = vec![
            "--tls".to_owned(),
            format!("--node-roots={}", roots.display()),
            // Probes every second at most: the charts' 10 s default would only make people wait.
            "--probe-period-max=1s".to_owned(),
            // Kubernetes 1.37's alpha EvictionRequest API, as a cluster that turned it on serves
            // it; the charts' defaults do not use it, the eviction-request act does.
            "--feature-gates=EvictionRequestAPI=true".to_owned(),
            "--runtime-config=lifecycle.k8s.io/v1alpha1=true".to_owned(),
        ];
        for rule in inputs.binaries.run_image_rules(&work_dir.join("images"))? {
            args.push(format!("--run-image={rule}"));
        }
        let cluster = Cluster::start(
            &kube_sim,
            NODES,
            NODE_LEASE_RENEW_INTERVAL,
            NODE_MONITOR_GRACE_PERIOD,
            work_dir,
            &args,
        )
        .await?;
        timeline.event(&format!(
            "kube-sim serving {NODES} Ready nodes over TLS (pid {}); it runs our images' pods as processes, RBAC enforced",
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

        let mut stage = Self {
            timeline,
            nodes,
            cluster,
            shutdown_groups: Vec::new(),
            work_dir: work_dir.clone(),
            helm: inputs.helm.clone(),
            charts_dir: inputs.charts_dir.clone(),
            values_dir: inputs.values_dir.clone(),
            bin_dir: inputs.binaries.dir.clone(),
            installed: Vec::new(),
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

    /// The name of `program`'s pod on `node`.
    pub async fn agent_pod(&self, node: &str, program: &str) -> Result<String> {
        let pods: Api<Pod> = Api::namespaced(self.client().clone(), AGENTS_NAMESPACE);
        let params = ListParams::default()
            .labels(&format!("app.kubernetes.io/name={program}"))
            .fields(&format!("spec.nodeName={node}"));
        pods.list(&params)
            .await?
            .items
            .into_iter()
            .find(|pod| pod.metadata.deletion_timestamp.is_none())
            .and_then(|pod| pod.metadata.name)
            .with_context(|| format!("no {program} pod runs on {node}"))
    }

    /// `helm install` of each chart; kube-sim's kubelets run the pods, the demo waits until
    /// their readiness probes pass.
    async fn install_charts(&mut self, inputs: &Inputs) -> Result<()> {
        let started = self.timeline.elapsed();
        for program in CHARTS
            .into_iter()
            .filter(|program| inputs.charts.iter().any(|chosen| chosen == program))
        {
            let values = inputs.values_dir.join(format!("{program}.values.yaml"));
            let chart_dir = inputs.charts_dir.join(program);
            let set = chart::set_flags(&inputs.values_set);
            let objects = chart::render(
                &inputs.helm,
                &chart_dir,
                program,
                AGENTS_NAMESPACE,
                &values,
                &inputs.values_set,
            )?;
            match &inputs.without_rule {
                Some(rule) if rule.chart == program => {
                    let trimmed = rbac::without(&objects, rule, AGENTS_NAMESPACE)?;
                    manifests::ensure_namespace(self.client(), AGENTS_NAMESPACE).await?;
                    for object in &trimmed {
                        manifests::create(self.client(), object, AGENTS_NAMESPACE).await?;
                    }
                    self.timeline.event(&format!(
                        "helm template {program} charts/{program} -f e2e/demo/{program}.values.yaml{set}, rule {} of {} removed, created: {}",
                        rule.index,
                        rule.role,
                        describe_all(&trimmed)
                    ));
                }
                _ => {
                    chart::Release {
                        helm: &inputs.helm,
                        kubeconfig: self.cluster.kubeconfig(),
                        chart: &chart_dir,
                        name: program,
                        namespace: AGENTS_NAMESPACE,
                    }
                    .install(&[&values], &inputs.values_set)?;
                    self.timeline.event(&format!(
                        "helm install {program} charts/{program} -n {AGENTS_NAMESPACE} -f e2e/demo/{program}.values.yaml{set}: {}",
                        describe_all(&objects)
                    ));
                }
            }
            if program == GRACEFUL_SHUTDOWN_AGENT {
                self.shutdown_groups = shutdown_groups(&objects)?;
            }
            self.installed
                .push((program.to_owned(), expected_pods(&objects)));
        }
        if inputs.without_rule.is_some() {
            return Ok(());
        }
        self.wait_until_ready(None).await?;
        self.timeline.event(&format!(
            "every chart's pods Ready (their readiness probes pass) {} after the first install",
            seconds(self.timeline.elapsed().saturating_sub(started))
        ));
        self.timeline.show(&format!(
            "kubectl -n {AGENTS_NAMESPACE} get daemonsets,deployments,pods -o wide"
        ));
        Ok(())
    }

    /// Waits until every installed chart has its pods Ready: everywhere, or those on a node
    /// that booted at `since`, Ready again since then.
    async fn wait_until_ready(&self, node: Option<(&str, jiff::Timestamp)>) -> Result<()> {
        let pods: Api<Pod> = Api::namespaced(self.client().clone(), AGENTS_NAMESPACE);
        for (program, expected) in &self.installed {
            let mut params =
                ListParams::default().labels(&format!("app.kubernetes.io/name={program}"));
            if let Some((node, _)) = node {
                params = params.fields(&format!("spec.nodeName={node}"));
            }
            // Condition times are whole seconds.
            let since = node.map(|(_, since)| since.as_second());
            let ready = poll_for(READY_TIMEOUT, || async {
                let listed = pods.list(&params).await.ok()?.items;
                let live: Vec<&Pod> = listed
                    .iter()
                    .filter(|pod| pod.metadata.deletion_timestamp.is_none())
                    .collect();
                let enough = node.is_some() || live.len() == *expected;
                let ready = live.iter().all(|pod| match since {
                    None => pod_ready(pod),
                    Some(since) => ready_since(pod).is_some_and(|at| at >= since),
                });
                (enough && ready).then_some(())
            })
            .await;
            if ready.is_none() {
                bail!(
                    "{program}'s pods are not all Ready after {READY_TIMEOUT:?}:\n{}",
                    pod_report(&pods, &params).await
                );
            }
        }
        Ok(())
    }

    /// The machine behind `node` loses power: its logind ends, its kubelet stops reporting
    /// (kube-sim's `sim.nodegrace.io/kubelet: stopped`) and kube-sim kills its pods' processes.
    pub async fn power_off(&mut self, node: &str) -> Result<()> {
        if let Some(host) = self.nodes.iter_mut().find(|host| host.name() == node) {
            host.power_off();
        }
        set_kubelet(self.client(), node, Some("stopped")).await
    }

    /// The machine behind `node` was terminated and its Node is gone.
    pub fn machine_terminated(&mut self, node: &str) {
        if let Some(host) = self.nodes.iter_mut().find(|host| host.name() == node) {
            host.power_off();
        }
    }

    /// The machine behind `node` boots again: a fresh elogind, its kubelet reporting again
    /// and starting our pods' containers anew, as after a reboot.
    pub async fn power_on(&mut self, node: &str) -> Result<()> {
        let index = self
            .nodes
            .iter()
            .position(|host| host.name() == node)
            .with_context(|| format!("no machine for {node}"))?;
        self.nodes[index] = NodeHost::boot(node, &machine_roots(&self.work_dir)).await?;
        let booted = jiff::Timestamp::now();
        set_kubelet(self.client(), node, None).await?;
        self.wait_until_ready(Some((node, booted))).await
    }

    /// A new machine joins the cluster as `node`, as a node autoscaler's would: its elogind
    /// boots and its kubelet registers the Node. Returns once every DaemonSet of ours runs a
    /// Ready pod there.
    pub async fn join(&mut self, node: &str) -> Result<()> {
        self.nodes
            .push(NodeHost::boot(node, &machine_roots(&self.work_dir)).await?);
        let registered: Node = serde_json::from_value(kube_sim::populate::node(node))?;
        Api::<Node>::all(self.client().clone())
            .create(&PostParams::default(), &registered)
            .await
            .with_context(|| format!("register {node}"))?;
        let daemonsets: Api<DaemonSet> = Api::namespaced(self.client().clone(), AGENTS_NAMESPACE);
        let pods: Api<Pod> = Api::namespaced(self.client().clone(), AGENTS_NAMESPACE);
        let on_node = ListParams::default().fields(&format!("spec.nodeName={node}"));
        let ready = poll_for(READY_TIMEOUT, || async {
            let expected = daemonsets
                .list(&ListParams::default())
                .await
                .ok()?
                .items
                .len();
            let running = pods.list(&on_node).await.ok()?.items;
            let of_daemonset = |pod: &&Pod| {
                pod.metadata
                    .owner_references
                    .iter()
                    .flatten()
                    .any(|owner| owner.kind == "DaemonSet")
            };
            let ready = running
                .iter()
                .filter(of_daemonset)
                .filter(|pod| pod_ready(pod))
                .count();
            (ready == expected).then_some(())
        })
        .await;
        if ready.is_none() {
            bail!(
                "our DaemonSets' pods on {node} are not all Ready after {READY_TIMEOUT:?}:\n{}",
                pod_report(&pods, &on_node).await
            );
        }
        Ok(())
    }

    /// Stops everything: the machines, then the cluster (its pods' processes end with it).
    pub fn tear_down(mut self) {
        self.nodes.clear();
    }

    pub fn kubeconfig(&self) -> &Path {
        self.cluster.kubeconfig()
    }

    /// Runs `kubectl nodegrace <args>` with the real kubectl (the plugin found on PATH, as an
    /// operator installs it) and prints it with its output: what a newcomer reads first.
    /// Offered as a `$` command, to type again on a kept cluster.
    pub async fn nodegrace(&self, args: &[&str]) -> Result<String> {
        self.kubectl(&[&["nodegrace"], args].concat(), true).await
    }

    /// [`Self::nodegrace`] about something gone by the end (a node the demo deletes): told as
    /// run then, not offered again.
    pub async fn nodegrace_then(&self, args: &[&str]) -> Result<String> {
        self.kubectl(&[&["nodegrace"], args].concat(), false).await
    }

    /// Runs the real `kubectl <args>` and prints it with its output; `again` as
    /// [`Timeline::ran`] has it.
    pub async fn kubectl(&self, args: &[&str], again: bool) -> Result<String> {
        let path = std::env::var_os("PATH").unwrap_or_default();
        let paths = std::iter::once(self.bin_dir.clone()).chain(std::env::split_paths(&path));
        let command = format!("kubectl {}", args.join(" "));
        let output = tokio::process::Command::new("kubectl")
            .args(args)
            .env("PATH", std::env::join_paths(paths)?)
            .env("KUBECONFIG", self.kubeconfig())
            .output()
            .await
            .with_context(|| format!("run {command}"))?;
        if !output.status.success() {
            bail!(
                "{command} failed: {}",
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        let text = String::from_utf8(output.stdout)?;
        self.timeline.ran(&command, &text, again);
        Ok(text)
    }
}

async fn set_kubelet(client: &Client, node: &str, state: Option<&str>) -> Result<()> {
    Api::<Node>::all(client.clone())
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {"sim.nodegrace.io/kubelet": state}}}),
            ),
        )
        .await
        .with_context(|| format!("set {node}'s kubelet {}", state.unwrap_or("running")))?;
    Ok(())
}

pub fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|status| status.conditions.as_ref())
        .is_some_and(|conditions| {
            conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        })
}

impl Stage {
    /// Every pod of ours: phase, readiness, last log lines (printed when an act fails).
    pub async fn pods_report(&self) -> String {
        let pods: Api<Pod> = Api::namespaced(self.client().clone(), AGENTS_NAMESPACE);
        pod_report(&pods, &ListParams::default()).await
    }
}

/// When the pod last turned Ready (in seconds), if it is Ready.
fn ready_since(pod: &Pod) -> Option<i64> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready" && c.status == "True")?
        .last_transition_time
        .as_ref()
        .map(|time| time.0.as_second())
}

/// Each pod's phase, readiness and last log lines, for a failure message.
async fn pod_report(pods: &Api<Pod>, params: &ListParams) -> String {
    let Ok(listed) = pods.list(params).await else {
        return "(the pods could not be listed)".to_owned();
    };
    let mut report = String::new();
    for pod in listed.items {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let phase = pod
            .status
            .as_ref()
            .and_then(|status| status.phase.clone())
            .unwrap_or_default();
        let logs = pods
            .logs(
                &name,
                &kube::api::LogParams {
                    tail_lines: Some(15),
                    ..kube::api::LogParams::default()
                },
            )
            .await
            .unwrap_or_else(|error| format!("(no logs: {error})"));
        let _ = writeln!(
            report,
            "{name}: {phase}, ready={}; its log (kubectl -n {AGENTS_NAMESPACE} logs {name}):\n{logs}",
            pod_ready(&pod)
        );
    }
    report
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
