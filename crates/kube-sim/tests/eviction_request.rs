//! The EvictionRequest API (lifecycle.k8s.io/v1alpha1, Kubernetes 1.37 alpha) and its
//! controllers, through kube-rs with the 1.37 types: served only behind its gate, validated as
//! upstream, and the evictionrequest-controller handing a pod from responder to responder down
//! to the default evictor, which asks the eviction subresource and so obeys budgets.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::lifecycle::v1alpha1::{Eviction, EvictionRequest};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use kube_sim::cluster::{Cluster, statefulset};
use kube_sim::{KubeSim, SimOptions, WorldOptions};
use serde_json::{Value, json};

use crate::common::store::wait_until;

const RESPONDER: &str = "db.example.com/failover";
const EVICTOR: &str = "imperative-eviction.k8s.io/evictor";
const REQUESTER: &str = "nodegrace.io/termination-controller";

fn world(deadline: Duration) -> WorldOptions {
    WorldOptions {
        lease_renew_interval: Duration::from_millis(100),
        responder_heartbeat_deadline: deadline,
        ..WorldOptions::default()
    }
}

/// One node and a StatefulSet `db` of one pod with `responders`, under `budget` if any.
async fn cluster(deadline: Duration, responders: Value, budget: Option<Value>) -> Result<KubeSim> {
    let mut db = statefulset("db", 1).pod(&json!({"spec": {"evictionResponders": responders}}));
    if let Some(budget) = budget {
        db = db.budget(budget);
    }
    Ok(Cluster::new(1)
        .options(SimOptions {
            eviction_request_api: true,
            ..SimOptions::default()
        })
        .world(world(deadline))
        .with(db)
        .start()
        .await?)
}

fn request(pod: &Pod, intent: &str) -> Result<EvictionRequest> {
    let uid = pod.metadata.uid.clone().context("pod uid")?;
    Ok(serde_json::from_value(json!({
        "metadata": {"name": uid},
        "spec": {
            "requester": REQUESTER,
            "intent": intent,
            "target": {"pod": {"name": pod.metadata.name, "uid": uid}},
        },
    }))?)
}

fn condition(
    status: Option<&Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>>,
    kind: &str,
) -> Option<(String, String)> {
    status?
        .iter()
        .find(|condition| condition.type_ == kind)
        .map(|condition| (condition.status.clone(), condition.reason.clone()))
}

fn states(eviction: &Eviction) -> Vec<(String, String)> {
    eviction
        .status
        .as_ref()
        .and_then(|status| status.target_responders.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|responder| (responder.name, responder.state))
        .collect()
}

/// The one Eviction of the namespace, once the controller made it.
async fn the_eviction(sim: &KubeSim, evictions: &Api<Eviction>) -> Result<Eviction> {
    wait_until(sim, "an Eviction", || async {
        Ok(evictions.list(&ListParams::default()).await?.items.len() == 1)
    })
    .await?;
    Ok(evictions
        .list(&ListParams::default())
        .await?
        .items
        .remove(0))
}

/// db-0 asked for by one request, and the Eviction made of it.
struct Asked {
    pods: Api<Pod>,
    requests: Api<EvictionRequest>,
    evictions: Api<Eviction>,
    uid: String,
    name: String,
}

async fn ask_for_db_0(sim: &KubeSim) -> Result<Asked> {
    let client = sim.client();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pod = pods.get("db-0").await?;
    let uid = pod.metadata.uid.clone().context("uid")?;
    let requests: Api<EvictionRequest> = Api::namespaced(client.clone(), "default");
    requests
        .create(&PostParams::default(), &request(&pod, "Eviction")?)
        .await?;
    let evictions: Api<Eviction> = Api::namespaced(client, "default");
    let name = the_eviction(sim, &evictions)
        .await?
        .metadata
        .name
        .context("name")?;
    Ok(Asked {
        pods,
        requests,
        evictions,
        uid,
        name,
    })
}

