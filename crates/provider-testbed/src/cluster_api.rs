//! Cluster API's side, for the `cluster-api` provider's tests: the Machine CRD
//! (`cluster.x-k8s.io/v1beta2`, written from the upstream schema's required fields) and a small
//! machine controller that deletes as upstream's does: pre-drain hooks, the drain unless
//! excluded, the volume wait unless excluded, pre-terminate hooks, the infrastructure, the
//! workload cluster's Node, and only then its own finalizer.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::Result;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio::task::JoinHandle;

use nodegrace_controller::instances::cluster_api::{
    EXCLUDE_DRAINING, EXCLUDE_VOLUME_WAIT, machine_resource, machine_resource_in,
};

pub const FINALIZER: &str = "machine.cluster.x-k8s.io";
const PRE_DRAIN: &str = "pre-drain.delete.hook.machine.cluster.x-k8s.io";
const PRE_TERMINATE: &str = "pre-terminate.delete.hook.machine.cluster.x-k8s.io";

/// The Machine CRD, v1beta2 only: the spec's required fields as upstream has them
/// (`clusterName`, `bootstrap`, `infrastructureRef` with `apiGroup`, `kind`, `name`), the rest
/// kept as sent.
pub fn machine_crd() -> CustomResourceDefinition {
    machine_crd_serving(&["v1beta2"])
}

/// The Machine CRD serving `versions` (the first one stored), with v1beta2's schema in each:
/// the fields the provider reads are the same in v1beta1, which Cluster API before v1.11
/// serves alone.
pub fn machine_crd_serving(versions: &[&str]) -> CustomResourceDefinition {
    let reference = json!({
        "type": "object",
        "required": ["apiGroup", "kind", "name"],
        "properties": {
            "apiGroup": {"type": "string", "minLength": 1},
            "kind": {"type": "string", "minLength": 1},
            "name": {"type": "string", "minLength": 1},
        },
    });
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "machines.cluster.x-k8s.io"},
        "spec": {
            "group": "cluster.x-k8s.io",
            "scope": "Namespaced",
            "names": {"kind": "Machine", "listKind": "MachineList", "plural": "machines", "singular": "machine", "shortNames": ["ma"]},
            "versions": versions.iter().enumerate().map(|(n, version)| json!({
                "name": version, "served": true, "storage": n == 0,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "properties": {
                        "spec": {
                            "type": "object",
                            "required": ["clusterName", "bootstrap", "infrastructureRef"],
                            "properties": {
                                "clusterName": {"type": "string", "minLength": 1},
                                "bootstrap": {"type": "object", "properties": {
                                    "configRef": reference.clone(),
                                    "dataSecretName": {"type": "string"},
                                }},
                                "infrastructureRef": reference.clone(),
                                "providerID": {"type": "string"},
                                "version": {"type": "string"},
                                "failureDomain": {"type": "string"},
                            },
                            "x-kubernetes-preserve-unknown-fields": true,
                        },
                        "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                    },
                }},
            })).collect::<Vec<_>>(),
        },
    }))
    .expect("a valid CRD")
}

/// A Machine of `cluster` for the node `node` with `provider_id`, as a MachineSet creates it.
pub fn machine(namespace: &str, name: &str, node: &str, provider_id: &str) -> DynamicObject {
    let mut machine = DynamicObject::new(name, &machine_resource()).within(namespace);
    machine.metadata.finalizers = Some(vec![FINALIZER.to_owned()]);
    machine.data = json!({
        "spec": {
            "clusterName": "workload",
            "bootstrap": {"dataSecretName": format!("{name}-bootstrap")},
            "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DockerMachine", "name": name},
            "providerID": provider_id,
        },
        "status": {"nodeRef": {"name": node}},
    });
    machine
}

/// The Node annotations Cluster API writes.
pub fn node_annotations(namespace: &str, machine: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("cluster.x-k8s.io/machine".to_owned(), machine.to_owned()),
        (
            "cluster.x-k8s.io/cluster-namespace".to_owned(),
            namespace.to_owned(),
        ),
        (
            "cluster.x-k8s.io/cluster-name".to_owned(),
            "workload".to_owned(),
        ),
        (
            "cluster.x-k8s.io/owner-kind".to_owned(),
            "MachineSet".to_owned(),
        ),
        (
            "cluster.x-k8s.io/owner-name".to_owned(),
            "workers".to_owned(),
        ),
    ])
}

/// What the machine controller did, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// It would have drained the node itself: the exclusion annotation was missing.
    Drained(String),
    WaitedForVolumes(String),
    InfrastructureDeleted(String),
    NodeDeleted(String),
    Removed(String),
}

/// The infrastructure provider's part of a Machine's deletion, given the Machine's
/// `spec.providerID`; called once per Machine.
pub type DeleteInfrastructure = Arc<dyn Fn(String) -> BoxFuture<'static, Result<()>> + Send + Sync>;

/// How the machine controller runs.
pub struct Settings {
    /// Where the Machines are.
    pub management: kube::Client,
    /// Where the Nodes are, deleted after the infrastructure as upstream does; `None` leaves
    /// them to whoever deleted the Machine.
    pub workload: Option<kube::Client>,
    /// The infrastructure's deletion; `None` takes 200 ms and does nothing.
    pub infrastructure: Option<DeleteInfrastructure>,
    /// While set, the controller does nothing: a Machine being deleted stays so.
    pub held: Arc<AtomicBool>,
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings")
            .field("held", &self.held)
            .finish_non_exhaustive()
    }
}

