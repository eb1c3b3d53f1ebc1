//! Server-side apply with field ownership, as kube-rs sees it: managedFields per manager and
//! operation, 409 conflicts between managers unless forced, fields a manager stops applying
//! removed, Updates recorded and taking ownership (structured-merge-diff, apiserver
//! handlers/fieldmanager).

use anyhow::{Result, ensure};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{Patch, PatchParams};
use kube_sim::{KubeSim, SimOptions, WorldOptions};
use serde_json::{Value, json};

async fn bare() -> Result<KubeSim> {
    Ok(KubeSim::start(SimOptions {
        world: WorldOptions::none(),
        ..SimOptions::default()
    })
    .await?)
}

fn lease(holder: &str) -> Value {
    json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "lock"}, "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15}})
}

fn managers(lease: &Lease) -> Vec<(String, String)> {
    lease
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .map(|e| {
            (
                e.manager.clone().unwrap_or_default(),
                e.operation.clone().unwrap_or_default(),
            )
        })
        .collect()
}

#[tokio::test]
async fn a_second_manager_applying_another_value_conflicts_unless_forced() -> Result<()> {
    let sim = bare().await?;
    let leases: Api<Lease> = Api::namespaced(sim.client_without_retries().await?, "default");
    let created = leases
        .patch(
            "lock",
            &PatchParams::apply("candidate-a"),
            &Patch::Apply(lease("a")),
        )
        .await?;
    ensure!(
        managers(&created) == [("candidate-a".to_owned(), "Apply".to_owned())],
        "{:?}",
        managers(&created)
    );
    let fields = created.metadata.managed_fields.as_ref().unwrap()[0]
        .fields_v1
        .as_ref()
        .unwrap()
        .0
        .clone();
    ensure!(
        fields == json!({"f:spec": {"f:holderIdentity": {}, "f:leaseDurationSeconds": {}}}),
        "{fields}"
    );
    let refused = leases
        .patch(
            "lock",
            &PatchParams::apply("candidate-b"),
            &Patch::Apply(lease("b")),
        )
        .await
        .unwrap_err();
    let kube::Error::Api(status) = refused else {
        anyhow::bail!("expected a conflict, got {refused:?}")
    };
    ensure!(
        status.code == 409
            && status.reason == "Conflict"
            && status.message
                == "Apply failed with 1 conflict: conflict with \"candidate-a\": .spec.holderIdentity",
        "{status:?}"
    );
    // The same values are shared, not contested.
    leases
        .patch(
            "lock",
            &PatchParams::apply("candidate-b"),
            &Patch::Apply(lease("a")),
        )
        .await?;
    let forced = leases
        .patch(
            "lock",
            &PatchParams::apply("candidate-b").force(),
            &Patch::Apply(lease("b")),
        )
        .await?;
    ensure!(
        forced.spec.as_ref().unwrap().holder_identity.as_deref() == Some("b"),
        "{forced:?}"
    );
    Ok(())
}

#[tokio::test]
async fn updates_take_ownership_and_dropped_fields_are_removed() -> Result<()> {
    let sim = bare().await?;
    let pods: Api<Pod> = Api::namespaced(sim.client(), "default");
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": {"a": "1", "b": "2"}}, "spec": {"containers": [{"name": "c", "image": "one"}]}});
    pods.patch("p", &PatchParams::apply("deployer"), &Patch::Apply(&pod))
        .await?;
    // Another manager changes the image with a merge patch: it owns that field now.
    let edited = pods
        .patch(
            "p",
            &PatchParams {
                field_manager: Some("editor".to_owned()),
                ..PatchParams::default()
            },
            &Patch::Strategic(json!({"spec": {"containers": [{"name": "c", "image": "two"}]}, "metadata": {"labels": {"b": "3"}}})),
        )
        .await?;
    let entries = edited.metadata.managed_fields.clone().unwrap_or_default();
    let editor = entries
        .iter()
        .find(|e| e.manager.as_deref() == Some("editor"))
        .ok_or_else(|| anyhow::anyhow!("no editor entry: {entries:?}"))?;
    ensure!(editor.operation.as_deref() == Some("Update"), "{editor:?}");
    // The deployer re-applies without label b and with its image: the image conflicts with
    // the editor's; label a stays the deployer's, b (the editor's now) stays.
    let mut reapplied = pod.clone();
    reapplied["metadata"]["labels"] = json!({"a": "1"});
    let conflict = pods
        .patch(
            "p",
            &PatchParams::apply("deployer"),
            &Patch::Apply(&reapplied),
        )
        .await
        .unwrap_err();
    ensure!(
        format!("{conflict}").contains(r#".spec.containers[name="c"].image"#),
        "{conflict}"
    );
    reapplied["spec"]["containers"][0]["image"] = json!("two");
    reapplied["metadata"]["labels"] = json!({});
    let after = pods
        .patch(
            "p",
            &PatchParams::apply("deployer"),
            &Patch::Apply(&reapplied),
        )
        .await?;
    let labels = after.metadata.labels.unwrap_or_default();
    ensure!(
        !labels.contains_key("a") && labels.get("b").map(String::as_str) == Some("3"),
        "a was only the deployer's and is gone, b is the editor's: {labels:?}"
    );
    Ok(())
}