/// Plays `responder` as upstream's integration test does: applies its own entry of
/// `status.responders` (server-side apply merges the list by name).
async fn heartbeat(evictions: &Api<Eviction>, name: &str, responder: &str) -> Result<()> {
    let now = jiff::Timestamp::now();
    let expected = now + jiff::SignedDuration::from_secs(60);
    let applied = evictions
        .patch_status(
            name,
            &PatchParams::apply("db.example.com"),
            &Patch::Apply(json!({
                "apiVersion": "lifecycle.k8s.io/v1alpha1",
                "kind": "Eviction",
                "status": {"responders": [{
                    "name": responder,
                    "heartbeatTime": Time(now),
                    "expectedCompletionTime": Time(expected),
                    "message": "promoting the replica",
                }]},
            })),
        )
        .await?;
    let states = states(&applied);
    ensure!(
        states.len() == 2,
        "the apply kept the other responders: {states:?}"
    );
    Ok(())
}

/// Plays `responder`: sets its heartbeat (and completion) with a read-modify-write.
async fn report(
    evictions: &Api<Eviction>,
    name: &str,
    responder: &str,
    complete: bool,
) -> Result<()> {
    let mut eviction = evictions.get(name).await?;
    let status = eviction.status.as_mut().context("eviction status")?;
    let entry = status
        .responders
        .iter_mut()
        .flatten()
        .find(|entry| entry.name == responder)
        .context("the responder's entry")?;
    let now = Time(jiff::Timestamp::now());
    entry.heartbeat_time = Some(now.clone());
    entry.message = Some("promoting the replica".to_owned());
    entry.expected_completion_time = Some(Time(
        jiff::Timestamp::now() + jiff::SignedDuration::from_secs(60),
    ));
    if complete {
        entry.completion_time = Some(now);
    }
    evictions
        .replace_status(name, &PostParams::default(), &eviction)
        .await?;
    Ok(())
}

#[tokio::test]
async fn the_api_is_served_only_behind_its_gate() -> Result<()> {
    let plain = KubeSim::start(SimOptions {
        world: WorldOptions::none(),
        ..SimOptions::default()
    })
    .await?;
    let groups = plain.client().list_api_groups().await?;
    ensure!(
        !groups
            .groups
            .iter()
            .any(|group| group.name == "lifecycle.k8s.io")
    );
    let requests: Api<EvictionRequest> = Api::namespaced(plain.client(), "default");
    let error = requests.list(&ListParams::default()).await.unwrap_err();
    ensure!(
        matches!(error, kube::Error::Api(ref status) if status.code == 404),
        "{error}"
    );

    let gated = KubeSim::start(SimOptions {
        world: WorldOptions::none(),
        eviction_request_api: true,
        ..SimOptions::default()
    })
    .await?;
    let groups = gated.client().list_api_groups().await?;
    let lifecycle = groups
        .groups
        .iter()
        .find(|group| group.name == "lifecycle.k8s.io")
        .context("lifecycle.k8s.io in discovery")?;
    ensure!(
        lifecycle
            .versions
            .iter()
            .any(|version| version.version == "v1alpha1")
    );
    let resources = gated
        .client()
        .list_api_group_resources("lifecycle.k8s.io/v1alpha1")
        .await?;
    let names: Vec<&str> = resources
        .resources
        .iter()
        .map(|r| r.name.as_str())
        .collect();
    for served in [
        "evictionrequests",
        "evictionrequests/status",
        "evictions",
        "evictions/status",
    ] {
        ensure!(names.contains(&served), "{served} in {names:?}");
    }
    Ok(())
}