#[derive(Debug)]
pub struct MachineController {
    pub steps: Arc<Mutex<Vec<Step>>>,
    task: JoinHandle<()>,
}

impl Drop for MachineController {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// How often the controller lists the Machines: it polls, so a Machine left while it was
/// held is taken up again without a change to wake it.
const RESYNC: Duration = Duration::from_millis(250);

impl MachineController {
    /// Runs against the Machines of `management`, deleting Nodes in `workload`.
    pub fn start(management: kube::Client, workload: kube::Client) -> Self {
        Self::start_with(Settings {
            management,
            workload: Some(workload),
            infrastructure: None,
            held: Arc::default(),
        })
    }

    pub fn start_with(settings: Settings) -> Self {
        let steps: Arc<Mutex<Vec<Step>>> = Arc::default();
        let log = Arc::clone(&steps);
        let task = tokio::spawn(async move {
            let machines: Api<DynamicObject> =
                Api::all_with(settings.management.clone(), &machine_resource());
            let mut infrastructure_gone = HashSet::new();
            loop {
                tokio::time::sleep(RESYNC).await;
                if settings.held.load(Ordering::SeqCst) {
                    continue;
                }
                let Ok(listed) = machines.list(&ListParams::default()).await else {
                    continue;
                };
                for machine in listed
                    .items
                    .iter()
                    .filter(|machine| machine.metadata.deletion_timestamp.is_some())
                {
                    let _ =
                        reconcile_delete(&settings, machine, &mut infrastructure_gone, &log).await;
                }
            }
        });
        Self { steps, task }
    }

    pub fn steps(&self) -> Vec<Step> {
        self.steps
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

async fn reconcile_delete(
    settings: &Settings,
    machine: &DynamicObject,
    infrastructure_gone: &mut HashSet<String>,
    log: &Mutex<Vec<Step>>,
) -> Result<()> {
    let name = machine.metadata.name.clone().unwrap_or_default();
    let namespace = machine.metadata.namespace.clone().unwrap_or_default();
    let uid = machine.metadata.uid.clone().unwrap_or_default();
    let annotations = machine.metadata.annotations.clone().unwrap_or_default();
    let hooked = |prefix: &str| annotations.keys().any(|key| key.starts_with(prefix));
    if hooked(PRE_DRAIN) || hooked(PRE_TERMINATE) {
        // Each change of the annotations brings the Machine back here.
        return Ok(());
    }
    let record = |step: Step| {
        let mut steps = log.lock().unwrap_or_else(PoisonError::into_inner);
        if !steps.contains(&step) {
            steps.push(step);
        }
    };
    if !annotations.contains_key(EXCLUDE_DRAINING) {
        record(Step::Drained(name.clone()));
    }
    if !annotations.contains_key(EXCLUDE_VOLUME_WAIT) {
        record(Step::WaitedForVolumes(name.clone()));
    }
    // The infrastructure provider deletes the machine, once; then, and only then, the Node.
    if !infrastructure_gone.contains(&uid) {
        match &settings.infrastructure {
            Some(delete) => {
                let provider_id = machine.data["spec"]["providerID"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                delete(provider_id).await?;
            }
            None => tokio::time::sleep(Duration::from_millis(200)).await,
        }
        infrastructure_gone.insert(uid);
    }
    record(Step::InfrastructureDeleted(name.clone()));
    if let (Some(workload), Some(node)) = (
        &settings.workload,
        machine.data["status"]["nodeRef"]["name"].as_str(),
    ) {
        let nodes: Api<Node> = Api::all(workload.clone());
        match nodes.delete(node, &DeleteParams::default()).await {
            Ok(_) | Err(kube::Error::Api(_)) => record(Step::NodeDeleted(node.to_owned())),
            Err(error) => return Err(error.into()),
        }
    }
    let machines: Api<DynamicObject> =
        Api::namespaced_with(settings.management.clone(), &namespace, &machine_resource());
    let finalizers: Vec<String> = machine
        .metadata
        .finalizers
        .iter()
        .flatten()
        .filter(|finalizer| *finalizer != FINALIZER)
        .cloned()
        .collect();
    machines
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": finalizers, "resourceVersion": machine.metadata.resource_version}})),
        )
        .await?;
    record(Step::Removed(name));
    Ok(())
}

/// Creates `machine` in the management cluster, then writes its status (which a create
/// drops, the CRD having the status subresource), as the machine controller would.
pub async fn create_machine(management: &kube::Client, machine: &DynamicObject) -> Result<()> {
    let namespace = machine.metadata.namespace.as_deref().unwrap_or("default");
    let version = machine
        .types
        .as_ref()
        .and_then(|types| types.api_version.rsplit_once('/'))
        .map_or("v1beta2", |(_, version)| version);
    let machines = Api::<DynamicObject>::namespaced_with(
        management.clone(),
        namespace,
        &machine_resource_in(version),
    );
    let created = machines.create(&PostParams::default(), machine).await?;
    let name = created.metadata.name.unwrap_or_default();
    machines
        .patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": machine.data["status"]})),
        )
        .await?;
    Ok(())
}
