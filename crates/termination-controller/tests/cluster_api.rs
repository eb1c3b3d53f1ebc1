//! The binary with `--instance-provider=cluster-api` on two kube-sim clusters: the workload
//! cluster's Nodes, the management cluster's Machines (Cluster API's v1beta2 CRD) and a machine
//! controller deleting as upstream's does. Deleting a Node deletes its Machine, once and by
//! UID, excluded from Cluster API's own drain; the Node goes when Cluster API is done.

use std::process::Stdio;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::Node;
use kube::{Api, Client};
use kube_sim::KubeSim;
use kube_sim::cluster::Cluster;
use nodegrace_controller::instances::cluster_api::{
    EXCLUDE_DRAINING, EXCLUDE_VOLUME_WAIT, machine_resource, machine_resource_in,
};
use provider_testbed::cluster_api::{
    MachineController, Step, create_machine, machine, machine_crd, machine_crd_serving,
    node_annotations,
};
use serde_json::json;
use tokio::process::{Child, Command};

use crate::common::{
    delete_node, event_notes, has_finalizer, machine_node, node_gone, sim, wait_for,
};

const BINARY: &str = env!("CARGO_BIN_EXE_termination-controller");

fn start(workload: &KubeSim, management: &KubeSim) -> Result<Child> {
    Command::new(BINARY)
        .arg(format!(
            "--kubeconfig={}",
            workload.kubeconfig_path().display()
        ))
        .arg(format!(
            "--cluster-api-kubeconfig={}",
            management.kubeconfig_path().display()
        ))
        .args([
            "--admin-listen=127.0.0.1:0",
            "--leader-elect=false",
            "--instance-provider=cluster-api",
            "--instance-not-found-confirm=2s",
            "--log-level=warn",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .context("start termination-controller")
}

async fn warned(client: &Client, node: &str, says: &str) -> Result<bool> {
    let notes = event_notes(client, node, "InstanceTerminationFailed").await?;
    Ok(notes.iter().any(|note| note.contains(says)))
}

async fn machine_annotations(
    management: &Client,
    name: &str,
) -> Result<Option<std::collections::BTreeMap<String, String>>> {
    let machines: Api<kube::api::DynamicObject> =
        Api::namespaced_with(management.clone(), "default", &machine_resource());
    Ok(machines
        .get_opt(name)
        .await?
        .map(|machine| machine.metadata.annotations.unwrap_or_default()))
}

#[tokio::test]
async fn a_deleted_node_deletes_its_machine_and_cluster_api_finishes_the_rest() -> Result<()> {
    let management = Cluster::new(0).crd(machine_crd()).start().await?;
    let workload = sim(0).await?;
    let (manage, work) = (management.client(), workload.client());
    let controller = MachineController::start(manage.clone(), work.clone());
    for n in 0..2 {
        let id = format!("docker:///workload/worker-{n}");
        create_machine(
            &manage,
            &machine(
                "default",
                &format!("workers-{n}"),
                &format!("worker-{n}"),
                &id,
            ),
        )
        .await?;
        let annotations = node_annotations("default", &format!("workers-{n}"));
        machine_node(&work, &format!("worker-{n}"), &id, Some(annotations)).await?;
    }
    // A Machine re-created under the name a node's annotation gives: not that node's machine.
    create_machine(
        &manage,
        &machine("default", "workers-9", "other", "docker:///workload/other"),
    )
    .await?;
    let annotations = node_annotations("default", "workers-9");
    machine_node(
        &work,
        "renamed",
        "docker:///workload/renamed",
        Some(annotations),
    )
    .await?;
    machine_node(&work, "unmanaged", "docker:///workload/unmanaged", None).await?;

    let _controller = start(&workload, &management)?;
    let names = ["worker-0", "worker-1", "renamed", "unmanaged"];
    for name in names {
        wait_for(&format!("the finalizer on {name}"), || {
            has_finalizer(&work, name)
        })
        .await?;
    }
    for name in names {
        delete_node(&work, name).await?;
    }
    for n in 0..2 {
        let name = format!("worker-{n}");
        wait_for(&format!("{name} released"), || node_gone(&work, &name)).await?;
        ensure!(
            machine_annotations(&manage, &format!("workers-{n}"))
                .await?
                .is_none()
        );
    }
    let steps = controller.steps();
    for n in 0..2 {
        let machine = format!("workers-{n}");
        let node = format!("worker-{n}");
        // We drained and waited; Cluster API did neither again.
        ensure!(
            !steps.contains(&Step::Drained(machine.clone())),
            "{steps:?}"
        );
        ensure!(
            !steps.contains(&Step::WaitedForVolumes(machine.clone())),
            "{steps:?}"
        );
        let at = |step: &Step| steps.iter().position(|seen| seen == step);
        let infrastructure = at(&Step::InfrastructureDeleted(machine.clone()));
        let node_deleted = at(&Step::NodeDeleted(node));
        let removed = at(&Step::Removed(machine));
        ensure!(
            infrastructure < node_deleted && node_deleted < removed && infrastructure.is_some(),
            "{steps:?}"
        );
    }
    wait_for("a Warning on renamed", || {
        warned(&work, "renamed", "not this node's machine")
    })
    .await?;
    wait_for("a Warning on unmanaged", || {
        warned(&work, "unmanaged", "has no cluster.x-k8s.io/machine")
    })
    .await?;
    ensure!(!node_gone(&work, "renamed").await? && !node_gone(&work, "unmanaged").await?);
    let untouched = machine_annotations(&manage, "workers-9")
        .await?
        .context("workers-9")?;
    ensure!(
        !untouched.contains_key(EXCLUDE_DRAINING) && !untouched.contains_key(EXCLUDE_VOLUME_WAIT)
    );
    Ok(())
}

#[tokio::test]
async fn a_machine_already_deleting_is_waited_for_not_deleted_again() -> Result<()> {
    let management = Cluster::new(0).crd(machine_crd()).start().await?;
    let workload = sim(0).await?;
    let (manage, work) = (management.client(), workload.client());
    let id = "docker:///workload/worker-0";
    let mut held = machine("default", "workers-0", "worker-0", id);
    // A pre-terminate hook holds Cluster API's deletion until the test lets it go.
    held.metadata.annotations = Some(
        [(
            "pre-terminate.delete.hook.machine.cluster.x-k8s.io/backup".to_owned(),
            "ops".to_owned(),
        )]
        .into(),
    );
    create_machine(&manage, &held).await?;
    machine_node(
        &work,
        "worker-0",
        id,
        Some(node_annotations("default", "workers-0")),
    )
    .await?;
    let controller = MachineController::start(manage.clone(), work.clone());
    let _controller = start(&workload, &management)?;
    wait_for("the finalizer", || has_finalizer(&work, "worker-0")).await?;

    let machines: Api<kube::api::DynamicObject> =
        Api::namespaced_with(manage.clone(), "default", &machine_resource());
    machines
        .delete("workers-0", &kube::api::DeleteParams::default())
        .await?;
    delete_node(&work, "worker-0").await?;
    wait_for("the controller waiting on the deleting Machine", || async {
        let node = Api::<Node>::all(work.clone()).get_opt("worker-0").await?;
        Ok(node.is_some_and(|node| {
            node.status
                .and_then(|status| status.conditions)
                .is_some_and(|conditions| {
                    conditions.iter().any(|condition| {
                        condition
                            .message
                            .as_deref()
                            .is_some_and(|m| m.contains("instance provider cluster-api"))
                    })
                })
        }))
    })
    .await?;
    // Not deleted a second time, so not annotated by us either.
    let annotations = machine_annotations(&manage, "workers-0")
        .await?
        .context("workers-0")?;
    ensure!(
        !annotations.contains_key(EXCLUDE_DRAINING),
        "{annotations:?}"
    );
    machines
        .patch(
            "workers-0",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"metadata": {"annotations": {"pre-terminate.delete.hook.machine.cluster.x-k8s.io/backup": null}}})),
        )
        .await?;
    wait_for("the node released", || node_gone(&work, "worker-0")).await?;
    ensure!(
        controller
            .steps()
            .contains(&Step::Removed("workers-0".to_owned()))
    );
    Ok(())
}

