//! CSI volumes through the real kubectl: the names a node's status gives them, as the kubelet
//! and the attach/detach controller write and read them.

use std::time::Duration;

use anyhow::{Result, ensure};

use crate::common::kubectl_sim;
use kubectl_sim::{Sim, kubectl_missing};

const WAIT: Duration = Duration::from_secs(30);

/// A PersistentVolume `data` of `driver` whose handle is not its name (as with every real
/// driver), its claim, and a pod on node-0 using it.
fn workload(driver: &str) -> String {
    format!(
        "
apiVersion: v1
kind: PersistentVolume
metadata: {{name: data}}
spec:
  accessModes: [ReadWriteOnce]
  capacity: {{storage: 1Gi}}
  csi: {{driver: {driver}, volumeHandle: vol-0a1b2c}}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: data}}
spec:
  accessModes: [ReadWriteOnce]
  volumeName: data
  resources: {{requests: {{storage: 1Gi}}}}
---
apiVersion: v1
kind: Pod
metadata: {{name: db}}
spec:
  nodeName: node-0
  containers: [{{name: c, image: postgres}}]
  volumes: [{{name: data, persistentVolumeClaim: {{claimName: data}}}}]
"
    )
}

/// The kubelet and the attach/detach controller name the volume
/// `kubernetes.io/csi/<driver>^<volumeHandle>`; a node status written that way by anyone is
/// read the same way: the volume of a pod force-deleted from a dead node stays attached while
/// the node reports it in use, until the out-of-service taint.
#[test]
fn csi_volumes_are_named_by_driver_and_handle_in_the_node_status() -> Result<()> {
    if kubectl_missing() {
        return Ok(());
    }
    let sim = Sim::with_quick_leases()?;
    sim.apply(&workload("sim.csi.nodegrace.io"))?;
    let unique = "kubernetes.io/csi/sim.csi.nodegrace.io^vol-0a1b2c";
    sim.wait_for("db to run on its attached volume", "pods", WAIT, |sim| {
        Ok(sim.jsonpath(&["pod", "db"], "{.status.phase}")? == "Running")
    })?;
    sim.wait_for("node-0 to report the volume", "nodes", WAIT, |sim| {
        let reported = sim.jsonpath(
            &["node", "node-0"],
            "{.status.volumesInUse[*]} {.status.volumesAttached[*].name}",
        )?;
        Ok(reported == format!("{unique} {unique}"))
    })?;
    let attachment = sim.ok(&["get", "volumeattachments", "-o", "name"])?;
    let attachment = attachment.trim();
    ensure!(!attachment.is_empty(), "no VolumeAttachment");
    sim.stop_kubelet("node-0")?;
    // The status as the real kubelet would have left it, written by a client.
    sim.ok(&[
        "patch",
        "node",
        "node-0",
        "--subresource=status",
        "--type=merge",
        "-p",
        &format!(r#"{{"status":{{"volumesInUse":["{unique}"]}}}}"#),
    ])?;
    sim.ok(&["delete", "pod", "db", "--grace-period=0", "--force"])?;
    sim.wait_node_unknown("node-0", WAIT)?;
    let deleting = sim.jsonpath(&[attachment], "{.metadata.deletionTimestamp}")?;
    ensure!(
        deleting.is_empty(),
        "detached while node-0 reports the volume in use"
    );
    sim.taint_out_of_service("node-0")?;
    sim.wait_for("the forced detach", "volumeattachments", WAIT, |sim| {
        Ok(sim
            .ok(&["get", "volumeattachments", "-o", "name"])?
            .trim()
            .is_empty())
    })
}

/// Only the simulated driver has an attacher: another driver's volume gets no attachment (as
/// with `attachRequired: false`) and is mounted, and reported in use, under its own name.
#[test]
fn another_drivers_volume_is_mounted_without_an_attachment() -> Result<()> {
    if kubectl_missing() {
        return Ok(());
    }
    let sim = Sim::start(1)?;
    sim.apply(&workload("ebs.csi.aws.com"))?;
    sim.wait_for("db to run", "pods", WAIT, |sim| {
        Ok(sim.jsonpath(&["pod", "db"], "{.status.phase}")? == "Running")
    })?;
    sim.wait_for("the volume in use", "nodes", WAIT, |sim| {
        let in_use = sim.jsonpath(&["node", "node-0"], "{.status.volumesInUse[*]}")?;
        Ok(in_use == "kubernetes.io/csi/ebs.csi.aws.com^vol-0a1b2c")
    })?;
    let attachments = sim.ok(&["get", "volumeattachments", "-o", "name"])?;
    ensure!(attachments.trim().is_empty(), "{attachments}");
    Ok(())
}
