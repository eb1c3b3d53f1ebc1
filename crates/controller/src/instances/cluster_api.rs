//! Any infrastructure Cluster API manages, through its Machines. A Node's machine is the Machine
//! its annotations name (`cluster.x-k8s.io/machine` in `cluster.x-k8s.io/cluster-namespace`),
//! confirmed by the Machine's `spec.providerID`. Terminating it is deleting that Machine, by
//! its UID, after telling Cluster API that the node is drained and its volumes waited for
//! already; Cluster API then deletes the infrastructure, the Node, and the Machine last. A
//! MachineSet replacing the Machine is the expected outcome.
//!
//! Cluster API has no power state: a Machine is there, being deleted, or gone, so this
//! provider cannot fence.

use std::collections::HashSet;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, Preconditions};
use kube::discovery::ApiResource;
use serde_json::json;

use super::{InstanceError, InstanceProvider, InstanceState, ProviderId};

pub const MACHINE_ANNOTATION: &str = "cluster.x-k8s.io/machine";
pub const NAMESPACE_ANNOTATION: &str = "cluster.x-k8s.io/cluster-namespace";
/// Set before the delete: the node was drained and its volumes waited for by us.
pub const EXCLUDE_DRAINING: &str = "machine.cluster.x-k8s.io/exclude-node-draining";
pub const EXCLUDE_VOLUME_WAIT: &str =
    "machine.cluster.x-k8s.io/exclude-wait-for-node-volume-detach";
const EXCLUDED_BY: &str =
    "nodegrace termination-controller drained the node and waited for its volumes";

pub const GROUP: &str = "cluster.x-k8s.io";
/// The versions of Machine this provider reads, the one it prefers first: v1beta2 since
/// Cluster API v1.11, v1beta1 before it (still common). The fields it uses (`spec.providerID`,
/// the exclusion annotations, the deletion) are the same in both.
pub const VERSIONS: [&str; 2] = ["v1beta2", "v1beta1"];

/// `cluster.x-k8s.io/<version>` `Machine`.
pub fn machine_resource_in(version: &str) -> ApiResource {
    ApiResource {
        group: GROUP.to_owned(),
        version: version.to_owned(),
        api_version: format!("{GROUP}/{version}"),
        kind: "Machine".to_owned(),
        plural: "machines".to_owned(),
    }
}

/// `cluster.x-k8s.io/v1beta2` `Machine`.
pub fn machine_resource() -> ApiResource {
    machine_resource_in(VERSIONS[0])
}

pub struct ClusterApiInstances {
    /// The management cluster, where the Machines are.
    client: kube::Client,
    /// The Machines this process deleted or saw deleting, by namespace, name and the
    /// providerID they carried: one gone after that is terminated; one gone that we never saw
    /// counts as not found. The providerID keeps a namesake Machine of a later episode from
    /// inheriting an earlier one's end.
    deleted: Mutex<HashSet<(String, String, String)>>,
    /// The Machine version the management cluster serves, found by discovery and asked again
    /// once a call finds it gone (Cluster API upgraded or removed).
    served: Mutex<Option<ApiResource>>,
    /// `--instance-provider-timeout`, for each `state` and `terminate` in all.
    timeout: Duration,
}

impl std::fmt::Debug for ClusterApiInstances {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterApiInstances")
            .finish_non_exhaustive()
    }
}

/// The Machine a node names, as read now.
struct Named<'a> {
    namespace: &'a str,
    name: &'a str,
    api: Api<DynamicObject>,
    resource: ApiResource,
}

impl ClusterApiInstances {
    /// Machines of `management`; each `state` or `terminate` may take `timeout` in all.
    pub fn new(management: kube::Client, timeout: Duration) -> Self {
        Self {
            client: management,
            deleted: Mutex::default(),
            served: Mutex::default(),
            timeout,
        }
    }

