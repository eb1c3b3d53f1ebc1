//! The pod garbage collector's sweeps (pkg/controller/podgc), seen through the real kubectl.

use std::time::Duration;

use anyhow::{Result, ensure};

use crate::common::kubectl_sim;
use kubectl_sim::{Sim, kubectl_missing};

const WAIT: Duration = Duration::from_secs(30);

/// A pod manifest: `node` empty leaves it unbound (no node matches its selector).
fn pod(name: &str, node: &str, finalizer: bool) -> String {
    let finalizers = if finalizer {
        "[example.com/keep]"
    } else {
        "[]"
    };
    let placement = if node.is_empty() {
        "nodeSelector: {pool: none}".to_owned()
    } else {
        format!("nodeName: {node}")
    };
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, finalizers: {finalizers}}}\n\
         spec:\n  {placement}\n  containers: [{{name: c, image: nginx}}]\n"
    )
}

fn exists(sim: &Sim, name: &str) -> Result<bool> {
    Ok(!sim
        .ok(&[
            "get",
            "pods",
            "--field-selector",
            &format!("metadata.name={name}"),
            "-o",
            "name",
        ])?
        .trim()
        .is_empty())
}

fn release(sim: &Sim, name: &str) -> Result<()> {
    sim.ok(&[
        "patch",
        "pod",
        name,
        "--type=merge",
        "-p",
        r#"{"metadata":{"finalizers":null}}"#,
    ])?;
    Ok(())
}

/// gcOrphaned: once the quarantine has passed, the pods bound to a deleted Node are marked
/// Failed with the DisruptionTarget condition `DeletionByPodGC` and deleted with grace 0; a
/// live node's pods stay.
#[test]
fn pods_of_a_deleted_node_are_marked_and_deleted_after_the_quarantine() -> Result<()> {
    if kubectl_missing() {
        return Ok(());
    }
    let sim = Sim::start_with(2, &["--pod-gc-period=200ms", "--pod-gc-quarantine=1s"])?;
    sim.apply(&pod("held", "node-1", true))?;
    sim.apply(&pod("plain", "node-1", false))?;
    sim.apply(&pod("elsewhere", "node-0", false))?;
    sim.wait_for("the pods to run", "pods", WAIT, |sim| {
        let phases = sim.ok(&["get", "pods", "-o", "jsonpath={.items[*].status.phase}"])?;
        Ok(phases == "Running Running Running")
    })?;
    sim.ok(&["delete", "node", "node-1"])?;
    sim.wait_for("node-1's pods collected", "pods", WAIT, |sim| {
        let grace = sim.jsonpath(&["pod", "held"], "{.metadata.deletionGracePeriodSeconds}")?;
        Ok(!exists(sim, "plain")? && grace == "0")
    })?;
    let phase = sim.jsonpath(&["pod", "held"], "{.status.phase}")?;
    ensure!(phase == "Failed", "{phase}");
    let condition = sim.jsonpath(
        &["pod", "held"],
        r#"{.status.conditions[?(@.type=="DisruptionTarget")]}"#,
    )?;
    let condition: serde_json::Value = serde_json::from_str(&condition)?;
    ensure!(
        condition["status"] == "True"
            && condition["reason"] == "DeletionByPodGC"
            && condition["message"] == "PodGC: node no longer exists",
        "{condition}"
    );
    let elsewhere = sim.jsonpath(
        &["pod", "elsewhere"],
        "{.status.phase} {.metadata.deletionTimestamp}",
    )?;
    ensure!(elsewhere.trim() == "Running", "{elsewhere}");
    release(&sim, "held")?;
    sim.wait_for("held to be gone", "pods", WAIT, |sim| {
        Ok(!exists(sim, "held")?)
    })
}

