//! The world's and the operator's events, carried out through the API and kube-sim's `/sim/v1`
//! as kubectl, a cloud console or a fencing agent would. An event that no longer applies when
//! its time comes (its node is gone, its machine is running) is skipped, saying why.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use super::cloud::{Act, Machines};
use super::invariants::{FINALIZER, Instance, OUT_OF_SERVICE_TAINT};
use super::schedule::{Event, Numbers};
use super::setup::node_budgets;
use super::setup::{APPS, zone};
use super::sim::{Outcome, sim_call, sim_get};

const KUBELET_ANNOTATION: &str = "sim.nodegrace.io/kubelet";
const CLOCK_SKEW_ANNOTATION: &str = "sim.nodegrace.io/clock-skew-seconds";
const FENCE_ANNOTATION: &str = "nodegrace.io/fenced";
const DO_NOT_EVICT: &str = "nodegrace.io/do-not-evict";
const HOLD_FINALIZER: &str = "explore.nodegrace.io/hold";
/// How long an event keeps trying through injected API faults before it counts as failed.
const ATTEMPTS: u32 = 15;
const ATTEMPT_PAUSE: Duration = Duration::from_millis(200);

pub struct World {
    client: Client,
    machines: Machines,
    /// Each node name's machine, as last registered (for a re-registration by the same one).
    provider_ids: HashMap<String, String>,
    /// Machines whose Node an operator released by removing our finalizer by hand: nobody
    /// owes them a termination.
    released_by_hand: BTreeSet<String>,
}

impl std::fmt::Debug for World {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("World")
            .field("provider_ids", &self.provider_ids)
            .finish_non_exhaustive()
    }
}

impl World {
    /// `provider_ids`: each node's machine at the start.
    pub fn new(client: Client, machines: Machines, provider_ids: HashMap<String, String>) -> Self {
        Self {
            client,
            machines,
            provider_ids,
            released_by_hand: BTreeSet::new(),
        }
    }

    pub fn machines(&self) -> &Machines {
        &self.machines
    }