#[tokio::test]
async fn requests_and_responders_are_validated_as_upstream() -> Result<()> {
    let sim = KubeSim::start(SimOptions {
        world: WorldOptions::none(),
        eviction_request_api: true,
        ..SimOptions::default()
    })
    .await?;
    let client = sim.client();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "db-0"},
        "spec": {"containers": [{"name": "db", "image": "postgres"}], "evictionResponders": [{"name": RESPONDER, "priority": 10000}]},
    }))?;
    let pod = pods.create(&PostParams::default(), &pod).await?;
    let requests: Api<EvictionRequest> = Api::namespaced(client.clone(), "default");
    let refused = |field: &'static str| {
        move |error: kube::Error| match error {
            kube::Error::Api(status) if status.code == 422 && status.message.contains(field) => {
                Ok(())
            }
            other => Err(anyhow::anyhow!("expected a 422 naming {field}: {other}")),
        }
    };
    let mut bad = request(&pod, "Eviction")?;
    bad.spec.requester = "termination-controller".to_owned();
    requests
        .create(&PostParams::default(), &bad)
        .await
        .map(drop)
        .or_else(refused("spec.requester"))?;
    bad.spec.requester = "drain.k8s.io/mine".to_owned();
    requests
        .create(&PostParams::default(), &bad)
        .await
        .map(drop)
        .or_else(refused("spec.requester"))?;
    let mut bad = request(&pod, "Evict")?;
    requests
        .create(&PostParams::default(), &bad)
        .await
        .map(drop)
        .or_else(refused("spec.intent"))?;
    bad.spec.intent = "Eviction".to_owned();
    if let Some(target) = bad.spec.target.pod.as_mut() {
        target.uid = "not-a-uid".to_owned();
    }
    requests
        .create(&PostParams::default(), &bad)
        .await
        .map(drop)
        .or_else(refused("spec.target.pod.uid"))?;

    let created = requests
        .create(&PostParams::default(), &request(&pod, "Eviction")?)
        .await?;
    ensure!(created.metadata.generation == Some(1));
    let name = created.metadata.name.clone().context("name")?;
    let withdrawn = requests
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"intent": "Withdrawn"}})),
        )
        .await?;
    ensure!(
        withdrawn.metadata.generation == Some(2),
        "an intent change is a spec change"
    );
    requests
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"requester": "other.io/x"}})),
        )
        .await
        .map(drop)
        .or_else(refused("spec.requester"))?;

    pods.patch(
        "db-0",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"evictionResponders": []}})),
    )
    .await
    .map(drop)
    .or_else(refused("spec.evictionResponders"))?;
    let reserved: Pod = serde_json::from_value(json!({
        "metadata": {"name": "web-0"},
        "spec": {"containers": [{"name": "web", "image": "nginx"}], "evictionResponders": [{"name": "web.example.com/drain", "priority": 500}]},
    }))?;
    pods.create(&PostParams::default(), &reserved)
        .await
        .map(drop)
        .or_else(refused("spec.evictionResponders[0].priority"))?;
    Ok(())
}