/// gcTerminating (KEP-2268): a pod deleted gracefully on a node whose kubelet died stays
/// Terminating until the node, NotReady, gets the out-of-service taint; the next sweep marks
/// it Failed and deletes it with grace 0.
#[test]
fn a_terminating_pod_on_an_out_of_service_node_is_marked_and_deleted() -> Result<()> {
    if kubectl_missing() {
        return Ok(());
    }
    let sim = Sim::start_with(
        1,
        &[
            "--pod-gc-period=200ms",
            "--node-lease-renew-interval=200ms",
            "--node-monitor-grace-period=1s",
        ],
    )?;
    sim.apply(&pod("stuck", "node-0", true))?;
    sim.wait_for("stuck to run", "pods", WAIT, |sim| {
        Ok(sim.jsonpath(&["pod", "stuck"], "{.status.phase}")? == "Running")
    })?;
    sim.stop_kubelet("node-0")?;
    sim.ok(&["delete", "pod", "stuck", "--wait=false"])?;
    sim.wait_node_unknown("node-0", WAIT)?;
    let before = sim.jsonpath(
        &["pod", "stuck"],
        "{.status.phase} {.metadata.deletionGracePeriodSeconds}",
    )?;
    ensure!(before == "Running 30", "{before}");
    sim.taint_out_of_service("node-0")?;
    sim.wait_for(
        "stuck marked Failed and deleted with grace 0",
        "pods",
        WAIT,
        |sim| {
            let after = sim.jsonpath(
                &["pod", "stuck"],
                "{.status.phase} {.metadata.deletionGracePeriodSeconds}",
            )?;
            Ok(after == "Failed 0")
        },
    )?;
    release(&sim, "stuck")?;
    sim.wait_for("stuck to be gone", "pods", WAIT, |sim| {
        Ok(!exists(sim, "stuck")?)
    })
}

/// gcUnscheduledTerminating: a pod never bound, deleted while a finalizer holds it, is marked
/// Failed (the API server gave its deletion no grace: no kubelet runs it).
#[test]
fn a_terminating_pod_never_bound_is_marked_failed() -> Result<()> {
    if kubectl_missing() {
        return Ok(());
    }
    let sim = Sim::start_with(0, &["--pod-gc-period=200ms"])?;
    sim.apply(&pod("waiting", "", true))?;
    ensure!(sim.jsonpath(&["pod", "waiting"], "{.status.phase}")? == "Pending");
    sim.ok(&["delete", "pod", "waiting", "--wait=false"])?;
    sim.wait_for("waiting to be marked Failed", "pods", WAIT, |sim| {
        Ok(sim.jsonpath(&["pod", "waiting"], "{.status.phase}")? == "Failed")
    })?;
    let grace = sim.jsonpath(
        &["pod", "waiting"],
        "{.metadata.deletionGracePeriodSeconds}",
    )?;
    ensure!(grace == "0", "{grace}");
    release(&sim, "waiting")?;
    sim.wait_for("waiting to be gone", "pods", WAIT, |sim| {
        Ok(!exists(sim, "waiting")?)
    })
}

fn finish(sim: &Sim, name: &str, status: &str) -> Result<()> {
    sim.ok(&[
        "patch",
        "pod",
        name,
        "--subresource=status",
        "--type=merge",
        "-p",
        &format!(r#"{{"status":{status}}}"#),
    ])?;
    Ok(())
}

/// gcTerminated past `--terminated-pod-gc-threshold`: beyond the threshold, an evicted pod goes
/// before older finished ones, then the oldest; pods not finished stay.
#[test]
fn finished_pods_beyond_the_threshold_go_evicted_first_then_oldest() -> Result<()> {
    if kubectl_missing() {
        return Ok(());
    }
    let sim = Sim::start_with(
        0,
        &["--pod-gc-period=200ms", "--terminated-pod-gc-threshold=3"],
    )?;
    for name in ["done-1", "done-2", "done-3", "evicted", "done-4", "pending"] {
        sim.apply(&pod(name, "", false))?;
    }
    // Three finished pods are within the threshold; the fourth finished is one too many.
    for name in ["done-1", "done-2", "done-3"] {
        finish(&sim, name, r#"{"phase":"Succeeded"}"#)?;
    }
    finish(&sim, "evicted", r#"{"phase":"Failed","reason":"Evicted"}"#)?;
    sim.wait_for("the evicted pod to go", "pods", WAIT, |sim| {
        Ok(!exists(sim, "evicted")?)
    })?;
    ensure!(
        exists(&sim, "done-1")?,
        "the oldest went before the evicted one"
    );
    finish(&sim, "done-4", r#"{"phase":"Succeeded"}"#)?;
    sim.wait_for("the oldest finished pod to go", "pods", WAIT, |sim| {
        Ok(!exists(sim, "done-1")?)
    })?;
    let left = sim.ok(&["get", "pods", "-o", "jsonpath={.items[*].metadata.name}"])?;
    ensure!(left == "done-2 done-3 done-4 pending", "{left}");
    Ok(())
}
