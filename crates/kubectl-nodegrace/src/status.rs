//! `kubectl nodegrace status`: one list of the nodes, the few Leases and budgets their rows
//! name, and the programs' workloads; then each node's rows, from [`crate::diagnose`].

use std::collections::{BTreeMap, BTreeSet};

use futures::{StreamExt, stream};
use jiff::Timestamp;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::ListParams;
use kube::{Api, Client};
use nodegrace_core::k8s::cached_node::CachedNode;
use nodegrace_core::k8s::node_shutdown::SHUTDOWN_INHIBITED_CONDITION;
use nodegrace_core::k8s::nodes::NodeFields;
use out_of_service_gc::api::{CLEANUP_CONDITION, FENCE_CONDITION, NODE_LEASE_NAMESPACE};
use out_of_service_gc::conditions::Reason as GcReason;
use termination_controller::api::NodeDisruptionBudget;

use crate::diagnose::{Facts, diagnose};
use crate::lifecycle::{API_VERSION, NodeLifecycle, Presence, Program, Status};
use crate::read::{Access, Unread, optional_get, optional_list, required_failed};

/// The label every chart puts on its workload.
const NAME_LABEL: &str = "app.kubernetes.io/name";
/// Heartbeat Leases read one by one, at most this many at once.
const CONCURRENT_READS: usize = 16;

/// What the rows of some nodes are read from.
#[derive(Debug, Default)]
pub struct Snapshot {
    pub nodes: Vec<CachedNode>,
    pub budgets: Option<Vec<NodeDisruptionBudget>>,
    /// Leases named after a node, outside kube-node-lease, by the node's name.
    pub shutdown_leases: Option<BTreeMap<String, Vec<Lease>>>,
    /// The kubelets' Leases of the nodes whose fence or cleanup a heartbeat holds.
    pub heartbeats: BTreeMap<String, Lease>,
    pub unread: Unread,
}

impl Snapshot {
    /// Reads `named` nodes (every node when empty) and what their rows name.
    pub async fn read(client: &Client, named: &[String]) -> anyhow::Result<Self> {
        let mut snapshot = Self {
            nodes: read_nodes(client, named).await?,
            ..Self::default()
        };
        snapshot.read_around(client).await?;
        Ok(snapshot)
    }

    /// Reads what the rows of `self.nodes` name beyond the nodes: only what some node needs.
    pub async fn read_around(&mut self, client: &Client) -> anyhow::Result<()> {
        let unread = &mut self.unread;
        if self
            .nodes
            .iter()
            .any(|node| node.metadata.deletion_timestamp.is_some())
        {
            self.budgets = optional_list(
                &Api::<NodeDisruptionBudget>::all(client.clone()),
                &ListParams::default(),
                &Access::list::<NodeDisruptionBudget>("at the cluster scope"),
                "termination-controller's CRDs are not installed",
                unread,
            )
            .await?;
        }
        let blocked: BTreeSet<&str> = self
            .nodes
            .iter()
            .filter(|node| has_true(node, SHUTDOWN_INHIBITED_CONDITION))
            .filter_map(|node| node.metadata.name.as_deref())
            .collect();
        if !blocked.is_empty() {
            self.shutdown_leases = shutdown_leases(client, &blocked, unread).await?;
        }
        let heartbeat_held: Vec<String> = self
            .nodes
            .iter()
            .filter(|node| held_by_heartbeat(node))
            .filter_map(|node| node.metadata.name.clone())
            .collect();
        let api = Api::<Lease>::namespaced(client.clone(), NODE_LEASE_NAMESPACE);
        let access = Access::get::<Lease>(format!("in namespace {NODE_LEASE_NAMESPACE}"));
        let reads: Vec<(String, anyhow::Result<Option<Lease>>, Unread)> =
            stream::iter(heartbeat_held)
                .map(|name| {
                    let (api, access) = (api.clone(), access.clone());
                    async move {
                        let mut unread = Unread::default();
                        let found = optional_get(&api, &name, &access, &mut unread).await;
                        (name, found, unread)
                    }
                })
                .buffer_unordered(CONCURRENT_READS)
                .collect()
                .await;
        for (name, found, not_read) in reads {
            unread.extend(not_read);
            if let Some(lease) = found? {
                self.heartbeats.insert(name, lease);
            }
        }
        Ok(())
    }

    pub fn facts(&self, node: &str, now: Timestamp) -> Facts<'_> {
        Facts {
            now,
            shutdown_leases: self
                .shutdown_leases
                .as_ref()
                .map(|leases| leases.get(node).map_or(&[][..], Vec::as_slice)),
            heartbeat: self.heartbeats.get(node),
            budgets: self.budgets.as_deref(),
        }
    }

    /// Every node's rows; a named node appears even when healthy.
    pub fn rows(&self, named: bool, now: Timestamp) -> Vec<NodeLifecycle> {
        let mut rows: Vec<NodeLifecycle> = self
            .nodes
            .iter()
            .flat_map(|node| {
                let name = node.metadata.name.as_deref().unwrap_or_default();
                diagnose(node, &self.facts(name, now), named)
            })
            .collect();
        rows.sort_by(|a, b| (&a.node, a.program).cmp(&(&b.node, b.program)));
        rows
    }
}

fn has_true(node: &CachedNode, type_: &str) -> bool {
    node.conditions()
        .iter()
        .any(|condition| condition.type_ == type_ && condition.status == "True")
}

