//! The `cluster-api` provider on kube-sim with Cluster API's Machine CRD, for the histories the
//! controller's tests do not reach: a Machine re-created under a deleted one's name.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::{DeleteParams, DynamicObject, PostParams};
use kube_sim::cluster::Cluster;
use nodegrace_controller::instances::cluster_api::{machine_resource, machine_resource_in};
use nodegrace_controller::instances::{
    ClusterApiInstances, InstanceError, InstanceProvider, InstanceState, ProviderId,
};
use provider_testbed::cluster_api::{
    create_machine, machine, machine_crd, machine_crd_serving, node_annotations,
};
use serde_json::json;

/// The providerID as the controller reads it from a Node Cluster API registered.
fn node(provider_id: &str) -> Result<ProviderId> {
    let node: k8s_openapi::api::core::v1::Node = serde_json::from_value(json!({
        "metadata": {"name": "worker", "annotations": node_annotations("default", "workers-0")},
        "spec": {"providerID": provider_id},
    }))?;
    Ok(ProviderId::of(&node)?)
}

/// A Machine without Cluster API's finalizer: a delete ends it at once.
fn bare_machine(provider_id: &str) -> DynamicObject {
    let mut bare = machine("default", "workers-0", "worker", provider_id);
    bare.metadata.finalizers = None;
    bare
}

#[tokio::test]
async fn a_namesake_machine_does_not_inherit_the_end_of_the_one_deleted_before() -> Result<()> {
    let management = Cluster::new(0).crd(machine_crd()).start().await?;
    let client = management.client();
    let provider = ClusterApiInstances::new(client.clone(), Duration::from_secs(10));
    let machines: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), "default", &machine_resource());

    // The first episode: our delete, then the Machine gone: terminated.
    let first = node("docker:///workload/first")?;
    create_machine(&client, &bare_machine("docker:///workload/first")).await?;
    ensure!(provider.state(&first).await? == InstanceState::Running);
    provider.terminate(&first).await?;
    ensure!(machines.get_opt("workers-0").await?.is_none());
    ensure!(provider.state(&first).await? == InstanceState::Terminated);

    // A new machine under the same Machine name, deleted by someone else: for its node, gone
    // is only "not found" (confirmed over time), not our earlier termination.
    let second = node("docker:///workload/second")?;
    create_machine(&client, &bare_machine("docker:///workload/second")).await?;
    ensure!(provider.state(&second).await? == InstanceState::Running);
    machines
        .delete("workers-0", &DeleteParams::default())
        .await?;
    ensure!(provider.state(&second).await? == InstanceState::NotFound);
    Ok(())
}

/// Cluster API before v1.11 serves Machines as v1beta1 only: the provider finds them there by
/// discovery, with the same identity checks, instead of taking the missing v1beta2 for a
/// machine gone.
#[tokio::test]
async fn machines_served_only_as_v1beta1_are_found_terminated_and_confirmed_gone() -> Result<()> {
    let management = Cluster::new(0)
        .crd(machine_crd_serving(&["v1beta1"]))
        .start()
        .await?;
    let client = management.client();
    let provider = ClusterApiInstances::new(client.clone(), Duration::from_secs(10));
    let v1beta1 = machine_resource_in("v1beta1");
    let machines: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &v1beta1);
    let mut old = bare_machine("docker:///workload/old");
    old.types = Some(kube::api::TypeMeta {
        api_version: v1beta1.api_version.clone(),
        kind: "Machine".to_owned(),
    });
    create_machine(&client, &old).await?;

    let id = node("docker:///workload/old")?;
    ensure!(provider.state(&id).await? == InstanceState::Running);
    // Another node's id is refused by the Machine's own providerID, in v1beta1 too.
    let other = node("docker:///workload/other")?;
    let refused = provider.state(&other).await.unwrap_err();
    ensure!(matches!(refused, InstanceError::Refused(_)), "{refused}");
    provider.terminate(&id).await?;
    ensure!(machines.get_opt("workers-0").await?.is_none());
    ensure!(provider.state(&id).await? == InstanceState::Terminated);
    Ok(())
}

/// A management cluster without Machines in any version this provider reads: every call is
/// an error that holds the node, never "not found".
#[tokio::test]
async fn a_management_cluster_without_machines_is_an_error_never_a_machine_gone() -> Result<()> {
    let management = Cluster::new(0).start().await?;
    let provider = ClusterApiInstances::new(management.client(), Duration::from_secs(10));
    let id = node("docker:///workload/first")?;
    for answer in [
        provider.state(&id).await.map(|state| state.to_string()),
        provider
            .terminate(&id)
            .await
            .map(|()| "terminated".to_owned()),
    ] {
        let error = answer.err().context("an answer without Machines")?;
        ensure!(matches!(error, InstanceError::Refused(_)), "{error}");
        ensure!(
            error
                .to_string()
                .contains("the management cluster has no Machines"),
            "{error}"
        );
    }

    // Machines served only in a version this provider does not read: held the same way.
    let alpha = Cluster::new(0)
        .crd(machine_crd_serving(&["v1alpha4"]))
        .start()
        .await?;
    let provider = ClusterApiInstances::new(alpha.client(), Duration::from_secs(10));
    let error = provider.state(&id).await.unwrap_err().to_string();
    ensure!(error.contains("v1alpha4"), "{error}");
    Ok(())
}

/// The Machine CRD removed after the provider found it: the 404 on the resource is a missing
/// API (held, never the machine gone), and once Machines are served again, in another
/// version, they are found by a new discovery.
#[tokio::test]
async fn machines_gone_as_a_resource_hold_the_node_until_they_are_served_again() -> Result<()> {
    let management = Cluster::new(0).crd(machine_crd()).start().await?;
    let client = management.client();
    let provider = ClusterApiInstances::new(client.clone(), Duration::from_secs(10));
    let id = node("docker:///workload/first")?;
    create_machine(&client, &bare_machine("docker:///workload/first")).await?;
    ensure!(provider.state(&id).await? == InstanceState::Running);

    // Deleted by someone else first, so the provider never saw it go; then its type goes.
    let machines: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), "default", &machine_resource());
    machines
        .delete("workers-0", &DeleteParams::default())
        .await?;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.delete("machines.cluster.x-k8s.io", &DeleteParams::default())
        .await?;
    wait_for("the Machine resource to go", || async {
        Ok(provider.state(&id).await.is_err())
    })
    .await?;
    let error = provider.state(&id).await.unwrap_err();
    ensure!(matches!(error, InstanceError::Refused(_)), "{error}");
    ensure!(provider.terminate(&id).await.is_err());

    crds.create(&PostParams::default(), &machine_crd_serving(&["v1beta1"]))
        .await?;
    let mut again = bare_machine("docker:///workload/first");
    again.types = Some(kube::api::TypeMeta {
        api_version: machine_resource_in("v1beta1").api_version,
        kind: "Machine".to_owned(),
    });
    wait_for("Machines to be served again", || async {
        Ok(create_machine(&client, &again).await.is_ok())
    })
    .await?;
    ensure!(provider.state(&id).await? == InstanceState::Running);
    Ok(())
}

async fn wait_for<F, Fut>(what: &str, check: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<bool>>,
{
    nodegrace_testing::wait_for(what, check).await
}