    pub fn released_by_hand(&self) -> &BTreeSet<String> {
        &self.released_by_hand
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Carries out `event`, retrying through injected faults.
    pub async fn apply(&mut self, event: &Event) -> Outcome {
        let mut last = String::new();
        for _ in 0..ATTEMPTS {
            match self.try_apply(event).await {
                Ok(outcome) => return outcome,
                Err(error) => last = format!("{error:#}"),
            }
            // Pacing retries through an injected fault, not waiting for a state.
            tokio::time::sleep(ATTEMPT_PAUSE).await;
        }
        Outcome::Failed(last)
    }

    async fn try_apply(&mut self, event: &Event) -> Result<Outcome> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), APPS);
        Ok(match event {
            Event::DeleteNodes { nodes: names } => {
                let mut done = Vec::new();
                for name in names {
                    match nodes.delete(name, &DeleteParams::default()).await {
                        Ok(_) => done.push(name.clone()),
                        Err(kube::Error::Api(status)) if status.code == 404 => {}
                        Err(error) => return Err(error.into()),
                    }
                }
                if done.is_empty() {
                    Outcome::Skipped("no such node".to_owned())
                } else {
                    Outcome::Done(format!("deleted {}", done.join(", ")))
                }
            }
            Event::ForceRemoveFinalizer { node } => {
                let Some(current) = nodes.get_opt(node).await? else {
                    return Ok(Outcome::Skipped("no such node".to_owned()));
                };
                let finalizers = current.metadata.finalizers.clone().unwrap_or_default();
                if current.metadata.deletion_timestamp.is_none()
                    || !finalizers.iter().any(|f| f == FINALIZER)
                {
                    return Ok(Outcome::Skipped(
                        "not being deleted with our finalizer".to_owned(),
                    ));
                }
                let mut updated = current.clone();
                updated.metadata.finalizers =
                    Some(finalizers.into_iter().filter(|f| f != FINALIZER).collect());
                nodes
                    .replace(node, &PostParams::default(), &updated)
                    .await?;
                if let Some(provider_id) = current.spec.and_then(|spec| spec.provider_id) {
                    self.released_by_hand.insert(provider_id);
                }
                Outcome::Done("our finalizer removed by hand".to_owned())
            }
            Event::RecreateNode { node, same_machine } => {
                if nodes.get_opt(node).await?.is_some() {
                    return Ok(Outcome::Skipped(format!("{node} exists")));
                }
                let index: usize = node
                    .trim_start_matches("node-")
                    .parse()
                    .context("node names are node-<index>")?;
                let provider_id = if *same_machine {
                    let machine = self.provider_ids.get(node).cloned().unwrap_or_default();
                    match self.instance(&machine).await? {
                        Some(instance) if instance.state != "terminated" => machine,
                        _ => return Ok(Outcome::Skipped("its machine is terminated".to_owned())),
                    }
                } else {
                    self.machines.launch(index).await?
                };
                let annotations = self.machines.node_annotations(&provider_id);
                if !register_node(&self.client, index, &provider_id, &annotations).await? {
                    return Ok(Outcome::Skipped(format!("{node} exists")));
                }
                self.provider_ids.insert(node.clone(), provider_id.clone());
                Outcome::Done(format!("registered {node} on {provider_id}"))
            }
            Event::PowerOff { node } => self.machine_act(node, Act::PowerOff).await?,
            Event::PowerOn { node } => self.machine_act(node, Act::PowerOn).await?,
            // The cloud's own act, not a client's terminate call (which invariant 1 judges).
            Event::TerminateInstance { node } => self.machine_act(node, Act::Reclaim).await?,
            Event::ProviderFault { fault } => self.machines.fault(*fault).await?,
            Event::ProviderHeal => self.machines.heal().await?,
            Event::HideMachine { node, seconds } => {
                let provider_id = self.provider_id(node).await?;
                self.machines.hide(&provider_id, *seconds)
            }
            Event::Partition { node } => {
                let Some(current) = nodes.get_opt(node).await? else {
                    return Ok(Outcome::Skipped("no such node".to_owned()));
                };
                if annotation(&current, KUBELET_ANNOTATION).is_some() {
                    return Ok(Outcome::Skipped("its kubelet is not running".to_owned()));
                }
                if has_out_of_service_taint(&current) {
                    // The operator's taint says the machine is off; cutting off a running one
                    // under it would be the operator's error, not the controller's.
                    return Ok(Outcome::Skipped("it is marked out of service".to_owned()));
                }
                annotate(&nodes, node, KUBELET_ANNOTATION, json!("partitioned")).await?;
                Outcome::Done("kubelet cut off from the API server".to_owned())
            }
            Event::Hang { node } => {
                let Some(current) = nodes.get_opt(node).await? else {
                    return Ok(Outcome::Skipped("no such node".to_owned()));
                };
                if annotation(&current, KUBELET_ANNOTATION).is_some() {
                    return Ok(Outcome::Skipped("its kubelet is not running".to_owned()));
                }
                annotate(&nodes, node, KUBELET_ANNOTATION, json!("stopped")).await?;
                Outcome::Done(
                    "the machine hung: its kubelet stopped, the cloud says running".to_owned(),
                )
            }
            Event::Heal { node } => {
                let Some(current) = nodes.get_opt(node).await? else {
                    return Ok(Outcome::Skipped("no such node".to_owned()));
                };
                if annotation(&current, KUBELET_ANNOTATION).as_deref() != Some("partitioned") {
                    return Ok(Outcome::Skipped("not partitioned".to_owned()));
                }
                annotate(&nodes, node, KUBELET_ANNOTATION, Value::Null).await?;
                Outcome::Done("kubelet reconnected".to_owned())
            }
            Event::SkewClock { node, seconds } => {
                if nodes.get_opt(node).await?.is_none() {
                    return Ok(Outcome::Skipped("no such node".to_owned()));
                }
                annotate(
                    &nodes,
                    node,
                    CLOCK_SKEW_ANNOTATION,
                    json!(seconds.to_string()),
                )
                .await?;
                Outcome::Done(format!("its clock runs {seconds} s off"))
            }
            Event::TaintOutOfService { node, time_added } => {
                let Some(current) = nodes.get_opt(node).await? else {
                    return Ok(Outcome::Skipped("no such node".to_owned()));
                };
                if !self.machine_off(&current).await? {
                    return Ok(Outcome::Skipped("its machine is running".to_owned()));
                }
                if has_out_of_service_taint(&current) {
                    return Ok(Outcome::Skipped("already tainted".to_owned()));
                }
                let mut taints = current
                    .spec
                    .as_ref()
                    .and_then(|spec| spec.taints.clone())
                    .unwrap_or_default();
                let mut taint = json!({"key": OUT_OF_SERVICE_TAINT, "value": "nodeshutdown", "effect": "NoExecute"});
                if *time_added {
                    taint["timeAdded"] = json!(now());
                }
                taints.push(serde_json::from_value(taint)?);
                replace_taints(&nodes, &current, taints).await?;
                Outcome::Done("tainted out of service".to_owned())
            }
            Event::UntaintOutOfService { node } => {
                let Some(current) = nodes.get_opt(node).await? else {
                    return Ok(Outcome::Skipped("no such node".to_owned()));
                };
                if !has_out_of_service_taint(&current) {
                    return Ok(Outcome::Skipped("not tainted".to_owned()));
                }
                let taints = current
                    .spec
                    .as_ref()
                    .and_then(|spec| spec.taints.clone())
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|taint| taint.key != OUT_OF_SERVICE_TAINT)
                    .collect();
                replace_taints(&nodes, &current, taints).await?;
                Outcome::Done("out-of-service taint removed".to_owned())
            }
            Event::Fence { node } => {
                let Some(current) = nodes.get_opt(node).await? else {
                    return Ok(Outcome::Skipped("no such node".to_owned()));
                };
                if !self.machine_off(&current).await? {
                    return Ok(Outcome::Skipped("its machine is running".to_owned()));
                }
                annotate(&nodes, node, FENCE_ANNOTATION, json!(now())).await?;
                Outcome::Done("fenced".to_owned())
            }
            Event::ApplyPdb { name, app, numbers } => {
                let budgets: Api<DynamicObject> = Api::namespaced_with(
                    self.client.clone(),
                    APPS,
                    &ApiResource::erase::<PodDisruptionBudget>(&()),
                );
                let mut spec = numbers_json(numbers);
                spec["selector"] = json!({"matchLabels": {"app": app}});
                put_budget(&budgets, name, "policy/v1", "PodDisruptionBudget", spec).await?
            }
            Event::DeletePdb { name } => {
                let budgets: Api<PodDisruptionBudget> = Api::namespaced(self.client.clone(), APPS);
                deleted(budgets.delete(name, &DeleteParams::default()).await)?
            }
            Event::ApplyNdb {
                name,
                label,
                numbers,
            } => {
                let mut spec = numbers_json(numbers);
                spec["selector"] = json!({"matchLabels": {label.0.clone(): label.1}});
                put_budget(
                    &node_budgets(&self.client),
                    name,
                    "nodegrace.io/v1alpha1",
                    "NodeDisruptionBudget",
                    spec,
                )
                .await?
            }
            Event::DeleteNdb { name } => deleted(
                node_budgets(&self.client)
                    .delete(name, &DeleteParams::default())
                    .await,
            )?,
            Event::CreateDoNotEvictPod { name, node } => {
                let extra = json!({"metadata": {"annotations": {DO_NOT_EVICT: "true"}, "labels": {"app": "pinned"}}});
                self.create_pod(&pods, name, node, extra).await?
            }
            Event::CreateFinalizerPod { name, node } => {
                let extra = json!({"metadata": {"finalizers": [HOLD_FINALIZER], "labels": {"app": "held"}}});
                self.create_pod(&pods, name, node, extra).await?
            }
            Event::DeletePod { name } => {
                deleted(pods.delete(name, &DeleteParams::default()).await)?
            }
            Event::RemovePodFinalizer { name } => {
                match pods
                    .patch(
                        name,
                        &PatchParams::default(),
                        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
                    )
                    .await
                {
                    Ok(_) => Outcome::Done("finalizer removed".to_owned()),
                    Err(kube::Error::Api(status)) if status.code == 404 => {
                        Outcome::Skipped("no such pod".to_owned())
                    }
                    Err(error) => return Err(error.into()),
                }
            }
            Event::Scale {
                deployment,
                replicas,
            } => {
                let deployments: Api<Deployment> = Api::namespaced(self.client.clone(), APPS);
                deployments
                    .patch(
                        deployment,
                        &PatchParams::default(),
                        &Patch::Merge(json!({"spec": {"replicas": replicas}})),
                    )
                    .await?;
                Outcome::Done(format!("{deployment} scaled to {replicas}"))
            }
            Event::Latency { milliseconds } => {
                self.sim(
                    "POST",
                    "/sim/v1/faults/latency",
                    json!({"milliseconds": milliseconds}),
                )
                .await?
            }
            Event::ApiErrors { rate, failure } => {
                self.sim(
                    "POST",
                    "/sim/v1/faults/errors",
                    json!({"rate": rate, "failure": failure}),
                )
                .await?
            }
            Event::CloseWatches => {
                self.sim("POST", "/sim/v1/faults/close-watches", json!({}))
                    .await?
            }
            Event::Outage { seconds } => {
                self.sim("POST", "/sim/v1/faults/outage", json!({"seconds": seconds}))
                    .await?
            }
            Event::ExpireHistory => {
                self.sim("POST", "/sim/v1/faults/expire-history", json!({}))
                    .await?
            }
            Event::ClearFaults => {
                self.machines.heal().await?;
                self.sim("DELETE", "/sim/v1/faults", Value::Null).await?
            }
            Event::KillReplica { .. }
            | Event::StartReplica { .. }
            | Event::CutReplica { .. }
            | Event::RestoreReplica { .. } => {
                return Err(anyhow!("replica events are the run's own"));
            }
        })
    }

    async fn create_pod(
        &self,
        pods: &Api<Pod>,
        name: &str,
        node: &str,
        extra: Value,
    ) -> Result<Outcome> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        if nodes.get_opt(node).await?.is_none() {
            return Ok(Outcome::Skipped("no such node".to_owned()));
        }
        let mut pod = json!({
            "metadata": {"name": name},
            "spec": {"nodeName": node, "containers": [{"name": "main", "image": "registry.example/pinned:1"}]},
        });
        json_merge(&mut pod, extra);
        match pods
            .create(&PostParams::default(), &serde_json::from_value(pod)?)
            .await
        {
            Ok(_) => Ok(Outcome::Done(format!("{name} on {node}"))),
            Err(kube::Error::Api(status)) if status.code == 409 => {
                Ok(Outcome::Skipped("exists".to_owned()))
            }
            Err(error) => Err(error.into()),
        }
    }

    /// The node's machine, by the providerID it names now; a deleted node's machine lives on
    /// (until terminated): it can be powered too.
    async fn provider_id(&self, node: &str) -> Result<String> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        Ok(match nodes.get_opt(node).await? {
            Some(current) => current
                .spec
                .and_then(|spec| spec.provider_id)
                .unwrap_or_default(),
            None => self.provider_ids.get(node).cloned().unwrap_or_default(),
        })
    }

    async fn machine_act(&self, node: &str, act: Act) -> Result<Outcome> {
        let provider_id = self.provider_id(node).await?;
        self.machines.act(&provider_id, act).await
    }

    async fn instance(&self, provider_id: &str) -> Result<Option<Instance>> {
        let instances: Vec<Instance> = serde_json::from_str(&self.get("/sim/v1/instances").await?)?;
        Ok(instances.into_iter().find(|i| i.provider_id == provider_id))
    }

    async fn machine_off(&self, node: &Node) -> Result<bool> {
        let provider_id = node
            .spec
            .as_ref()
            .and_then(|spec| spec.provider_id.clone())
            .unwrap_or_default();
        Ok(self
            .instance(&provider_id)
            .await?
            .is_some_and(|instance| instance.state != "running"))
    }

    pub async fn get(&self, path: &str) -> Result<String> {
        sim_get(&self.client, path).await
    }

    async fn sim(&self, method: &str, path: &str, body: Value) -> Result<Outcome> {
        sim_call(
            &self.client,
            method,
            path,
            (!body.is_null()).then_some(body),
        )
        .await
    }
}