/// Whether a guard on the kubelet's heartbeat holds the node's fence or cleanup: its Lease
/// says since when the kubelet is silent.
fn held_by_heartbeat(node: &CachedNode) -> bool {
    node.conditions().iter().any(|condition| {
        let reason = condition.reason.as_deref();
        (condition.type_ == FENCE_CONDITION
            && reason == Some(GcReason::FenceHeldHeartbeat.as_str()))
            || (condition.type_ == CLEANUP_CONDITION && reason == Some(GcReason::Refused.as_str()))
    })
}

async fn read_nodes(client: &Client, named: &[String]) -> anyhow::Result<Vec<CachedNode>> {
    let api = Api::<CachedNode>::all(client.clone());
    if named.is_empty() {
        let access = Access::list::<CachedNode>("at the cluster scope");
        return api
            .list(&ListParams::default())
            .await
            .map(|list| list.items)
            .map_err(|error| required_failed(&access, error));
    }
    let mut nodes = Vec::new();
    for name in named {
        let access = Access::get::<CachedNode>(format!("named {name}"));
        match api.get_opt(name).await {
            Ok(Some(node)) => nodes.push(node),
            Ok(None) => anyhow::bail!("node {name} not found (`kubectl get nodes` lists them)"),
            Err(error) => return Err(required_failed(&access, error)),
        }
    }
    Ok(nodes)
}

/// The Leases named after the `blocked` nodes, outside kube-node-lease: by name for a few
/// nodes, one list for many.
async fn shutdown_leases(
    client: &Client,
    blocked: &BTreeSet<&str>,
    unread: &mut Unread,
) -> anyhow::Result<Option<BTreeMap<String, Vec<Lease>>>> {
    let api = Api::<Lease>::all(client.clone());
    let access = Access::list::<Lease>("in all namespaces");
    let outside = format!("metadata.namespace!={NODE_LEASE_NAMESPACE}");
    let selectors: Vec<String> = if blocked.len() <= CONCURRENT_READS {
        blocked
            .iter()
            .map(|name| format!("metadata.name={name},{outside}"))
            .collect()
    } else {
        vec![outside]
    };
    let mut found: BTreeMap<String, Vec<Lease>> = BTreeMap::new();
    for selector in selectors {
        let params = ListParams::default().fields(&selector);
        let Some(leases) = optional_list(&api, &params, &access, "", unread).await? else {
            return Ok(None);
        };
        for lease in leases {
            let name = lease.metadata.name.clone().unwrap_or_default();
            if blocked.contains(name.as_str()) {
                found.entry(name).or_default().push(lease);
            }
        }
    }
    Ok(Some(found))
}

/// The workloads of kind `K` (Deployments, DaemonSets) that `programs`' charts install, in
/// every namespace; `None` when they may not be read.
pub async fn chart_workloads<K>(
    client: &Client,
    programs: &[Program],
    unread: &mut Unread,
) -> anyhow::Result<Option<Vec<K>>>
where
    K: kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let names: Vec<&str> = programs.iter().map(|program| program.name()).collect();
    let params = ListParams::default().labels(&format!("{NAME_LABEL} in ({})", names.join(",")));
    optional_list(
        &Api::<K>::all(client.clone()),
        &params,
        &Access::list::<K>("in all namespaces"),
        "",
        unread,
    )
    .await
}

/// Which programs are installed, by their charts' workloads.
pub async fn presence(client: &Client, unread: &mut Unread) -> anyhow::Result<Vec<Presence>> {
    let deployments = chart_workloads::<Deployment>(client, &Program::ALL, unread).await?;
    let daemonsets = chart_workloads::<DaemonSet>(client, &Program::ALL, unread).await?;
    let found = |kind: &str, meta: &kube::api::ObjectMeta| {
        let program = meta.labels.as_ref()?.get(NAME_LABEL)?.clone();
        Some((
            program,
            format!(
                "{kind} {}/{}",
                meta.namespace.as_deref().unwrap_or_default(),
                meta.name.as_deref().unwrap_or_default()
            ),
        ))
    };
    let mut seen: Vec<(String, String)> = Vec::new();
    seen.extend(
        deployments
            .iter()
            .flatten()
            .filter_map(|d| found("Deployment", &d.metadata)),
    );
    seen.extend(
        daemonsets
            .iter()
            .flatten()
            .filter_map(|d| found("DaemonSet", &d.metadata)),
    );
    let known = deployments.is_some() && daemonsets.is_some();
    Ok(Program::ALL
        .into_iter()
        .map(|program| {
            let found: Vec<String> = seen
                .iter()
                .filter(|(name, _)| name == program.name())
                .map(|(_, at)| at.clone())
                .collect();
            Presence {
                program,
                installed: if found.is_empty() && !known {
                    None
                } else {
                    Some(!found.is_empty())
                },
                found,
            }
        })
        .collect())
}

/// `kubectl nodegrace status [NODE…]`.
pub async fn status(client: &Client, named: &[String]) -> anyhow::Result<Status> {
    let mut snapshot = Snapshot::read(client, named).await?;
    let now = Timestamp::now();
    let programs = presence(client, &mut snapshot.unread).await?;
    Ok(Status {
        api_version: API_VERSION,
        kind: "NodeLifecycleStatus",
        observed_at: now,
        nodes: snapshot.rows(!named.is_empty(), now),
        programs,
        unread: snapshot.unread.0,
    })
}
