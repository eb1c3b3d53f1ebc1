//! `--eviction-requests`: the eviction responders the explorer plays for the workloads' pods,
//! and the judge that no EvictionRequest outlives its node's termination (invariant 14).
//!
//! Each responder behaves one way, so every handover path is drawn: `slow` heartbeats and
//! reports done after 1–3 s (its pod then goes to the next responder), `silent` never answers
//! (passed over once kube-sim's 3 s heartbeat deadline runs out), `refuse` reports done at once
//! without helping. None deletes a pod itself: the default evictor, which asks the Eviction API,
//! ends every handover, so PodDisruptionBudgets (invariant 2) still judge the drain.

use std::time::Duration;

use anyhow::Result;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::lifecycle::v1alpha1::{Eviction, EvictionRequest};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{ListParams, PostParams};
use kube::{Api, Client};
use kube_sim::cluster::Workload;
use serde_json::json;

use super::setup::APPS;

/// kube-sim's flags for the API, with a heartbeat deadline a run can see pass.
pub const SIM_FLAGS: [&str; 3] = [
    "--feature-gates=EvictionRequestAPI=true",
    "--runtime-config=lifecycle.k8s.io/v1alpha1=true",
    "--eviction-responder-heartbeat-deadline=3s",
];
/// How a left request is worded, for invariant 14.
pub const LEFT: &str = "EvictionRequest left";

const SLOW: &str = "slow.responders.explore.test/migrate";
const SILENT: &str = "silent.responders.explore.test/ignore";
const REFUSE: &str = "refuse.responders.explore.test/primary";
/// How often the responders look at the Evictions.
const TICK: Duration = Duration::from_millis(250);

/// `app` with the responders its pods name: `web` a slow one, `api` a silent one, `db` one
/// that refuses and then a slow one.
pub fn named_on(app: Workload) -> Workload {
    let responders = match app.name() {
        "web" => json!([{"name": SLOW, "priority": 10000}]),
        "api" => json!([{"name": SILENT, "priority": 5000}]),
        "db" => json!([{"name": REFUSE, "priority": 20000}, {"name": SLOW, "priority": 1000}]),
        _ => return app,
    };
    app.pod(&json!({"spec": {"evictionResponders": responders}}))
}

/// The responders at work until the returned guard is dropped.
pub fn play(client: Client, seed: u64) -> Playing {
    Playing(tokio::spawn(async move {
        let evictions: Api<Eviction> = Api::namespaced(client, APPS);
        loop {
            if let Ok(list) = evictions.list(&ListParams::default()).await {
                for eviction in list.items {
                    // A conflict or a refusal is tried again at the next tick.
                    let _ = respond(&evictions, eviction, seed).await;
                }
            }
            tokio::time::sleep(TICK).await;
        }
    }))
}

/// Stops the responders when dropped.
#[derive(Debug)]
pub struct Playing(tokio::task::JoinHandle<()>);

impl Drop for Playing {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The active responder's answer, if it is one of ours.
async fn respond(evictions: &Api<Eviction>, mut eviction: Eviction, seed: u64) -> Result<()> {
    let name = eviction.metadata.name.clone().unwrap_or_default();
    let Some(status) = eviction.status.as_mut() else {
        return Ok(());
    };
    let Some(active) = status
        .target_responders
        .iter()
        .flatten()
        .find(|responder| responder.state == "Active")
        .map(|responder| responder.name.clone())
    else {
        return Ok(());
    };
    let Some(entry) = status
        .responders
        .iter_mut()
        .flatten()
        .find(|entry| entry.name == active)
    else {
        return Ok(());
    };
    let now = jiff::Timestamp::now();
    let started = entry.start_time.as_ref().map_or(now, |time| time.0);
    let took = Duration::try_from(now.duration_since(started)).unwrap_or_default();
    match active.as_str() {
        REFUSE => {
            entry.heartbeat_time = Some(Time(now));
            entry.completion_time = Some(Time(now));
            entry.message = Some("refused: this replica is the primary".to_owned());
        }
        SLOW => {
            // 1–3 s, fixed per Eviction and seed.
            let spread = (seed ^ fnv(&name)) % 3;
            let migrating = Duration::from_secs(1 + spread);
            entry.heartbeat_time = Some(Time(now));
            if took >= migrating {
                entry.completion_time = Some(Time(now));
                entry.message = Some("state migrated; the evictor may take the pod".to_owned());
            } else if entry.message.is_none() {
                entry.expected_completion_time = Some(Time(
                    started + jiff::SignedDuration::try_from(migrating).unwrap_or_default(),
                ));
                entry.message = Some("migrating its state".to_owned());
            } else {
                return Ok(());
            }
        }
        _ => return Ok(()),
    }
    evictions
        .replace_status(&name, &PostParams::default(), &eviction)
        .await?;
    Ok(())
}

fn fnv(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Invariant 14: no EvictionRequest of termination-controller's is left for a node no longer
/// being terminated under its finalizer (gone, another Node of that name, or no longer
/// deleting).
pub async fn requests_left(client: &Client) -> Result<Vec<String>> {
    let requests: Api<EvictionRequest> = Api::all(client.clone());
    let nodes: Api<Node> = Api::all(client.clone());
    let mut left = Vec::new();
    for request in requests
        .list(&ListParams::default().labels("nodegrace.io/node-uid"))
        .await?
        .items
    {
        let labels = request.metadata.labels.clone().unwrap_or_default();
        let node = labels.get("nodegrace.io/node").cloned().unwrap_or_default();
        let uid = labels
            .get("nodegrace.io/node-uid")
            .cloned()
            .unwrap_or_default();
        let why = match nodes.get_opt(&node).await? {
            None => Some("the node is gone"),
            Some(found) if found.metadata.uid.as_deref() != Some(uid.as_str()) => {
                Some("another Node has the name")
            }
            Some(found) if found.metadata.deletion_timestamp.is_none() => {
                Some("the node is not being deleted")
            }
            Some(found)
                if !found
                    .metadata
                    .finalizers
                    .iter()
                    .flatten()
                    .any(|finalizer| finalizer == super::invariants::FINALIZER) =>
            {
                Some("the node's termination was released")
            }
            Some(_) => None,
        };
        if let Some(why) = why {
            left.push(format!(
                "{LEFT}: {}/{} for node {node} ({why})",
                request.metadata.namespace.unwrap_or_default(),
                request.metadata.name.unwrap_or_default()
            ));
        }
    }
    Ok(left)
}
