//! Act: the operator turns on Kubernetes 1.37's alpha EvictionRequest API for the drain
//! (`helm upgrade … --set eviction.api=eviction-request`). A new machine joins as node-3 and
//! runs the `orders/db` database, whose pod names its operator as an eviction responder; the
//! operator deletes node-3.
//! termination-controller asks for each pod with an EvictionRequest instead of calling the
//! Eviction API: kube-sim's evictionrequest-controller hands the database's pod to its operator
//! (played by the act: a heartbeat, then it deletes the pod itself), and every other pod to the
//! default evictor, which asks the Eviction API within the budgets. No request is left once the
//! machine is terminated and the Node gone.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::lifecycle::v1alpha1::{Eviction, EvictionRequest};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, Preconditions};
use kube::{Api, Client};
use kube_sim::audit::Evicted;
use serde_json::json;

use super::Act;
use super::node_termination::{sim_get, wait_gone, wait_terminating};
use crate::chart;
use crate::manifests::{self, describe_all};
use crate::stage::{AGENTS_NAMESPACE, Stage, TERMINATION_CONTROLLER, pod_ready};
use crate::timeline::seconds;
use crate::wait::poll_for;

pub const ACT: Act = Act {
    slug: "eviction-request",
    title: "EvictionRequest (Kubernetes 1.37, alpha): node-3's database handed to its operator",
    play: |stage| Box::pin(play(stage)),
};

/// A machine of its own, so the nodes the other acts tell about stay for `--keep`.
const NODE: &str = "node-3";
const NAMESPACE: &str = "orders";
const DB: &str = "db-0";
const RESPONDER: &str = "db-operator.example.com/failover";
const MIGRATING: &str = "handing the primary over to the standby; the pod goes after";
const ORDERS: &str = include_str!("../../demo/orders.yaml");
const SETTING: &str = "eviction.api=eviction-request";
/// The rollout takes up to a lease duration (15 s) to hand the lead over; the drain, seconds.
const TIMEOUT: Duration = Duration::from_secs(60);