    /// `call` within the provider's timeout: a management cluster that does not answer is a
    /// failure like any other, not a wait of the client's own (kube's read timeout is minutes).
    async fn within<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, InstanceError>>,
    ) -> Result<T, InstanceError> {
        tokio::time::timeout(self.timeout, call)
            .await
            .unwrap_or_else(|_| {
                Err(InstanceError::Transient(format!(
                    "the management cluster did not answer within {} s \
                     (--instance-provider-timeout)",
                    self.timeout.as_secs_f64()
                )))
            })
    }

    /// The Machine resource the management cluster serves: v1beta2 where it is served, else
    /// v1beta1. A cluster serving neither is an error that holds the node, never a machine
    /// gone.
    async fn served(&self) -> Result<ApiResource, InstanceError> {
        if let Some(found) = self
            .served
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
        {
            return Ok(found);
        }
        let group = match kube::discovery::group(&self.client, GROUP).await {
            Ok(group) => group,
            Err(kube::Error::Discovery(_)) => {
                return Err(no_machines("no cluster.x-k8s.io API group"));
            }
            Err(error) => return Err(failure(&format!("discover the {GROUP} API"), &error)),
        };
        let found = VERSIONS
            .iter()
            .find(|version| {
                group
                    .versioned_resources(version)
                    .iter()
                    .any(|(resource, _)| resource.kind == "Machine")
            })
            .map(|version| machine_resource_in(version))
            .ok_or_else(|| {
                no_machines(&format!(
                    "{GROUP} serves {}, none of them with Machines in {}",
                    group.versions().collect::<Vec<_>>().join(", "),
                    VERSIONS.join(" or ")
                ))
            })?;
        *self.served.lock().unwrap_or_else(PoisonError::into_inner) = Some(found.clone());
        Ok(found)
    }

    /// A call found the Machine resource itself missing: discovery is asked again next time.
    fn resource_gone(&self, resource: &ApiResource, what: &str) -> InstanceError {
        self.served
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        no_machines(&format!(
            "{what}: the management cluster no longer serves {} Machines",
            resource.api_version
        ))
    }

    async fn named<'a>(&self, id: &'a ProviderId) -> Result<Named<'a>, InstanceError> {
        let node = id.node().unwrap_or("(none)");
        let (Some(name), Some(namespace)) = (
            id.node_annotation(MACHINE_ANNOTATION),
            id.node_annotation(NAMESPACE_ANNOTATION),
        ) else {
            return Err(InstanceError::Refused(format!(
                "node {node} has no {MACHINE_ANNOTATION} and {NAMESPACE_ANNOTATION} annotations, \
                 so its Machine is unknown: Cluster API writes them on the Nodes of its \
                 Machines (is --instance-provider right?)"
            )));
        };
        let resource = self.served().await?;
        Ok(Named {
            namespace,
            name,
            api: Api::namespaced_with(self.client.clone(), namespace, &resource),
            resource,
        })
    }

    /// The Machine, if there, after checking it is this node's.
    async fn read(
        &self,
        id: &ProviderId,
        named: &Named<'_>,
    ) -> Result<Option<DynamicObject>, InstanceError> {
        let what = format!("read Machine {}/{}", named.namespace, named.name);
        let machine = match named.api.get(named.name).await {
            Ok(machine) => machine,
            Err(kube::Error::Api(status)) if status.code == 404 => {
                return if names_object(&status, named.name) {
                    Ok(None)
                } else {
                    Err(self.resource_gone(&named.resource, &what))
                };
            }
            Err(error) => return Err(failure(&what, &error)),
        };
        let names = machine.data["spec"]["providerID"]
            .as_str()
            .unwrap_or_default();
        if names != id.as_str() {
            return Err(InstanceError::Refused(format!(
                "Machine {}/{} has spec.providerID {names:?}, not node {}'s {id}: it is not this \
                 node's machine (re-created under the same name?)",
                named.namespace,
                named.name,
                id.node().unwrap_or("(none)")
            )));
        }
        Ok(Some(machine))
    }

    fn remember(&self, named: &Named<'_>, id: &ProviderId) {
        self.deleted
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(Self::key(named, id));
    }

    fn key(named: &Named<'_>, id: &ProviderId) -> (String, String, String) {
        (
            named.namespace.to_owned(),
            named.name.to_owned(),
            id.as_str().to_owned(),
        )
    }
}