#[tokio::test]
async fn a_responder_that_migrates_its_pod_is_handed_the_eviction_and_no_eviction_api_call_is_made()
-> Result<()> {
    let sim = cluster(
        Duration::from_secs(600),
        json!([{"name": RESPONDER, "priority": 10000}]),
        None,
    )
    .await?;
    let Asked {
        pods,
        requests,
        evictions,
        uid,
        name,
    } = ask_for_db_0(&sim).await?;
    ensure!(name == "pod-1-db-0", "{name}");
    wait_until(&sim, "the responder to be Active", || async {
        Ok(states(&evictions.get(&name).await?)
            == [
                (RESPONDER.to_owned(), "Active".to_owned()),
                (EVICTOR.to_owned(), "Inactive".to_owned()),
            ])
    })
    .await?;
    let eviction = evictions.get(&name).await?;
    let labels = eviction.metadata.labels.clone().unwrap_or_default();
    ensure!(
        labels.get(REQUESTER).map(String::as_str) == Some("requester"),
        "{labels:?}"
    );
    ensure!(
        labels.get(RESPONDER).map(String::as_str) == Some("responder"),
        "{labels:?}"
    );
    ensure!(
        labels.get(EVICTOR).map(String::as_str) == Some("responder"),
        "{labels:?}"
    );
    let owners = eviction
        .metadata
        .owner_references
        .clone()
        .unwrap_or_default();
    ensure!(owners.len() == 1 && owners[0].kind == "EvictionRequest" && owners[0].name == uid);
    wait_until(&sim, "the request to await the eviction", || async {
        let request = requests.get(&uid).await?;
        let status = request.status.as_ref();
        Ok(status.and_then(|s| s.observed_generation) == Some(1)
            && condition(status.and_then(|s| s.conditions.as_ref()), "TargetEvicted")
                == Some(("False".to_owned(), "AwaitingEviction".to_owned())))
    })
    .await?;

    heartbeat(&evictions, &name, RESPONDER).await?;
    let beat = evictions.get(&name).await?;
    let responders = beat.status.and_then(|s| s.responders).unwrap_or_default();
    ensure!(
        responders.len() == 2
            && responders[0].heartbeat_time.is_some()
            && responders[0].start_time.is_some(),
        "{responders:?}"
    );
    pods.delete("db-0", &DeleteParams::default()).await?;
    wait_until(&sim, "db-0 of the first uid to be gone", || async {
        Ok(pods
            .get_opt("db-0")
            .await?
            .is_none_or(|pod| pod.metadata.uid.as_deref() != Some(uid.as_str())))
    })
    .await?;
    report(&evictions, &name, RESPONDER, true).await?;
    wait_until(&sim, "the eviction to have evicted its target", || async {
        let eviction = evictions.get(&name).await?;
        Ok(condition(
            eviction.status.as_ref().and_then(|s| s.conditions.as_ref()),
            "TargetEvicted",
        ) == Some(("True".to_owned(), "PodDeleted".to_owned())))
    })
    .await?;
    let eviction = evictions.get(&name).await?;
    ensure!(
        states(&eviction)[0] == (RESPONDER.to_owned(), "Completed".to_owned()),
        "{:?}",
        states(&eviction)
    );
    wait_until(&sim, "the request to mirror it", || async {
        let request = requests.get(&uid).await?;
        Ok(condition(
            request.status.as_ref().and_then(|s| s.conditions.as_ref()),
            "TargetEvicted",
        ) == Some(("True".to_owned(), "PodDeleted".to_owned())))
    })
    .await?;
    let audit = sim.world().audit();
    ensure!(
        !audit.evictions().iter().any(|e| e.uid == uid),
        "no Eviction API call for db-0"
    );
    ensure!(
        audit
            .deletions()
            .iter()
            .any(|d| d.uid == uid && d.resource == "pods"),
        "the responder's delete is audited"
    );

    requests.delete(&uid, &DeleteParams::default()).await?;
    wait_until(
        &sim,
        "the Eviction to be collected with its request",
        || async { Ok(evictions.get_opt(&name).await?.is_none()) },
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn a_silent_responder_is_passed_over_to_the_evictor_which_evicts() -> Result<()> {
    let sim = cluster(
        Duration::from_secs(2),
        json!([{"name": RESPONDER, "priority": 10000}]),
        None,
    )
    .await?;
    let Asked {
        evictions,
        uid,
        name,
        ..
    } = ask_for_db_0(&sim).await?;
    wait_until(&sim, "the silent responder to be passed over", || async {
        Ok(states(&evictions.get(&name).await?)
            == [
                (RESPONDER.to_owned(), "Interrupted".to_owned()),
                (EVICTOR.to_owned(), "Active".to_owned()),
            ])
    })
    .await?;
    wait_until(&sim, "the evictor to evict db-0", || async {
        Ok(sim.world().audit().evictions().iter().any(|e| e.uid == uid))
    })
    .await?;
    let evicted = sim.world().audit().evictions();
    let by = evicted
        .iter()
        .find(|e| e.uid == uid)
        .context("the eviction")?;
    ensure!(by.user == kube_sim::world::EVICTOR_USER, "{}", by.user);
    wait_until(&sim, "the eviction to have evicted its target", || async {
        let eviction = evictions.get(&name).await?;
        Ok(condition(
            eviction.status.as_ref().and_then(|s| s.conditions.as_ref()),
            "TargetEvicted",
        ) == Some(("True".to_owned(), "PodDeleted".to_owned())))
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn a_budget_that_never_allows_holds_the_pod_with_the_evictors_message() -> Result<()> {
    let sim = cluster(
        Duration::from_secs(600),
        json!([]),
        Some(json!({"maxUnavailable": 0})),
    )
    .await?;
    let client = sim.client();
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), "default");
    wait_until(&sim, "the budget to count db-0", || async {
        Ok(budgets
            .get("db")
            .await?
            .status
            .and_then(|s| s.current_healthy)
            == Some(1))
    })
    .await?;
    let Asked {
        pods,
        requests,
        evictions,
        uid,
        name,
    } = ask_for_db_0(&sim).await?;
    wait_until(&sim, "the evictor to report the budget", || async {
        let eviction = evictions.get(&name).await?;
        let message = eviction
            .status
            .and_then(|s| s.responders)
            .and_then(|responders| responders.into_iter().find(|r| r.name == EVICTOR))
            .and_then(|r| r.message)
            .unwrap_or_default();
        Ok(
            message.contains("pod deletion via the /eviction subresource failed (attempts=1)")
                && message.contains("disruption budget"),
        )
    })
    .await?;
    ensure!(
        pods.get("db-0")
            .await?
            .metadata
            .deletion_timestamp
            .is_none(),
        "the budget holds db-0"
    );
    ensure!(sim.world().audit().violations().is_empty());

    requests
        .patch(
            &uid,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"intent": "Withdrawn"}})),
        )
        .await?;
    wait_until(&sim, "the eviction to be canceled", || async {
        let eviction = evictions.get(&name).await?;
        Ok(condition(
            eviction.status.as_ref().and_then(|s| s.conditions.as_ref()),
            "Failed",
        ) == Some(("True".to_owned(), "CanceledDueToNoRequesters".to_owned()))
            && states(&eviction)[0] == (EVICTOR.to_owned(), "Canceled".to_owned()))
    })
    .await?;
    requests
        .patch(
            &uid,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"intent": "Eviction"}})),
        )
        .await?;
    wait_until(&sim, "a second Eviction for the renewed intent", || async {
        Ok(evictions.get_opt("pod-2-db-0").await?.is_some())
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn a_request_for_a_missing_pod_fails_as_invalid() -> Result<()> {
    let sim = KubeSim::start(SimOptions {
        world: WorldOptions {
            eviction_requests: true,
            ..WorldOptions::none()
        },
        eviction_request_api: true,
        ..SimOptions::default()
    })
    .await?;
    let requests: Api<EvictionRequest> = Api::namespaced(sim.client(), "default");
    let ghost: Pod = serde_json::from_value(
        json!({"metadata": {"name": "ghost", "uid": "55fcee67-c0cb-409d-b610-c16d9d765b7b"}}),
    )?;
    let created = requests
        .create(&PostParams::default(), &request(&ghost, "Eviction")?)
        .await?;
    let name = created.metadata.name.context("name")?;
    wait_until(&sim, "the request to fail", || async {
        let request = requests.get(&name).await?;
        Ok(condition(
            request.status.as_ref().and_then(|s| s.conditions.as_ref()),
            "Failed",
        ) == Some(("True".to_owned(), "EvictionInvalid".to_owned())))
    })
    .await?;
    let client: Client = sim.client();
    let evictions: Api<Eviction> = Api::namespaced(client, "default");
    ensure!(
        evictions
            .list(&ListParams::default())
            .await?
            .items
            .is_empty()
    );
    Ok(())
}