async fn play(stage: &mut Stage) -> Result<()> {
    let client = stage.client().clone();
    turn_on(stage).await?;
    stage
        .kubectl(&["api-resources", "--api-group=lifecycle.k8s.io"], true)
        .await?;

    stage.join(NODE).await?;
    stage.timeline.event(&format!(
        "a new machine joins: {NODE}, its elogind booted and its Node registered; our \
         DaemonSets' pods are Ready there"
    ));
    let objects = manifests::parse_documents(ORDERS)?;
    for object in &objects {
        manifests::create(&client, object, NAMESPACE).await?;
    }
    let (_, db_uid) = db_running(&client, |node| node == NODE).await?;
    stage.timeline.event(&format!(
        "created {}: {DB} runs on {NODE}; its pod names {RESPONDER} as its eviction responder",
        describe_all(&objects)
    ));

    Api::<k8s_openapi::api::core::v1::Node>::all(client.clone())
        .delete(NODE, &DeleteParams::default())
        .await
        .with_context(|| format!("delete {NODE}"))?;
    let deleted = Instant::now();
    stage.timeline.event(&format!(
        "the operator runs `kubectl delete node {NODE}`; termination-controller cordons it and \
         asks for each of its pods with an EvictionRequest"
    ));

    let eviction = active_for(&client, &db_uid).await?;
    heartbeat(&client, &eviction).await?;
    stage.timeline.event(&format!(
        "kube-sim's evictionrequest-controller made Eviction {NAMESPACE}/{eviction} with \
         {RESPONDER} active; the operator (played by the demo) heartbeats: \"{MIGRATING}\""
    ));
    let told = wait_terminating(&client, NODE, |_, message| {
        message.contains(&format!("handed to {RESPONDER}: {MIGRATING}"))
    })
    .await?;
    // The node is gone by the end: its condition is told as read now.
    stage.timeline.ran(
        &format!(
            "kubectl get node {NODE} -o jsonpath='{{.status.conditions[?(@.type==\"Terminating\")].message}}'"
        ),
        &told,
        false,
    );
    stage
        .kubectl(
            &[
                "-n",
                NAMESPACE,
                "get",
                "evictionrequests.lifecycle.k8s.io,evictions.lifecycle.k8s.io",
            ],
            false,
        )
        .await?;
    stage
        .kubectl(
            &[
                "-n",
                NAMESPACE,
                "get",
                "evictions.lifecycle.k8s.io",
                "-o",
                "custom-columns=EVICTION:.metadata.name,POD:.spec.target.pod.name,\
                 RESPONDERS:.status.targetResponders[*].name,\
                 ACTIVE:.status.targetResponders[?(@.state==\"Active\")].name",
            ],
            false,
        )
        .await?;

    // The operator has moved the primary away: it deletes the pod, bound to its UID.
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let bound = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(db_uid.clone()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    pods.delete(DB, &bound)
        .await
        .with_context(|| format!("the operator deletes {DB}"))?;
    stage.timeline.event(&format!(
        "the standby is primary now: the operator deletes {DB} itself"
    ));

    wait_gone(&client, NODE).await?;
    stage.machine_terminated(NODE);
    stage.timeline.event(&format!(
        "{NODE} drained, its machine terminated, and the Node gone {} after the delete",
        seconds(deleted.elapsed())
    ));
    judge(stage, &db_uid).await?;
    Ok(())
}

/// `helm upgrade` with the alpha API chosen, then waits until the rollout's pods run and one of
/// them leads.
async fn turn_on(stage: &Stage) -> Result<()> {
    let started = Instant::now();
    let values = stage
        .values_dir
        .join(format!("{TERMINATION_CONTROLLER}.values.yaml"));
    chart::Release {
        helm: &stage.helm,
        kubeconfig: stage.kubeconfig(),
        chart: &stage.charts_dir.join(TERMINATION_CONTROLLER),
        name: TERMINATION_CONTROLLER,
        namespace: AGENTS_NAMESPACE,
    }
    .upgrade(&[&values], &[SETTING.to_owned()])?;
    stage.timeline.event(&format!(
        "helm upgrade {TERMINATION_CONTROLLER} charts/{TERMINATION_CONTROLLER} -n \
         {AGENTS_NAMESPACE} -f e2e/demo/{TERMINATION_CONTROLLER}.values.yaml --set {SETTING}: \
         the drain asks through EvictionRequests; its ClusterRole trades pods/eviction for \
         lifecycle.k8s.io's evictionrequests and evictions"
    ));
    let leader = rolled_out(stage.client())
        .await
        .context("termination-controller did not roll out with --eviction-api=eviction-request")?;
    stage.timeline.event(&format!(
        "rolled out: {leader} leads with --eviction-api=eviction-request, {} after the upgrade",
        seconds(started.elapsed())
    ));
    Ok(())
}

/// The leader, once every live pod of the controller runs Ready with the new flag and one of
/// them holds the Lease.
async fn rolled_out(client: &Client) -> Option<String> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), AGENTS_NAMESPACE);
    let leases: Api<Lease> = Api::namespaced(client.clone(), AGENTS_NAMESPACE);
    let params =
        ListParams::default().labels(&format!("app.kubernetes.io/name={TERMINATION_CONTROLLER}"));
    poll_for(TIMEOUT, || async {
        let listed = pods.list(&params).await.ok()?.items;
        let upgraded = |pod: &Pod| {
            pod.spec.iter().flat_map(|spec| &spec.containers).any(|c| {
                c.args
                    .iter()
                    .flatten()
                    .any(|arg| arg == "--eviction-api=eviction-request")
            })
        };
        let live: Vec<&Pod> = listed
            .iter()
            .filter(|pod| pod.metadata.deletion_timestamp.is_none())
            .collect();
        let done = !live.is_empty() && live.iter().all(|pod| upgraded(pod) && pod_ready(pod));
        if !done || listed.len() != live.len() {
            return None;
        }
        let holder = super::leader_failover::holder(&leases).await?;
        live.iter()
            .any(|pod| pod.metadata.name.as_deref() == Some(holder.as_str()))
            .then_some(holder)
    })
    .await
}

/// The node and UID of `db-0` once it runs Ready on a node `wanted`.
async fn db_running(client: &Client, wanted: impl Fn(&str) -> bool) -> Result<(String, String)> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let found = poll_for(TIMEOUT, || async {
        let pod = pods.get_opt(DB).await.ok()??;
        let node = pod.spec.as_ref()?.node_name.clone()?;
        let running = wanted(&node) && pod_ready(&pod) && pod.metadata.deletion_timestamp.is_none();
        running.then_some((node, pod.metadata.uid?))
    })
    .await;
    found.with_context(|| format!("{NAMESPACE}/{DB} did not run Ready where wanted in {TIMEOUT:?}"))
}