/// Whether a 404 says the object `name` is not there. The API server answers a resource it
/// does not serve with a 404 too, without the object's name in its details: that is a missing
/// API, never a missing Machine.
fn names_object(status: &kube::core::Status, name: &str) -> bool {
    status.is_not_found()
        && status
            .details
            .as_ref()
            .is_some_and(|details| details.name == name)
}

fn no_machines(why: &str) -> InstanceError {
    InstanceError::Refused(format!(
        "the management cluster has no Machines ({GROUP} {}): {why}; is Cluster API installed \
         there, and does the management kubeconfig point at it? The node is held",
        VERSIONS.join(" or ")
    ))
}

fn failure(what: &str, error: &kube::Error) -> InstanceError {
    match error {
        kube::Error::Api(status) if matches!(status.code, 401 | 403) => {
            InstanceError::Refused(format!(
                "{what}: {} ({}); the management cluster's RBAC must allow get, patch and delete on machines.cluster.x-k8s.io",
                status.message, status.code
            ))
        }
        other => InstanceError::Transient(format!("{what}: {other}")),
    }
}

impl InstanceProvider for ClusterApiInstances {
    fn name(&self) -> &'static str {
        "cluster-api"
    }

    fn state<'a>(
        &'a self,
        id: &'a ProviderId,
    ) -> BoxFuture<'a, Result<InstanceState, InstanceError>> {
        self.within(async move {
            let named = self.named(id).await?;
            match self.read(id, &named).await? {
                Some(machine) if machine.metadata.deletion_timestamp.is_some() => {
                    Ok(InstanceState::Stopping)
                }
                Some(_) => Ok(InstanceState::Running),
                None => {
                    let ours = self
                        .deleted
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .contains(&Self::key(&named, id));
                    Ok(if ours {
                        InstanceState::Terminated
                    } else {
                        InstanceState::NotFound
                    })
                }
            }
        })
        .boxed()
    }

    fn terminate<'a>(&'a self, id: &'a ProviderId) -> BoxFuture<'a, Result<(), InstanceError>> {
        self.within(async move {
            let named = self.named(id).await?;
            let shown = format!("Machine {}/{}", named.namespace, named.name);
            let Some(machine) = self.read(id, &named).await? else {
                return Ok(());
            };
            let uid = machine.metadata.uid.clone().unwrap_or_default();
            if machine.metadata.deletion_timestamp.is_some() {
                // Someone deleted it already: wait for it, never delete twice.
                self.remember(&named, id);
                return Ok(());
            }
            let excluded = json!({"metadata": {
                "annotations": {EXCLUDE_DRAINING: EXCLUDED_BY, EXCLUDE_VOLUME_WAIT: EXCLUDED_BY},
            }});
            named
                .api
                .patch(
                    named.name,
                    &PatchParams::default(),
                    &Patch::Merge(&excluded),
                )
                .await
                .map_err(|error| failure(&format!("annotate {shown}"), &error))?;
            let by_uid = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: Some(uid),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            match named.api.delete(named.name, &by_uid).await {
                Ok(_) => {}
                Err(kube::Error::Api(status)) if names_object(&status, named.name) => {}
                Err(kube::Error::Api(status)) if status.code == 404 => {
                    return Err(self.resource_gone(&named.resource, &format!("delete {shown}")));
                }
                Err(kube::Error::Api(status)) if status.code == 409 => {
                    return Err(InstanceError::Refused(format!(
                        "{shown} was replaced by a namesake before its delete; not deleted"
                    )));
                }
                Err(error) => return Err(failure(&format!("delete {shown}"), &error)),
            }
            self.remember(&named, id);
            Ok(())
        })
        .boxed()
    }

    fn power_unsupported(&self) -> Option<&'static str> {
        Some("Cluster API has no power state: a Machine is there, being deleted, or gone")
    }
}
