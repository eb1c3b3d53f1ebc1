//! `termination-controller plan --node X`: what draining a node would do, read from the cluster
//! and changing nothing. It uses the drain's own rules (tiers, do-not-evict, per-PDB queues,
//! NodeDisruptionBudget grants), so what it prints is what the controller does.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::lifecycle::v1alpha1::Eviction;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::ListParams;
use kube::{Api, Client};
use nodegrace_controller::InstanceProviderKind;
use nodegrace_controller::instances::cluster_api::{MACHINE_ANNOTATION, NAMESPACE_ANNOTATION};
use nodegrace_core::k8s::api_errors::status_code;
use nodegrace_core::k8s::cached_node::CachedNode;
use nodegrace_core::k8s::selectors::pdbs_for_pod;
use serde::Serialize;

use crate::api::{FINALIZER, NodeDisruptionBudget, NodeDrainRule};
use crate::drain_rules::{NO_LABELS, NodeRules, Source};
use crate::explain::never_allows;
use crate::grants::verdict;
use crate::hooks::{self, Stage};
use crate::queues::QueueKey;
use crate::tiers::{Disposition, Skip, Tier, disposition};
use crate::waits::Verdict;

/// Everything a plan is made from.
#[derive(Debug, Clone)]
pub struct Cluster {
    pub node: CachedNode,
    pub pods_on_node: Vec<Pod>,
    /// Pods of the namespaces the node's pods are in: a budget's other pods tell how long a
    /// replacement takes to become Ready.
    pub namespace_pods: Vec<Pod>,
    pub pdbs: Vec<PodDisruptionBudget>,
    pub ndbs: Vec<Arc<NodeDisruptionBudget>>,
    pub nodes: Vec<Arc<CachedNode>>,
    pub drain_rules: Vec<Arc<NodeDrainRule>>,
    /// The labels of the namespaces the node's pods are in.
    pub namespace_labels: BTreeMap<String, BTreeMap<String, String>>,
    /// The Evictions of pods this controller requested (`--eviction-api=eviction-request`);
    /// none where the cluster does not serve the EvictionRequest API.
    pub evictions: Vec<Eviction>,
}