/// The name of the Eviction of the pod `uid` once the operator's responder is its active one.
async fn active_for(client: &Client, uid: &str) -> Result<String> {
    let evictions: Api<Eviction> = Api::namespaced(client.clone(), NAMESPACE);
    let found = poll_for(TIMEOUT, || async {
        let listed = evictions.list(&ListParams::default()).await.ok()?.items;
        listed.into_iter().find_map(|eviction| {
            let targets = eviction.spec.target.pod.as_ref()?.uid == uid;
            let active = eviction
                .status
                .as_ref()?
                .target_responders
                .iter()
                .flatten()
                .any(|responder| responder.name == RESPONDER && responder.state == "Active");
            (targets && active).then(|| eviction.metadata.name.clone())?
        })
    })
    .await;
    found.with_context(|| {
        format!("no Eviction of {NAMESPACE}/{DB} made {RESPONDER} active within {TIMEOUT:?}")
    })
}

/// What the operator writes while it works: its own entry, by server-side apply.
async fn heartbeat(client: &Client, eviction: &str) -> Result<()> {
    let now = jiff::Timestamp::now();
    let entry = json!({
        "apiVersion": "lifecycle.k8s.io/v1alpha1",
        "kind": "Eviction",
        "status": {"responders": [{
            "name": RESPONDER,
            "heartbeatTime": Time(now),
            "expectedCompletionTime": Time(now + jiff::SignedDuration::from_secs(60)),
            "message": MIGRATING,
        }]},
    });
    Api::<Eviction>::namespaced(client.clone(), NAMESPACE)
        .patch_status(
            eviction,
            &PatchParams::apply("db-operator.example.com"),
            &Patch::Apply(entry),
        )
        .await
        .with_context(|| format!("the operator's heartbeat on Eviction {eviction}"))?;
    Ok(())
}

/// kube-sim's audit of the Eviction API's evictions of pods on `node` (node-3 joined for this
/// act, so every one is of its drain).
async fn evicted_on(client: &Client, node: &str) -> Result<Vec<Evicted>> {
    let all: Vec<Evicted> =
        serde_json::from_value(sim_get(client, "/sim/v1/audit/evictions").await?)?;
    Ok(all
        .into_iter()
        .filter(|evicted| evicted.node == node)
        .collect())
}

/// The outcome, from kube-sim's audit and the API: the database left without an Eviction API
/// call, the other pods through the default evictor within their budgets, no request left.
async fn judge(stage: &Stage, db_uid: &str) -> Result<()> {
    let client = stage.client();
    let evicted = evicted_on(client, NODE).await?;
    if evicted.iter().any(|evicted| evicted.uid == db_uid) {
        bail!(
            "{DB} was evicted through the Eviction API: the drain did not hand it to {RESPONDER}"
        );
    }
    if let Some(other) = evicted
        .iter()
        .find(|evicted| evicted.user != kube_sim::world::EVICTOR_USER)
    {
        bail!(
            "{}/{} was evicted by {}, not by the default evictor: the drain called the Eviction \
             API itself",
            other.namespace,
            other.pod,
            other.user
        );
    }
    let names: Vec<String> = evicted
        .iter()
        .map(|evicted| format!("{}/{}", evicted.namespace, evicted.pod))
        .collect();
    stage.timeline.event(&format!(
        "kube-sim's audit: the default evictor ({}) evicted {}; {DB} was evicted by no one: its \
         operator deleted it",
        kube_sim::world::EVICTOR_USER,
        names.join(", ")
    ));
    let violations = sim_get(client, "/sim/v1/audit/violations").await?;
    if violations.as_array().is_some_and(|found| !found.is_empty()) {
        bail!("PodDisruptionBudget violations: {violations}");
    }
    let requests: Api<EvictionRequest> = Api::all(client.clone());
    let left = requests
        .list(&ListParams::default().labels(&format!("nodegrace.io/node={NODE}")))
        .await?
        .items;
    if !left.is_empty() {
        let names: Vec<String> = left
            .iter()
            .filter_map(|request| request.metadata.name.clone())
            .collect();
        bail!(
            "EvictionRequests left after {NODE} went: {}",
            names.join(", ")
        );
    }
    let (replacement, _) = db_running(client, |node| node != NODE).await?;
    stage.timeline.event(&format!(
        "{NAMESPACE}/{DB} runs again, on {replacement}: the StatefulSet's new pod"
    ));
    stage
        .timeline
        .show("kubectl get events -A --field-selector reason=EvictionRequested");
    stage
        .timeline
        .show(&format!("kubectl -n {NAMESPACE} get pods -o wide"));
    stage.timeline.pass(&format!(
        "{NODE} left through EvictionRequests: {DB} by its operator, no Eviction API call for \
         it, 0 PodDisruptionBudget violations, no request left"
    ));
    Ok(())
}