/// The outside check's leak: Cluster API before v1.11 serves Machines as v1beta1 only. The
/// Machine is found there, deleted by UID, and the node released once it is gone.
#[tokio::test]
async fn a_machine_served_only_as_v1beta1_is_deleted_before_its_node_goes() -> Result<()> {
    let management = Cluster::new(0)
        .crd(machine_crd_serving(&["v1beta1"]))
        .start()
        .await?;
    let workload = sim(0).await?;
    let (manage, work) = (management.client(), workload.client());
    let id = "docker:///workload/worker-0";
    let mut old = machine("default", "workers-0", "worker-0", id);
    // No machine controller of v1beta1 here: the delete ends the Machine at once.
    old.metadata.finalizers = None;
    let v1beta1 = machine_resource_in("v1beta1");
    old.types = Some(kube::api::TypeMeta {
        api_version: v1beta1.api_version.clone(),
        kind: "Machine".to_owned(),
    });
    create_machine(&manage, &old).await?;
    machine_node(
        &work,
        "worker-0",
        id,
        Some(node_annotations("default", "workers-0")),
    )
    .await?;
    let _controller = start(&workload, &management)?;
    wait_for("the finalizer", || has_finalizer(&work, "worker-0")).await?;
    delete_node(&work, "worker-0").await?;
    wait_for("the node released", || node_gone(&work, "worker-0")).await?;
    let machines: Api<kube::api::DynamicObject> =
        Api::namespaced_with(manage.clone(), "default", &v1beta1);
    ensure!(
        machines.get_opt("workers-0").await?.is_none(),
        "released while its Machine runs"
    );
    Ok(())
}

/// A management cluster without Machines in any version this provider reads: the node is
/// held with a Warning that says so, past the not-found confirmation (2 s here), and tried
/// again on the backoff.
#[tokio::test]
async fn without_machines_in_the_management_cluster_the_node_is_held() -> Result<()> {
    let management = Cluster::new(0).start().await?;
    let workload = sim(0).await?;
    let work = workload.client();
    machine_node(
        &work,
        "worker-0",
        "docker:///workload/worker-0",
        Some(node_annotations("default", "workers-0")),
    )
    .await?;
    let _controller = start(&workload, &management)?;
    wait_for("the finalizer", || has_finalizer(&work, "worker-0")).await?;
    delete_node(&work, "worker-0").await?;
    wait_for("the Warning", || {
        warned(&work, "worker-0", "the management cluster has no Machines")
    })
    .await?;
    // Three failures take 3 s of backoff, past the 2 s a machine gone would need.
    wait_for("three tries", || async {
        let events: Api<k8s_openapi::api::events::v1::Event> =
            Api::namespaced(work.clone(), "default");
        Ok(events
            .list(&kube::api::ListParams::default())
            .await?
            .items
            .iter()
            .any(|event| {
                event.reason.as_deref() == Some("InstanceTerminationFailed")
                    && event
                        .series
                        .as_ref()
                        .is_some_and(|series| series.count >= 3)
            }))
    })
    .await?;
    ensure!(
        !node_gone(&work, "worker-0").await?,
        "released without a Machine gone"
    );
    Ok(())
}
