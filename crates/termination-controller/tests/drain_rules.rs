//! NodeDrainRules through the controller and `plan`: an order within the tier, a pod waited
//! for until it finishes, a pod skipped by its own label.

use crate::common::*;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};

async fn rule(client: &kube::Client, name: &str, spec: Value) -> Result<()> {
    create(
        client,
        json!({"apiVersion": "nodegrace.io/v1alpha1", "kind": "NodeDrainRule",
            "metadata": {"name": name}, "spec": spec}),
    )
    .await
}

/// The namespace `reports`, labelled `team: data`.
async fn reports_namespace(client: &kube::Client) -> Result<()> {
    create(
        client,
        json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": "reports", "labels": {"team": "data"}}}),
    )
    .await
}

/// `replicas` pods of `app`, all on node-1.
async fn on_node_1(client: &kube::Client, name: &str, replicas: i32) -> Result<()> {
    let on_node_1 = json!({"spec": {"nodeSelector": {"kubernetes.io/hostname": "node-1"}}});
    Ok(app(name, replicas).pod(&on_node_1).create(client).await?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_order_the_tier_wait_for_a_job_and_a_pods_own_label_skips_it() -> Result<()> {
    let sim = sim(2).await?;
    let client = sim.client();
    reports_namespace(&client).await?;
    on_node_1(&client, "web", 2).await?;
    on_node_1(&client, "proxy", 2).await?;
    create(&client, json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "report", "namespace": "reports"},
        "spec": {"nodeName": "node-1", "restartPolicy": "Never", "containers": [{"name": "c", "image": "app"}]}})).await?;
    create(&client, json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "cache", "namespace": "default", "labels": {"nodegrace.io/drain": "skip"}},
        "spec": {"nodeName": "node-1", "containers": [{"name": "c", "image": "app"}]}})).await?;
    rule(
        &client,
        "proxies-last",
        json!({"drain": {"behavior": "Drain", "order": 10},
            "pods": [{"selector": {"matchLabels": {"app": "proxy"}}}]}),
    )
    .await?;
    rule(
        &client,
        "data-jobs",
        json!({"drain": {"behavior": "WaitCompleted"},
            "nodes": [{"selector": {"matchLabels": {"kubernetes.io/os": "linux"}}}],
            "pods": [{"namespaceSelector": {"matchLabels": {"team": "data"}}}]}),
    )
    .await?;
    // The CRD's rule refuses an order on a rule that evicts nothing.
    let refused = rule(
        &client,
        "refused",
        json!({"drain": {"behavior": "Skip", "order": 1}}),
    )
    .await
    .err()
    .context("the CRD refuses an order with Skip")?;
    ensure!(
        format!("{refused:#}").contains("spec.drain.order applies only to behavior Drain"),
        "{refused:#}"
    );
    for app in ["web", "proxy"] {
        wait_ready(&client, app, 2).await?;
    }

    // What plan says first.
    let planned: Value = serde_json::from_str(&plan(&sim, "node-1", true)?)?;
    let tiers: Vec<(i64, Vec<(String, Value)>)> = planned["tiers"]
        .as_array()
        .context("tiers")?
        .iter()
        .map(|tier| {
            (
                tier["order"].as_i64().unwrap_or_default(),
                tier["pods"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|pod| {
                        (
                            pod["pod"]
                                .as_str()
                                .unwrap_or_default()
                                .split('-')
                                .next()
                                .unwrap_or_default()
                                .to_owned(),
                            pod["rule"].clone(),
                        )
                    })
                    .collect(),
            )
        })
        .collect();
    ensure!(
        tiers
            == vec![
                (0, vec![("default/web".to_owned(), Value::Null); 2]),
                (
                    10,
                    vec![
                        (
                            "default/proxy".to_owned(),
                            json!("NodeDrainRule proxies-last")
                        );
                        2
                    ]
                ),
            ],
        "{planned:#}"
    );
    let text = planned.to_string();
    ensure!(
        text.contains("reports/report") && text.contains("NodeDrainRule data-jobs: WaitCompleted"),
        "{planned:#}"
    );
    ensure!(
        text.contains("nodegrace.io/drain=skip: Skip; it goes with the machine"),
        "{planned:#}"
    );
    let table = plan(&sim, "node-1", false)?;
    ensure!(
        table.contains("workloads (order 10)") && table.contains("RULE"),
        "{table}"
    );

    // Then what the drain does.
    let _controller = managing(&sim, &[]).await?;
    let seen = record(&client);
    delete_node(&client, "node-1").await?;
    wait_for("node-1 to wait for its report to finish", || async {
        Ok(condition(&client, "node-1", "Terminating")
            .await?
            .is_some_and(|(reason, message)| {
                reason == "AwaitingPodCompletion"
                    && message.contains("Pod report: NodeDrainRule data-jobs: WaitCompleted")
            }))
    })
    .await?;
    let log = seen.log.lock().expect("log").clone();
    let index_of = |wanted: &dyn Fn(&Seen) -> bool| log.iter().position(|(_, seen)| wanted(seen));
    let last_web_gone = log
        .iter()
        .rposition(|(_, seen)| matches!(seen, Seen::Gone(pod) if pod.starts_with("web-")))
        .context("web pods gone")?;
    let first_proxy_leaving =
        index_of(&|seen| matches!(seen, Seen::Leaving(pod) if pod.starts_with("proxy-")))
            .context("proxy pods evicted")?;
    ensure!(
        last_web_gone < first_proxy_leaving,
        "order 10 began before order 0 was gone: {log:?}"
    );
    ensure!(
        index_of(&|seen| matches!(seen, Seen::Leaving(pod) if pod == "report" || pod == "cache"))
            .is_none(),
        "neither the waited-for nor the skipped pod is evicted: {log:?}"
    );

    // The report finishes (as its kubelet would record it): the node goes.
    let reports: Api<Pod> = Api::namespaced(client.clone(), "reports");
    reports
        .patch_status(
            "report",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Succeeded"}})),
        )
        .await?;
    wait_for("node-1 to go once the report finished", || {
        node_gone(&client, "node-1")
    })
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_drain_rule_crd_the_controller_drains_without_rules() -> Result<()> {
    let sim = sim(2).await?;
    let client = sim.client();
    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        Api::all(client.clone());
    crds.delete(
        "nodedrainrules.nodegrace.io",
        &kube::api::DeleteParams::default(),
    )
    .await?;
    wait_for("the NodeDrainRule API gone", || async {
        let rules: Api<termination_controller::api::NodeDrainRule> = Api::all(client.clone());
        Ok(rules.list(&kube::api::ListParams::default()).await.is_err())
    })
    .await?;
    let _controller = managing(&sim, &[]).await?;
    delete_node(&client, "node-1").await?;
    wait_for("node-1 to go", || node_gone(&client, "node-1")).await
}