/// Reads what a plan for `node` needs.
pub async fn gather(client: &Client, node: &str) -> anyhow::Result<Cluster> {
    let nodes_api: Api<CachedNode> = Api::all(client.clone());
    let Some(found) = nodes_api
        .get_opt(node)
        .await
        .with_context(|| format!("read node {node}"))?
    else {
        anyhow::bail!("node {node} not found (kubectl get nodes lists them)");
    };
    let pods_on_node = Api::<Pod>::all(client.clone())
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await
        .context("list the node's pods")?
        .items;
    let namespaces: BTreeSet<String> = pods_on_node
        .iter()
        .filter_map(|pod| pod.metadata.namespace.clone())
        .collect();
    let mut namespace_pods = Vec::new();
    let mut namespace_labels = BTreeMap::new();
    for namespace in namespaces {
        let found = Api::<Namespace>::all(client.clone())
            .get_opt(&namespace)
            .await
            .with_context(|| format!("read namespace {namespace}"))?;
        namespace_labels.insert(
            namespace.clone(),
            found
                .and_then(|found| found.metadata.labels)
                .unwrap_or_default(),
        );
        namespace_pods.extend(
            Api::<Pod>::namespaced(client.clone(), &namespace)
                .list(&ListParams::default())
                .await
                .with_context(|| format!("list the pods of namespace {namespace}"))?
                .items,
        );
    }
    let pdbs = Api::<PodDisruptionBudget>::all(client.clone())
        .list(&ListParams::default())
        .await
        .context("list PodDisruptionBudgets")?
        .items;
    let ndbs = match Api::<NodeDisruptionBudget>::all(client.clone())
        .list(&ListParams::default())
        .await
    {
        Ok(list) => list.items.into_iter().map(Arc::new).collect(),
        // The CRD is not installed: no NodeDisruptionBudgets.
        Err(error) if status_code(&error) == Some(404) => Vec::new(),
        Err(error) => return Err(error).context("list NodeDisruptionBudgets"),
    };
    let drain_rules = match Api::<NodeDrainRule>::all(client.clone())
        .list(&ListParams::default())
        .await
    {
        Ok(list) => list.items.into_iter().map(Arc::new).collect(),
        // The CRD is not installed: no NodeDrainRules.
        Err(error) if status_code(&error) == Some(404) => Vec::new(),
        Err(error) => return Err(error).context("list NodeDrainRules"),
    };
    let nodes = nodes_api
        .list(&ListParams::default())
        .await
        .context("list nodes")?
        .items
        .into_iter()
        .map(Arc::new)
        .collect();
    let evictions = if crate::handover::served(client).await {
        Api::<Eviction>::all(client.clone())
            .list(&ListParams::default().labels(crate::handover::REQUESTER))
            .await
            .context("list Evictions (lifecycle.k8s.io)")?
            .items
    } else {
        Vec::new()
    };
    Ok(Cluster {
        evictions,
        node: found,
        pods_on_node,
        namespace_pods,
        pdbs,
        ndbs,
        nodes,
        drain_rules,
        namespace_labels,
    })
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Plan {
    pub node: String,
    /// Whether the node carries the controller's finalizer (without it, a deletion is not
    /// held and nothing below happens).
    pub held_by_finalizer: bool,
    pub node_disruption_budgets: NdbVerdict,
    /// Hooks on the node that hold it before its cordon (`pre-drain.nodegrace.io/<name>`) and
    /// before its machine goes (`pre-terminate.nodegrace.io/<name>`), by name.
    pub pre_drain_hooks: Vec<String>,
    pub pre_terminate_hooks: Vec<String>,
    /// Pods with `nodegrace.io/do-not-evict`: no eviction starts while one is there.
    pub blockers: Vec<Blocker>,
    /// Pods the drain waits for without evicting them (NodeDrainRule WaitCompleted, or their
    /// own `nodegrace.io/drain: wait-completed`), each at the end of its tier.
    pub wait_completed: Vec<Stuck>,
    pub tiers: Vec<PlannedTier>,
    /// Pods no budget will ever let go, and why: the drain waits on them forever (or until
    /// `--drain-timeout`).
    pub never_evictable: Vec<Stuck>,
    /// Pods the drain leaves alone, and why.
    pub left_alone: Vec<Stuck>,
    /// NodeDrainRules that cannot be read (they apply to no pod).
    pub invalid_drain_rules: Vec<Stuck>,
    pub estimate: Estimate,
    /// What happens to the node's machine once it is drained.
    pub machine: MachineEnd,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MachineEnd {
    /// The instance provider named by `--instance-provider`.
    pub provider: String,
    #[serde(rename = "providerID")]
    pub provider_id: Option<String>,
    pub outcome: String,
}

/// What the controller, run with `provider`, does with `node`'s machine.
pub fn machine_end(node: &CachedNode, provider: InstanceProviderKind) -> MachineEnd {
    let provider_id = node
        .spec
        .as_ref()
        .and_then(|spec| spec.provider_id.clone())
        .filter(|id| !id.trim().is_empty());
    let annotation = |key: &str| {
        node.metadata
            .annotations
            .as_ref()
            .and_then(|notes| notes.get(key).cloned())
    };
    let name = match provider {
        InstanceProviderKind::None => "none",
        InstanceProviderKind::Sim => "sim",
        InstanceProviderKind::Exec => "exec",
        InstanceProviderKind::Aws => "aws",
        InstanceProviderKind::ClusterApi => "cluster-api",
        InstanceProviderKind::Redfish => "redfish",
    };
    let outcome = match (provider, &provider_id) {
        (InstanceProviderKind::None, _) => {
            "none: only the Node goes; the machine keeps running".to_owned()
        }
        (_, None) => "held with a Warning: the node has no spec.providerID".to_owned(),
        (InstanceProviderKind::Aws, Some(_)) => {
            "TerminateInstances, then DescribeInstances until terminated".to_owned()
        }
        (InstanceProviderKind::ClusterApi, Some(_)) => {
            match (
                annotation(MACHINE_ANNOTATION),
                annotation(NAMESPACE_ANNOTATION),
            ) {
                (Some(machine), Some(namespace)) => format!(
                    "Machine {namespace}/{machine} deleted by UID; Cluster API removes the \
                     infrastructure, then the Machine"
                ),
                _ => format!(
                    "held with a Warning: no {MACHINE_ANNOTATION} and {NAMESPACE_ANNOTATION} \
                     annotations"
                ),
            }
        }
        (InstanceProviderKind::Redfish, Some(_)) => {
            "powered off (ForceOff) through its BMC and left off".to_owned()
        }
        (InstanceProviderKind::Exec, Some(_)) => {
            "`<command> terminate`, then `<command> state` until terminated".to_owned()
        }
        (InstanceProviderKind::Sim, Some(_)) => "terminated by kube-sim's cloud".to_owned(),
    };
    MachineEnd {
        provider: name.to_owned(),
        provider_id,
        outcome,
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NdbVerdict {
    pub granted: bool,
    /// The budgets covering the node (granted ones, or up to the one it waits on).
    pub budgets: Vec<String>,
    pub message: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Blocker {
    pub pod: String,
    /// When the protection ends; `None`: never (until the pod goes).
    pub until: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PlannedTier {
    pub tier: &'static str,
    /// The drain rules' order within the tier: a lower order is gone before a higher one
    /// starts.
    pub order: i32,
    pub pods: Vec<PlannedPod>,
    /// Minimum seconds this tier takes, from its slowest budget chain; `None`: never ends.
    pub min_seconds: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PlannedPod {
    pub pod: String,
    /// The eviction queue: `namespace/pdb`, or `none` (evicted in parallel).
    pub queue: String,
    pub budget: Option<BudgetNumbers>,
    /// The NodeDrainRule (or the pod's own `nodegrace.io/drain`) it follows; `None`: none.
    pub rule: Option<String>,
    /// Who holds it, when the drain handed it to its eviction responders: the active
    /// responder, its message and expected completion, those passed over.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub responder: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BudgetNumbers {
    pub current_healthy: i32,
    pub desired_healthy: i32,
    pub expected_pods: i32,
    pub disruptions_allowed: i32,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Stuck {
    pub pod: String,
    pub why: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Estimate {
    /// The least time the evictions take; `None` when a pod can never go.
    pub min_drain_seconds: Option<f64>,
    pub basis: String,
}

fn pod_name(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

/// How long one of `pdb`'s pods took from start to Ready: the median over its Ready pods.
fn startup(pdb: &PodDisruptionBudget, pods: &[Pod]) -> Option<Duration> {
    let mut spans: Vec<Duration> = pods_of(pdb, pods)
        .filter_map(|pod| {
            let status = pod.status.as_ref()?;
            let started = status.start_time.as_ref()?.0;
            let ready = status
                .conditions
                .iter()
                .flatten()
                .find(|condition| condition.type_ == "Ready" && condition.status == "True")?;
            let at = ready.last_transition_time.as_ref()?.0;
            Duration::try_from(at.duration_since(started)).ok()
        })
        .collect();
    spans.sort();
    spans.get(spans.len() / 2).copied()
}

/// The pods `pdb` selects.
fn pods_of<'a>(pdb: &'a PodDisruptionBudget, pods: &'a [Pod]) -> impl Iterator<Item = &'a Pod> {
    pods.iter()
        .filter(move |pod| !pdbs_for_pod(pod, std::iter::once(pdb)).is_empty())
}

/// The plan for `cluster.node` at `now`.
pub fn plan(cluster: &Cluster, provider: InstanceProviderKind, now: Timestamp) -> Plan {
    let held_by_finalizer = cluster
        .node
        .metadata
        .finalizers
        .iter()
        .flatten()
        .any(|finalizer| finalizer == FINALIZER);
    let node_disruption_budgets = ndb_verdict(cluster, now);
    let rules = NodeRules::for_node(
        &cluster.drain_rules,
        cluster.node.metadata.labels.as_ref().unwrap_or(&NO_LABELS),
    );
    let invalid_drain_rules = rules
        .invalid
        .iter()
        .map(|(name, error)| Stuck {
            pod: name.clone(),
            why: format!("a selector cannot be read ({error}); the rule applies to no pod"),
        })
        .collect();
    let sorted = sort_pods(cluster, &rules, now);
    let mut never_evictable = Vec::new();
    let mut unmeasured = BTreeSet::new();
    let tiers: Vec<PlannedTier> = sorted
        .by_tier
        .into_iter()
        .map(|((tier, order), pods)| {
            plan_tier(
                cluster,
                (tier, order),
                pods,
                &mut never_evictable,
                &mut unmeasured,
            )
        })
        .collect();
    let total = tiers.iter().try_fold(0.0, |sum, tier| {
        tier.min_seconds.map(|seconds| sum + seconds)
    });
    let basis = estimate_basis(
        &unmeasured,
        !sorted.blockers.is_empty(),
        node_disruption_budgets.granted,
        !sorted.wait_completed.is_empty(),
    );
    Plan {
        node: cluster.node.metadata.name.clone().unwrap_or_default(),
        held_by_finalizer,
        node_disruption_budgets,
        pre_drain_hooks: hooks::pending(&cluster.node, Stage::PreDrain),
        pre_terminate_hooks: hooks::pending(&cluster.node, Stage::PreTerminate),
        blockers: sorted.blockers,
        wait_completed: sorted.wait_completed,
        tiers,
        never_evictable,
        left_alone: sorted.left_alone,
        invalid_drain_rules,
        estimate: Estimate {
            min_drain_seconds: total,
            basis,
        },
        machine: machine_end(&cluster.node, provider),
    }
}

fn ndb_verdict(cluster: &Cluster, now: Timestamp) -> NdbVerdict {
    match verdict(&cluster.ndbs, &cluster.nodes, &cluster.node, now) {
        Verdict::Granted { budgets } if budgets.is_empty() => NdbVerdict {
            granted: true,
            budgets,
            message: "no NodeDisruptionBudget covers this node".to_owned(),
        },
        Verdict::Granted { budgets } => NdbVerdict {
            granted: true,
            message: format!("allowed now by {}", budgets.join(", ")),
            budgets,
        },
        Verdict::Waiting { budget, refusal } => NdbVerdict {
            granted: false,
            message: format!("waits for NodeDisruptionBudget {budget}: {refusal}"),
            budgets: vec![budget],
        },
    }
}

/// The node's pods as the drain would take them.
#[derive(Default)]
struct SortedPods<'a> {
    blockers: Vec<Blocker>,
    left_alone: Vec<Stuck>,
    wait_completed: Vec<Stuck>,
    by_tier: BTreeMap<(Tier, i32), Vec<(&'a Pod, Source)>>,
}

fn sort_pods<'a>(cluster: &'a Cluster, rules: &NodeRules, now: Timestamp) -> SortedPods<'a> {
    let mut sorted = SortedPods::default();
    let mut pods: Vec<&Pod> = cluster.pods_on_node.iter().collect();
    pods.sort_by_key(|pod| pod_name(pod));
    for pod in pods {
        let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
        let labels = cluster
            .namespace_labels
            .get(namespace)
            .unwrap_or(&NO_LABELS);
        let rule = rules.applied(pod, labels);
        match disposition(pod, now, &rule) {
            Disposition::Skip(skip) => sorted.left_alone.push(Stuck {
                pod: pod_name(pod),
                why: match skip {
                    Skip::Mirror => "a static pod's mirror: it goes with the machine".to_owned(),
                    Skip::Terminal => "already finished".to_owned(),
                    Skip::ToleratesDisruption => {
                        "tolerates nodegrace.io/disrupted: it goes with the machine".to_owned()
                    }
                    Skip::Rule => format!("{}: Skip; it goes with the machine", rule.source),
                },
            }),
            Disposition::WaitCompleted(tier) => sorted.wait_completed.push(Stuck {
                pod: pod_name(pod),
                why: format!(
                    "{}: WaitCompleted; never evicted, the drain waits for it to finish before \
                     the tier after {}",
                    rule.source,
                    tier.label()
                ),
            }),
            Disposition::DoNotEvict { until } => sorted.blockers.push(Blocker {
                pod: pod_name(pod),
                until: until.map(|until| until.to_string()),
            }),
            Disposition::Evict { tier, order } => sorted
                .by_tier
                .entry((tier, order))
                .or_default()
                .push((pod, rule.source)),
        }
    }
    sorted
}

/// One tier: its pods with their queues and budgets, those that can never be evicted, and
/// the least time its budgets allow (`None` when a pod of it can never go).
/// Who holds `pod`, if this controller handed it to its eviction responders.
fn handed_to(cluster: &Cluster, pod: &Pod) -> Option<String> {
    let uid = pod.metadata.uid.as_deref()?;
    cluster
        .evictions
        .iter()
        .filter(|eviction| {
            eviction.metadata.namespace == pod.metadata.namespace
                && eviction
                    .spec
                    .target
                    .pod
                    .as_ref()
                    .map(|target| target.uid.as_str())
                    == Some(uid)
        })
        .max_by_key(|eviction| {
            eviction
                .metadata
                .creation_timestamp
                .clone()
                .map(|time| time.0)
        })
        .map(|eviction| crate::handover::Holder::of(eviction).describe())
}

fn plan_tier(
    cluster: &Cluster,
    (tier, order): (Tier, i32),
    pods: Vec<(&Pod, Source)>,
    never_evictable: &mut Vec<Stuck>,
    unmeasured: &mut BTreeSet<String>,
) -> PlannedTier {
    // Per queue: the pods of this node in it, and its budget.
    let mut queues: BTreeMap<QueueKey, (usize, Option<&PodDisruptionBudget>)> = BTreeMap::new();
    let mut planned = Vec::new();
    let mut stuck = false;
    for (pod, source) in pods {
        let covering = pdbs_for_pod(pod, &cluster.pdbs);
        let key = QueueKey::of(pod, &covering);
        let pdb = (covering.len() == 1).then(|| covering[0]);
        if let Some(why) = never_evicted(&covering, &key) {
            stuck = true;
            never_evictable.push(Stuck {
                pod: pod_name(pod),
                why,
            });
        }
        planned.push(PlannedPod {
            pod: pod_name(pod),
            queue: key.label(),
            budget: pdb
                .and_then(|pdb| pdb.status.as_ref())
                .map(|status| BudgetNumbers {
                    current_healthy: status.current_healthy.unwrap_or(0),
                    desired_healthy: status.desired_healthy.unwrap_or(0),
                    expected_pods: status.expected_pods.unwrap_or(0),
                    disruptions_allowed: status.disruptions_allowed.unwrap_or(0),
                }),
            rule: (source != Source::Default).then(|| source.to_string()),
            responder: handed_to(cluster, pod),
        });
        queues.entry(key).or_insert((0, pdb)).0 += 1;
    }
    let min_seconds = (!stuck).then(|| {
        let mut slowest: f64 = 0.0;
        for (key, (count, pdb)) in &queues {
            let Some(pdb) = pdb else { continue };
            let allowed = pdb
                .status
                .as_ref()
                .and_then(|s| s.disruptions_allowed)
                .unwrap_or(0);
            let beyond = count.saturating_sub(usize::try_from(allowed).unwrap_or(0));
            if beyond == 0 {
                continue;
            }
            let seconds = if let Some(span) = startup(pdb, &cluster.namespace_pods) {
                span.as_secs_f64()
            } else {
                unmeasured.insert(key.label());
                0.0
            };
            slowest = slowest.max(beyond as f64 * seconds);
        }
        slowest
    });
    PlannedTier {
        tier: tier.label(),
        order,
        pods: planned,
        min_seconds,
    }
}

/// Why a pod with these budgets can never be evicted, if it cannot.
fn never_evicted(covering: &[&PodDisruptionBudget], key: &QueueKey) -> Option<String> {
    match covering {
        [] => None,
        [pdb] => never_allows(pdb).map(|why| {
            format!(
                "PDB {}/{} can never allow a disruption: {why}",
                pdb.metadata.namespace.as_deref().unwrap_or_default(),
                pdb.metadata.name.as_deref().unwrap_or_default()
            )
        }),
        several => Some(format!(
            "{} PodDisruptionBudgets cover it ({}); the Eviction API refuses such pods",
            several.len(),
            key.label()
        )),
    }
}

/// How the estimate was made, and what it leaves out.
fn estimate_basis(
    unmeasured: &BTreeSet<String>,
    blocked: bool,
    granted: bool,
    waits_for_pods: bool,
) -> String {
    let mut basis = "tiers one after another; in each, budgets in parallel, each eviction past \
                     a budget's allowance waiting for one replacement to become Ready (its pods' \
                     median start-to-Ready time)"
        .to_owned();
    if !unmeasured.is_empty() {
        let _ = write!(
            basis,
            "; no Ready pod to measure for {}, counted as 0 s",
            unmeasured
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    if blocked {
        basis.push_str("; not before the do-not-evict pods are gone");
    }
    if !granted {
        basis.push_str("; not before the NodeDisruptionBudgets grant the node");
    }
    if waits_for_pods {
        basis.push_str("; not before the pods waited for have finished");
    }
    basis
}

impl Plan {
    /// The human table `plan` prints by default.
    pub fn table(&self) -> String {
        let mut out = self.head();
        let _ = writeln!(out);
        out.push_str(&self.pods_table());
        self.lists_and_estimate(&mut out);
        out
    }

    /// The node, its budgets, its machine, its hooks and its blockers.
    fn head(&self) -> String {
        let mut out = String::new();
        let yes_no = if self.held_by_finalizer { "yes" } else { "no" };
        let _ = writeln!(out, "Node:                    {}", self.node);
        let _ = writeln!(out, "Held by {FINALIZER}: {yes_no}");
        let _ = writeln!(
            out,
            "NodeDisruptionBudgets:   {}",
            self.node_disruption_budgets.message
        );
        let _ = writeln!(
            out,
            "Machine:                 {} (instance provider {}): {}",
            self.machine
                .provider_id
                .as_deref()
                .unwrap_or("(no spec.providerID)"),
            self.machine.provider,
            self.machine.outcome
        );
        for (stage, hooks) in [
            ("Pre-drain hooks:        ", &self.pre_drain_hooks),
            ("Pre-terminate hooks:    ", &self.pre_terminate_hooks),
        ] {
            let listed = if hooks.is_empty() {
                "none".to_owned()
            } else {
                format!(
                    "{} (each holds the node until its annotation goes)",
                    hooks.join(", ")
                )
            };
            let _ = writeln!(out, "{stage} {listed}");
        }
        if self.blockers.is_empty() {
            let _ = writeln!(out, "Do-not-evict blockers:   none");
        } else {
            let _ = writeln!(
                out,
                "Do-not-evict blockers:   (no eviction starts while one is there)"
            );
            for blocker in &self.blockers {
                let until = blocker.until.as_deref().unwrap_or("until it is gone");
                let _ = writeln!(out, "  {}  {until}", blocker.pod);
            }
        }
        out
    }

    /// One row per pod to evict, tier by tier, in columns.
    fn pods_table(&self) -> String {
        let mut out = String::new();
        let rows: Vec<[String; 6]> = self
            .tiers
            .iter()
            .enumerate()
            .flat_map(|(index, tier)| {
                tier.pods.iter().map(move |pod| {
                    let numbers = pod.budget.as_ref().map_or_else(
                        || "-".to_owned(),
                        |b| {
                            format!(
                                "{}/{}/{}",
                                b.current_healthy, b.desired_healthy, b.expected_pods
                            )
                        },
                    );
                    let allowed = pod
                        .budget
                        .as_ref()
                        .map_or_else(|| "-".to_owned(), |b| b.disruptions_allowed.to_string());
                    let order = if tier.order == 0 {
                        String::new()
                    } else {
                        format!(" (order {})", tier.order)
                    };
                    [
                        format!("{} {}{order}", index + 1, tier.tier),
                        pod.pod.clone(),
                        pod.queue.clone(),
                        numbers,
                        allowed,
                        pod.rule.clone().unwrap_or_else(|| "-".to_owned()),
                    ]
                })
            })
            .collect();
        let header = [
            "TIER".to_owned(),
            "POD".to_owned(),
            "QUEUE (PDB)".to_owned(),
            "HEALTHY/DESIRED/EXPECTED".to_owned(),
            "ALLOWED".to_owned(),
            "RULE".to_owned(),
        ];
        let mut widths = header.clone().map(|cell| cell.chars().count());
        for row in &rows {
            for (width, cell) in widths.iter_mut().zip(row) {
                *width = (*width).max(cell.chars().count());
            }
        }
        if rows.is_empty() {
            let _ = writeln!(out, "No pods to evict.");
        } else {
            for row in std::iter::once(&header).chain(&rows) {
                let line: Vec<String> = row
                    .iter()
                    .zip(widths)
                    .map(|(cell, width)| format!("{cell:<width$}"))
                    .collect();
                let _ = writeln!(out, "{}", line.join("  ").trim_end());
            }
        }
        out
    }

    /// The pods waited for, never evictable and left alone, then the estimate.
    fn lists_and_estimate(&self, out: &mut String) {
        let handed: Vec<&PlannedPod> = self
            .tiers
            .iter()
            .flat_map(|tier| &tier.pods)
            .filter(|pod| pod.responder.is_some())
            .collect();
        if !handed.is_empty() {
            let _ = writeln!(
                out,
                "\nHanded to their eviction responders (EvictionRequests):"
            );
            for pod in handed {
                let _ = writeln!(
                    out,
                    "  {}: {}",
                    pod.pod,
                    pod.responder.as_deref().unwrap_or_default()
                );
            }
        }
        for (title, list) in [
            ("Waited for, never evicted", &self.wait_completed),
            ("Never evictable", &self.never_evictable),
            ("Left alone", &self.left_alone),
            (
                "NodeDrainRules that cannot be read",
                &self.invalid_drain_rules,
            ),
        ] {
            if !list.is_empty() {
                let _ = writeln!(out, "\n{title}:");
                for stuck in list {
                    let _ = writeln!(out, "  {}: {}", stuck.pod, stuck.why);
                }
            }
        }
        let estimate = self
            .estimate
            .min_drain_seconds
            .map_or_else(|| "never (see above)".to_owned(), |s| format!("{s:.1}s"));
        let _ = writeln!(
            out,
            "\nEstimated minimum drain time: {estimate}\n  ({})",
            self.estimate.basis
        );
    }
}

#[cfg(test)]
mod machine_tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_plan_names_the_provider_and_what_happens_to_the_machine() {
        let node: CachedNode = serde_json::from_value(json!({
            "metadata": {"name": "n1", "annotations": {
                "cluster.x-k8s.io/machine": "workers-7",
                "cluster.x-k8s.io/cluster-namespace": "capi",
            }},
            "spec": {"providerID": "aws:///eu-west-1a/i-0123456789abcdef0"},
        }))
        .unwrap();
        let aws = machine_end(&node, InstanceProviderKind::Aws);
        assert_eq!(aws.provider, "aws");
        assert_eq!(
            aws.provider_id.as_deref(),
            Some("aws:///eu-west-1a/i-0123456789abcdef0")
        );
        assert!(
            aws.outcome.contains("TerminateInstances"),
            "{}",
            aws.outcome
        );
        let capi = machine_end(&node, InstanceProviderKind::ClusterApi).outcome;
        assert!(capi.starts_with("Machine capi/workers-7 deleted"), "{capi}");
        let redfish = machine_end(&node, InstanceProviderKind::Redfish).outcome;
        assert!(redfish.contains("ForceOff"), "{redfish}");
        let bare: CachedNode = serde_json::from_value(json!({"metadata": {"name": "n2"}})).unwrap();
        let held = machine_end(&bare, InstanceProviderKind::Aws).outcome;
        assert!(held.contains("no spec.providerID"), "{held}");
    }
}