/// Registers Node `node-<index>` on `provider_id` with its pool and zone labels, as its
/// kubelet would; false if a Node of that name exists.
pub async fn register_node(
    client: &Client,
    index: usize,
    provider_id: &str,
    annotations: &std::collections::BTreeMap<String, String>,
) -> Result<bool> {
    let nodes: Api<Node> = Api::all(client.clone());
    let name = super::schedule::node(index);
    let created = nodes
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": name, "annotations": annotations,
                    "labels": {"pool": "workers", "zone": zone(index), "kubernetes.io/hostname": name}},
                "spec": {"providerID": provider_id},
            }))?,
        )
        .await;
    match created {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
        Err(error) => Err(error.into()),
    }
}

/// Creates the budget, or changes an existing one to exactly `spec`'s numbers (the other
/// number removed, as an operator editing it would).
async fn put_budget(
    budgets: &Api<DynamicObject>,
    name: &str,
    api_version: &str,
    kind: &str,
    spec: Value,
) -> Result<Outcome> {
    let mut change = json!({"spec": {"minAvailable": null, "maxUnavailable": null}});
    json_merge(&mut change["spec"], spec.clone());
    match budgets
        .patch(name, &PatchParams::default(), &Patch::Merge(change))
        .await
    {
        Ok(_) => return Ok(Outcome::Done(format!("{kind} {name} changed"))),
        Err(kube::Error::Api(status)) if status.code == 404 => {}
        Err(error) => return Err(error.into()),
    }
    let object: DynamicObject = serde_json::from_value(
        json!({"apiVersion": api_version, "kind": kind, "metadata": {"name": name}, "spec": spec}),
    )?;
    budgets.create(&PostParams::default(), &object).await?;
    Ok(Outcome::Done(format!("{kind} {name} created")))
}

