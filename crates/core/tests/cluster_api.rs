//! The `cluster-api` provider on kube-sim with Cluster API's Machine CRD, for the histories the
//! controller's tests do not reach: a Machine re-created under a deleted one's name.

use anyhow::Result;
use anyhow::ensure;
use kube::Api;
use kube::api::{DeleteParams, DynamicObject};
use kube_sim::cluster::Cluster;
use nodegrace_core::instances::cluster_api::machine_resource;
use nodegrace_core::instances::{ClusterApiInstances, InstanceProvider, InstanceState, ProviderId};
use nodegrace_core::testing::cluster_api::{
    create_machine, machine, machine_crd, node_annotations,
};
use serde_json::json;

/// The providerID as the controller reads it from a Node Cluster API registered.
fn node(provider_id: &str) -> Result<ProviderId> {
    let node = serde_json::from_value(json!({
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
    let provider = ClusterApiInstances::new(client.clone());
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