/// A drain held by rules goes on when they stop applying, with nothing else in the cluster
/// changing: a rule deleted, a namespace relabelled. (The tasks past their grants wake on
/// their own Node and on what every drain reads, not on other nodes' changes.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_held_by_rules_goes_on_when_a_rule_or_a_namespace_label_changes() -> Result<()> {
    let sim = sim(2).await?;
    let client = sim.client();
    reports_namespace(&client).await?;
    for (name, namespace, labels) in [
        ("report", "reports", json!({})),
        ("batch", "default", json!({"job": "batch"})),
    ] {
        create(&client, json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "spec": {"nodeName": "node-1", "restartPolicy": "Never", "containers": [{"name": "c", "image": "app"}]}})).await?;
    }
    rule(
        &client,
        "data-jobs",
        json!({"drain": {"behavior": "WaitCompleted"},
            "pods": [{"namespaceSelector": {"matchLabels": {"team": "data"}}}]}),
    )
    .await?;
    rule(
        &client,
        "batch-jobs",
        json!({"drain": {"behavior": "WaitCompleted"},
            "pods": [{"selector": {"matchLabels": {"job": "batch"}}}]}),
    )
    .await?;
    let _controller = managing(&sim, &[]).await?;
    delete_node(&client, "node-1").await?;
    let waiting_for = |pod: &'static str| {
        let client = client.clone();
        move || {
            let client = client.clone();
            async move {
                Ok(condition(&client, "node-1", "Terminating")
                    .await?
                    .is_some_and(|(reason, message)| {
                        reason == "AwaitingPodCompletion" && message.contains(pod)
                    }))
            }
        }
    };
    wait_for("node-1 to wait for its batch pod", waiting_for("Pod batch")).await?;
    let rules: Api<termination_controller::api::NodeDrainRule> = Api::all(client.clone());
    rules
        .delete("batch-jobs", &kube::api::DeleteParams::default())
        .await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    wait_for("the batch pod evicted once its rule is gone", || async {
        Ok(pods.get_opt("batch").await?.is_none())
    })
    .await?;
    wait_for("node-1 to wait for its report", waiting_for("Pod report")).await?;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .patch(
            "reports",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"team": "web"}}})),
        )
        .await?;
    wait_for("node-1 to go once its namespace left the rule", || {
        node_gone(&client, "node-1")
    })
    .await
}