fn numbers_json(numbers: &Numbers) -> Value {
    let value = |text: &str| {
        text.parse::<i64>()
            .map_or_else(|_| json!(text), |number| json!(number))
    };
    let mut spec = json!({});
    if let Some(min) = &numbers.min_available {
        spec["minAvailable"] = value(min);
    }
    if let Some(max) = &numbers.max_unavailable {
        spec["maxUnavailable"] = value(max);
    }
    spec
}

fn deleted<T>(result: Result<T, kube::Error>) -> Result<Outcome> {
    match result {
        Ok(_) => Ok(Outcome::Done("deleted".to_owned())),
        Err(kube::Error::Api(status)) if status.code == 404 => {
            Ok(Outcome::Skipped("not found".to_owned()))
        }
        Err(error) => Err(error.into()),
    }
}

fn annotation(node: &Node, key: &str) -> Option<String> {
    node.metadata.annotations.as_ref()?.get(key).cloned()
}

fn has_out_of_service_taint(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|spec| spec.taints.as_ref())
        .is_some_and(|taints| taints.iter().any(|t| t.key == OUT_OF_SERVICE_TAINT))
}

async fn annotate(nodes: &Api<Node>, node: &str, key: &str, value: Value) -> Result<()> {
    nodes
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {key: value}}})),
        )
        .await?;
    Ok(())
}

/// As `kubectl taint` writes taints: the whole list, by update at the version read.
async fn replace_taints(
    nodes: &Api<Node>,
    current: &Node,
    taints: Vec<k8s_openapi::api::core::v1::Taint>,
) -> Result<()> {
    let mut updated = current.clone();
    updated.spec.get_or_insert_with(Default::default).taints = Some(taints);
    nodes
        .replace(
            current.metadata.name.as_deref().unwrap_or_default(),
            &PostParams::default(),
            &updated,
        )
        .await?;
    Ok(())
}

fn now() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

fn json_merge(target: &mut Value, patch: Value) {
    match (target, patch) {
        (Value::Object(target), Value::Object(patch)) => {
            for (key, value) in patch {
                json_merge(target.entry(key).or_insert(Value::Null), value);
            }
        }
        (target, patch) => *target = patch,
    }
}
