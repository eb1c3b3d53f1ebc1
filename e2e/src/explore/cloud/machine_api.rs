//! Cluster API: a Machine per node in the cluster itself (namespace [`NAMESPACE`]), and a
//! machine controller of the explorer's that deletes a Machine as upstream's does, terminating
//! its kube-sim machine first. termination-controller reaches the Machines with an identity of
//! their own through an interposer that counts its calls; the faults revoke that identity's
//! access (403 from the API server's own RBAC) or stall the machine controller (a Machine
//! stuck deleting).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Result, anyhow};
use futures::FutureExt;
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::RoleBinding;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, DynamicObject, ListParams, PostParams};
use kube::{Api, Client};
use kube_sim::world::machine_id;
use provider_testbed::cluster_api::{
    MachineController, Settings, create_machine, machine, machine_crd, node_annotations,
};
use provider_testbed::interposer::{Interposer, Seen};
use serde_json::json;

use crate::explore::schedule::{Program, ProviderFault};
use crate::explore::setup;
use crate::explore::sim::{Outcome, sim_call};
use crate::manifests::{create, ensure_namespace};
use crate::wait::poll_until;

pub const NAMESPACE: &str = "machines";
/// termination-controller's identity in front of the Machines, and its binding to them.
const ACCOUNT: &str = "termination-controller-machines";
const BINDING: &str = "explore-machines";

pub struct MachineApi {
    client: Client,
    interposer: Interposer,
    /// termination-controller's `--cluster-api-kubeconfig`.
    kubeconfig: PathBuf,
    /// Each machine's Machine, by providerID.
    names: BTreeMap<String, String>,
    held: Arc<AtomicBool>,
    _controller: MachineController,
}

impl MachineApi {
    /// The Machine CRD served, the identity bound, the interposer and the machine controller
    /// running; `api` is kube-sim's address, `dir` the run's.
    pub async fn start(client: &Client, api: SocketAddr, dir: &std::path::Path) -> Result<Self> {
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        crds.create(&PostParams::default(), &machine_crd()).await?;
        let machines: Api<DynamicObject> = Api::all_with(
            client.clone(),
            &nodegrace_controller::instances::cluster_api::machine_resource(),
        );
        let served = poll_until(std::time::Duration::from_secs(10), || async {
            machines.list(&ListParams::default()).await.is_ok()
        })
        .await;
        anyhow::ensure!(served, "the Machine CRD was not served within 10 s");
        ensure_namespace(client, NAMESPACE).await?;
        ensure_namespace(client, setup::NAMESPACE).await?;
        create(
            client,
            &json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": ACCOUNT}}),
            setup::NAMESPACE,
        )
        .await?;
        create(
            client,
            &json!({
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "Role",
                "metadata": {"name": BINDING, "namespace": NAMESPACE},
                "rules": [{"apiGroups": ["cluster.x-k8s.io"], "resources": ["machines"],
                    "verbs": ["get", "list", "watch", "patch", "delete"]}],
            }),
            NAMESPACE,
        )
        .await?;
        grant(client).await?;
        let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), setup::NAMESPACE);
        let token = setup::token(&accounts, ACCOUNT).await?;
        let interposer = Interposer::start(&format!("http://{api}")).await?;
        let kubeconfig = dir.join("kubeconfig-machines");
        setup::write_kubeconfig(&kubeconfig, &interposer.url(), &token)?;
        let held = Arc::new(AtomicBool::new(false));
        let terminating = client.clone();
        let controller = MachineController::start_with(Settings {
            management: client.clone(),
            // The Node is being deleted already: termination-controller deletes a Machine
            // only for a Node deleted with its finalizer, and releases it itself.
            workload: None,
            infrastructure: Some(Arc::new(move |provider_id: String| {
                let client = terminating.clone();
                async move {
                    let id = machine_id(&provider_id)
                        .ok_or_else(|| anyhow!("no machine in providerID {provider_id:?}"))?;
                    sim_call(&client, "DELETE", &format!("/sim/v1/instances/{id}"), None)
                        .await
                        .map(drop)
                }
                .boxed()
            })),
            held: Arc::clone(&held),
        });
        Ok(Self {
            client: client.clone(),
            interposer,
            kubeconfig,
            names: BTreeMap::new(),
            held,
            _controller: controller,
        })
    }

    /// A Machine for node `node` on `provider_id`, as a MachineSet makes one.
    pub async fn create(&mut self, node: &str, provider_id: &str) -> Result<()> {
        let name = format!("{node}-{}", self.names.len());
        create_machine(&self.client, &machine(NAMESPACE, &name, node, provider_id)).await?;
        self.names.insert(provider_id.to_owned(), name);
        Ok(())
    }

    /// The annotations Cluster API puts on the Node of `provider_id`'s Machine.
    pub fn node_annotations(&self, provider_id: &str) -> BTreeMap<String, String> {
        self.names
            .get(provider_id)
            .map(|name| node_annotations(NAMESPACE, name))
            .unwrap_or_default()
    }

    pub async fn fault(&self, fault: ProviderFault) -> Result<Outcome> {
        match fault {
            ProviderFault::MachinesForbidden => {
                let bindings: Api<RoleBinding> = Api::namespaced(self.client.clone(), NAMESPACE);
                match bindings.delete(BINDING, &DeleteParams::default()).await {
                    Ok(_) | Err(kube::Error::Api(_)) => {}
                    Err(error) => return Err(error.into()),
                }
                Ok(Outcome::Done(format!(
                    "{ACCOUNT} may no longer touch Machines (RoleBinding deleted)"
                )))
            }
            ProviderFault::MachinesStuck => {
                self.held.store(true, Ordering::SeqCst);
                Ok(Outcome::Done("the machine controller stalls".to_owned()))
            }
            other => Ok(Outcome::Skipped(format!(
                "{other:?} is not a Cluster API fault"
            ))),
        }
    }

    pub async fn heal(&self) -> Result<Outcome> {
        grant(&self.client).await?;
        self.held.store(false, Ordering::SeqCst);
        Ok(Outcome::Done(
            "Machines reachable, the machine controller working".to_owned(),
        ))
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.interposer.seen()
    }

    pub fn traffic(&self) -> String {
        format!(
            "cluster-api: {} requests from termination-controller",
            self.interposer.seen().len()
        )
    }

    /// termination-controller deletes Machines; out-of-service-gc, which Cluster API cannot
    /// serve (no power state), fences on kube-sim's cloud.
    pub fn args(&self, program: Program) -> Vec<String> {
        match program {
            Program::TerminationController => vec![
                "--instance-provider=cluster-api".to_owned(),
                format!("--cluster-api-kubeconfig={}", self.kubeconfig.display()),
            ],
            Program::OutOfServiceGc => vec!["--instance-provider=sim".to_owned()],
        }
    }
}

/// Binds [`ACCOUNT`] to the Machines (again, after a [`ProviderFault::MachinesForbidden`]).
async fn grant(client: &Client) -> Result<()> {
    let bindings: Api<RoleBinding> = Api::namespaced(client.clone(), NAMESPACE);
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": BINDING, "namespace": NAMESPACE},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": BINDING},
        "subjects": [{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": setup::NAMESPACE}],
    }))?;
    match bindings.create(&PostParams::default(), &binding).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
        Err(error) => Err(error.into()),
    }
}
