//! The plugin's own promises, from outside: its help, and bad input answered with one line
//! that names what to fix.

use anyhow::{Result, ensure};
use kube_sim::{KubeSim, SimOptions};

use crate::plugin::Kubectl;

#[tokio::test]
async fn help_and_bad_input_name_the_fix() -> Result<()> {
    let sim = KubeSim::start(SimOptions {
        nodes: 1,
        ..SimOptions::default()
    })
    .await?;
    let kubectl = Kubectl::new(sim.kubeconfig_path())?;
    let help = kubectl.nodegrace(&["--help"]).await?;
    for expected in [
        "status",
        "explain",
        "plan",
        "--kubeconfig",
        "--context",
        "--namespace",
        "--output",
    ] {
        ensure!(help.contains(expected), "{expected:?} in\n{help}");
    }
    let format = kubectl.nodegrace_fails(&["status", "-o", "xml"]).await?;
    ensure!(
        format.contains("'xml'") && format.contains("[possible values: table, json, yaml]"),
        "{format}"
    );
    let missing = kubectl
        .nodegrace_fails(&["explain", "node", "node-9"])
        .await?;
    ensure!(
        missing.trim() == "Error: node node-9 not found (`kubectl get nodes` lists them)",
        "{missing}"
    );
    let nowhere = Kubectl::new(&sim.kubeconfig_path().with_file_name("absent.kubeconfig"))?;
    let unread = nowhere.nodegrace_fails(&["status"]).await?;
    ensure!(unread.contains("absent.kubeconfig"), "{unread}");
    let healthy = kubectl.json(&["status", "node-0"]).await?;
    ensure!(healthy["nodes"][0]["state"] == "healthy", "{healthy:#}");
    // YAML is the same document as JSON.
    let yaml = kubectl
        .nodegrace(&["status", "node-0", "-o", "yaml"])
        .await?;
    let mut from_yaml: serde_json::Value = serde_yaml_ng::from_str(&yaml)?;
    let mut from_json = healthy;
    for document in [&mut from_yaml, &mut from_json] {
        document
            .as_object_mut()
            .map(|object| object.remove("observedAt"));
    }
    ensure!(from_yaml == from_json, "{yaml}");
    Ok(())
}
