//! The simulated world: kubelets, node lifecycle and taint eviction, the disruption
//! controller, workloads, attach/detach, and the cloud.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use kube_sim::{KubeSim, SimOptions, WorldOptions};
use serde_json::json;

use crate::common::store as store_wait;
use store_wait::wait_until;

fn quick_world() -> WorldOptions {
    WorldOptions {
        lease_renew_interval: Duration::from_millis(100),
        node_monitor_grace: Duration::from_millis(600),
        detach_delay: Duration::from_millis(500),
        ..WorldOptions::default()
    }
}

async fn sim(nodes: usize) -> Result<KubeSim> {
    sim_with(nodes, quick_world()).await
}

async fn sim_with(nodes: usize, world: WorldOptions) -> Result<KubeSim> {
    Ok(KubeSim::start(SimOptions {
        nodes,
        world,
        ..SimOptions::default()
    })
    .await?)
}

/// Whether the VolumeAttachment `name` is being deleted (its volume detaching).
async fn detaching(attachments: &Api<VolumeAttachment>, name: &str) -> Result<bool> {
    Ok(attachments
        .get(name)
        .await?
        .metadata
        .deletion_timestamp
        .is_some())
}

/// The quick world with the pod GC sweeping every `period`.
async fn sim_with_pod_gc(nodes: usize, period: Duration) -> Result<KubeSim> {
    sim_with(
        nodes,
        WorldOptions {
            pod_gc_period: period,
            ..quick_world()
        },
    )
    .await
}

fn pod(name: &str, node: Option<&str>, extra: &serde_json::Value) -> Result<Pod> {
    let mut pod = json!({"metadata": {"name": name, "labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}});
    if let Some(node) = node {
        pod["spec"]["nodeName"] = json!(node);
    }
    json_patch::merge(&mut pod, extra);
    Ok(serde_json::from_value(pod)?)
}

fn ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn running(pod: &Pod) -> bool {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

fn node_ready(node: &Node) -> Option<String> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| c.status.clone())
}

#[tokio::test]
async fn kubelets_start_pods_and_stop_them_after_their_stop_time() -> Result<()> {
    let sim = sim(1).await?;
    let pods: Api<Pod> = Api::namespaced(sim.client(), "default");
    let slow = json!({"metadata": {"annotations": {"sim.nodegrace.io/ready-after-seconds": "0.3", "sim.nodegrace.io/stop-seconds": "0.5"}}});
    pods.create(&PostParams::default(), &pod("p", Some("node-0"), &slow)?)
        .await?;
    wait_until(&sim, "p to run", || async {
        Ok(pods.get("p").await?.status.and_then(|s| s.phase).as_deref() == Some("Running"))
    })
    .await?;
    wait_until(&sim, "p to be ready", || async {
        Ok(ready(&pods.get("p").await?))
    })
    .await?;
    let deleted = tokio::time::Instant::now();
    pods.delete("p", &DeleteParams::default()).await?;
    ensure!(
        pods.get("p").await?.metadata.deletion_timestamp.is_some(),
        "a running pod terminates gracefully"
    );
    wait_until(&sim, "p to be gone", || async {
        Ok(pods.get_opt("p").await?.is_none())
    })
    .await?;
    ensure!(
        deleted.elapsed() >= Duration::from_millis(450),
        "stopped after {:?}",
        deleted.elapsed()
    );
    Ok(())
}

#[tokio::test]
async fn a_stopped_kubelet_makes_its_node_unknown_tainted_and_its_pods_evicted() -> Result<()> {
    // DefaultTolerationSeconds shortened from 300 s to none: "plain" goes at once.
    let sim = sim_with(
        2,
        WorldOptions {
            default_toleration_seconds: 0,
            ..quick_world()
        },
    )
    .await?;
    let client: Client = sim.client();
    let nodes: Api<Node> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let tolerant = json!({"spec": {"tolerations": [{"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 1}]}});
    pods.create(
        &PostParams::default(),
        &pod("plain", Some("node-0"), &json!({}))?,
    )
    .await?;
    pods.create(
        &PostParams::default(),
        &pod("tolerant", Some("node-0"), &tolerant)?,
    )
    .await?;
    wait_until(&sim, "the pods to run", || async {
        Ok(pods
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .all(ready))
    })
    .await?;
    set_kubelet(&nodes, "node-0", "stopped").await?;
    wait_until(&sim, "node-0 to turn Unknown", || async {
        Ok(node_ready(&nodes.get("node-0").await?).as_deref() == Some("Unknown"))
    })
    .await?;
    let taints = nodes
        .get("node-0")
        .await?
        .spec
        .and_then(|s| s.taints)
        .unwrap_or_default();
    ensure!(
        taints
            .iter()
            .any(|t| t.key == "node.kubernetes.io/unreachable" && t.effect == "NoExecute"),
        "{taints:?}"
    );
    ensure!(
        taints
            .iter()
            .any(|t| t.key == "node.kubernetes.io/unreachable" && t.effect == "NoSchedule"),
        "{taints:?}"
    );
    // The taint manager marks both; with the kubelet gone they stay Terminating forever.
    wait_until(&sim, "plain to be evicted", || async {
        Ok(pods
            .get("plain")
            .await?
            .metadata
            .deletion_timestamp
            .is_some())
    })
    .await?;
    let target = pods
        .get("plain")
        .await?
        .status
        .and_then(|s| s.conditions)
        .and_then(|c| c.into_iter().find(|c| c.type_ == "DisruptionTarget"))
        .and_then(|c| c.reason);
    ensure!(
        target.as_deref() == Some("DeletionByTaintManager"),
        "{target:?}"
    );
    ensure!(
        pods.get("tolerant")
            .await?
            .metadata
            .deletion_timestamp
            .is_none(),
        "tolerationSeconds not yet up"
    );
    wait_until(
        &sim,
        "tolerant to be evicted after its toleration",
        || async {
            Ok(pods
                .get("tolerant")
                .await?
                .metadata
                .deletion_timestamp
                .is_some())
        },
    )
    .await?;
    ensure!(node_ready(&nodes.get("node-1").await?).as_deref() == Some("True"));

    set_kubelet(&nodes, "node-0", "running").await?;
    wait_until(&sim, "node-0 to recover", || async {
        let node = nodes.get("node-0").await?;
        Ok(node_ready(&node).as_deref() == Some("True")
            && node
                .spec
                .and_then(|s| s.taints)
                .is_none_or(|t| t.is_empty()))
    })
    .await?;
    wait_until(
        &sim,
        "the returning kubelet to finish the evictions",
        || async { Ok(pods.list(&ListParams::default()).await?.items.is_empty()) },
    )
    .await
}

#[tokio::test]
async fn budgets_track_healthy_pods_and_replicasets_replace_pods_elsewhere() -> Result<()> {
    let sim = sim(3).await?;
    let client = sim.client();
    let replicasets: Api<k8s_openapi::api::apps::v1::ReplicaSet> =
        Api::namespaced(client.clone(), "default");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), "default");
    replicasets.create(&PostParams::default(), &serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}}, "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}},
    }))?).await?;
    pdbs.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "web"}, "spec": {"maxUnavailable": "34%", "selector": {"matchLabels": {"app": "web"}}}}))?).await?;
    wait_until(&sim, "the budget to see 3 healthy pods", || async {
        let status = pdbs.get("web").await?.status;
        Ok(status.is_some_and(|s| {
            s.current_healthy == Some(3)
                && s.expected_pods == Some(3)
                && s.desired_healthy == Some(1)
                && s.disruptions_allowed == Some(2)
        }))
    })
    .await?;
    // Cordon one node and delete its pod: the replacement lands elsewhere.
    let victim = pods.list(&ListParams::default()).await?.items.remove(0);
    let node = victim
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default();
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .patch(
            &node,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"unschedulable": true}})),
        )
        .await?;
    pods.delete(
        victim.metadata.name.as_deref().unwrap_or_default(),
        &DeleteParams::default(),
    )
    .await?;
    wait_until(&sim, "a replacement on another node", || async {
        let items = pods.list(&ListParams::default()).await?.items;
        let live: Vec<&Pod> = items
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect();
        Ok(live.len() == 3
            && live.iter().all(|p| {
                ready(p)
                    && p.spec.as_ref().and_then(|s| s.node_name.as_deref()) != Some(node.as_str())
            }))
    })
    .await
}

#[tokio::test]
async fn the_scheduler_follows_required_and_preferred_node_affinity() -> Result<()> {
    let sim = sim(3).await?;
    let pods: Api<Pod> = Api::namespaced(sim.client(), "default");
    let hostname = |operator: &str, values: &[&str]| json!({"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": operator, "values": values}]});
    let affinity = json!({"spec": {"affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [hostname("NotIn", &["node-0"])]},
        "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 50, "preference": hostname("In", &["node-2"])}],
    }}}});
    // However loaded node-2 gets, the preference keeps winning over the load.
    for index in 0..3 {
        pods.create(
            &PostParams::default(),
            &pod(&format!("preferring-{index}"), None, &affinity)?,
        )
        .await?;
    }
    let nowhere = json!({"spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [hostname("In", &["node-9"])]}}}}});
    pods.create(&PostParams::default(), &pod("nowhere", None, &nowhere)?)
        .await?;
    wait_until(&sim, "the preferring pods on node-2", || async {
        let placed: Vec<Option<String>> = pods
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter(|p| p.metadata.name.as_deref() != Some("nowhere"))
            .map(|p| p.spec.and_then(|s| s.node_name))
            .collect();
        Ok(placed.len() == 3 && placed.iter().all(|node| node.as_deref() == Some("node-2")))
    })
    .await?;
    wait_until(
        &sim,
        "the scheduler to find no node for the pod no node suits",
        || async {
            let nowhere = pods.get("nowhere").await?;
            ensure!(
                nowhere.spec.and_then(|s| s.node_name).is_none(),
                "a pod whose required affinity no node meets was bound"
            );
            Ok(nowhere
                .status
                .and_then(|s| s.conditions)
                .into_iter()
                .flatten()
                .any(|c| c.type_ == "PodScheduled" && c.reason.as_deref() == Some("Unschedulable")))
        },
    )
    .await
}

/// The DaemonSet `agent` (pods `app=agent`, no tolerations of its own).
async fn create_agent(daemonsets: &Api<DaemonSet>) -> Result<()> {
    let agent = json!({
        "metadata": {"name": "agent"},
        "spec": {"selector": {"matchLabels": {"app": "agent"}}, "template": {"metadata": {"labels": {"app": "agent"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}},
    });
    daemonsets
        .create(&PostParams::default(), &serde_json::from_value(agent)?)
        .await?;
    Ok(())
}

#[tokio::test]
async fn daemonsets_cover_tolerated_nodes() -> Result<()> {
    let sim = sim(3).await?;
    let client = sim.client();
    let nodes: Api<Node> = Api::all(client.clone());
    nodes.patch("node-2", &PatchParams::default(), &Patch::Merge(json!({"spec": {"taints": [{"key": "dedicated", "value": "db", "effect": "NoSchedule"}]}}))).await?;
    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), "kube-system");
    create_agent(&daemonsets).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "kube-system");
    wait_until(&sim, "agents on node-0 and node-1 only", || async {
        let mut placed: Vec<String> = pods
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .filter_map(|p| p.spec.as_ref().and_then(|s| s.node_name.clone()))
            .collect();
        placed.sort();
        Ok(placed == ["node-0", "node-1"])
    })
    .await
}

/// A DaemonSet's status counts nodes, as upstream's `updateDaemonSetStatus` walks the node
/// lister: a pod still bound to a deleted Node (the pod GC has not taken it yet) is scheduled
/// on no node, and a pod on a node it may no longer run on is misscheduled.
#[tokio::test]
async fn a_daemonsets_status_counts_only_nodes_that_exist() -> Result<()> {
    let sim = sim_with_pod_gc(3, Duration::from_secs(3600)).await?;
    let client = sim.client();
    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), "kube-system");
    create_agent(&daemonsets).await?;
    let counts = || async {
        let status = daemonsets.get("agent").await?.status.unwrap_or_default();
        Ok::<_, anyhow::Error>((
            status.desired_number_scheduled,
            status.current_number_scheduled,
            status.number_misscheduled,
            status.number_ready,
        ))
    };
    wait_until(&sim, "an agent Ready on each node", || async {
        Ok(counts().await? == (3, 3, 0, 3))
    })
    .await?;
    let nodes: Api<Node> = Api::all(client.clone());
    // node-2 goes away with its agent still bound to it; node-1 gets a taint the agent does
    // not tolerate, which keeps the running agent but no longer wants it there.
    nodes.delete("node-2", &DeleteParams::default()).await?;
    nodes.patch("node-1", &PatchParams::default(), &Patch::Merge(json!({"spec": {"taints": [{"key": "dedicated", "value": "db", "effect": "NoSchedule"}]}}))).await?;
    wait_until(&sim, "the status to count node-0 alone", || async {
        Ok(counts().await? == (1, 1, 1, 1))
    })
    .await?;
    let pods: Api<Pod> = Api::namespaced(client, "kube-system");
    let on_gone_node = pods
        .list(&ListParams::default().fields("spec.nodeName=node-2"))
        .await?
        .items;
    ensure!(
        on_gone_node.len() == 1,
        "the agent of the deleted node is still bound to it until the pod GC: {on_gone_node:?}"
    );
    Ok(())
}

/// A deleted pod held by a finalizer: its kubelet stops the containers (exit 0 within the
/// grace), the pod turns Succeeded and unready, and the object waits for the finalizer. The
/// kubelet recorded the usual events on the way.
#[tokio::test]
async fn a_deleted_pod_held_by_a_finalizer_finishes_and_waits() -> Result<()> {
    let sim = sim(1).await?;
    let pods: Api<Pod> = Api::namespaced(sim.client(), "default");
    let held = json!({"metadata": {"finalizers": ["nodegrace.io/hold"]}});
    pods.create(&PostParams::default(), &pod("held", Some("node-0"), &held)?)
        .await?;
    wait_until(&sim, "held to run", || async {
        Ok(ready(&pods.get("held").await?))
    })
    .await?;
    pods.delete("held", &DeleteParams::default()).await?;
    wait_until(&sim, "held to finish", || async {
        let pod = pods.get("held").await?;
        let status = pod.status.clone().unwrap_or_default();
        let terminated = status
            .container_statuses
            .unwrap_or_default()
            .iter()
            .all(|c| c.state.as_ref().is_some_and(|s| s.terminated.is_some()));
        Ok(status.phase.as_deref() == Some("Succeeded") && !ready(&pod) && terminated)
    })
    .await?;
    ensure!(
        pods.get("held")
            .await?
            .metadata
            .deletion_timestamp
            .is_some(),
        "the finalizer holds the object"
    );
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(sim.client(), "default");
    let reasons: Vec<String> = events
        .list(&ListParams::default().fields("involvedObject.name=held"))
        .await?
        .items
        .into_iter()
        .filter_map(|e| e.reason)
        .collect();
    for reason in ["Pulled", "Created", "Started", "Killing"] {
        ensure!(
            reasons.iter().any(|r| r == reason),
            "{reason} not in {reasons:?}"
        );
    }
    pods.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await?;
    wait_until(&sim, "held to be gone", || async {
        Ok(pods.get_opt("held").await?.is_none())
    })
    .await
}

/// A pod with a claim on `node`, bound to the CSI volume `pv-1` (whose handle is not its name,
/// as with real drivers); returns the VolumeAttachment's name once it is attached.
async fn attached_pod(sim: &KubeSim, node: &str) -> Result<String> {
    let volumes: Api<k8s_openapi::api::core::v1::PersistentVolume> = Api::all(sim.client());
    volumes.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "pv-1"}, "spec": {"accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Gi"}, "csi": {"driver": kube_sim::world::CSI_DRIVER, "volumeHandle": "vol-7c1d"}}}))?).await?;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(sim.client(), "default");
    claims.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "data"}, "spec": {"accessModes": ["ReadWriteOnce"], "volumeName": "pv-1", "resources": {"requests": {"storage": "1Gi"}}}}))?).await?;
    attached_pod_with(
        sim,
        node,
        json!({"persistentVolumeClaim": {"claimName": "data"}}),
    )
    .await
}

/// A pod `db` on `node` whose volume `data` is `source` (a claim's, or a generic ephemeral
/// volume); returns the VolumeAttachment's name once it is attached and the kubelet reports
/// it in use.
async fn attached_pod_with(sim: &KubeSim, node: &str, source: serde_json::Value) -> Result<String> {
    let client = sim.client();
    let mut volume = json!({"name": "data"});
    json_patch::merge(&mut volume, &source);
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.create(
        &PostParams::default(),
        &pod("db", Some(node), &json!({"spec": {"volumes": [volume]}}))?,
    )
    .await?;
    let claim = source["persistentVolumeClaim"]["claimName"]
        .as_str()
        .unwrap_or("db-data")
        .to_owned();
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    let bound_volume = || async {
        Ok::<_, anyhow::Error>(
            claims
                .get_opt(&claim)
                .await?
                .and_then(|c| c.spec?.volume_name),
        )
    };
    wait_until(sim, "the claim to be bound", || async {
        Ok(bound_volume().await?.is_some())
    })
    .await?;
    let volume = bound_volume().await?.unwrap_or_default();
    let attachments: Api<VolumeAttachment> = Api::all(client.clone());
    let name = kube_sim::world::attachment_name(&volume, node);
    wait_until(sim, "the attachment", || async {
        Ok(attachments
            .get_opt(&name)
            .await?
            .is_some_and(|va| va.status.is_some_and(|s| s.attached)))
    })
    .await?;
    // The kubelet's name for a CSI volume, from the PersistentVolume's own CSI source.
    let volumes: Api<k8s_openapi::api::core::v1::PersistentVolume> = Api::all(client.clone());
    let csi = volumes
        .get(&volume)
        .await?
        .spec
        .and_then(|spec| spec.csi)
        .context("a CSI source")?;
    let unique = format!("kubernetes.io/csi/{}^{}", csi.driver, csi.volume_handle);
    let nodes: Api<Node> = Api::all(client);
    wait_until(sim, "the kubelet to report the volume in use", || async {
        let status = nodes.get(node).await?.status.unwrap_or_default();
        let in_use = status.volumes_in_use.unwrap_or_default().contains(&unique);
        let attached = status
            .volumes_attached
            .unwrap_or_default()
            .iter()
            .any(|v| v.name == unique);
        Ok(in_use && attached)
    })
    .await?;
    Ok(name)
}

/// The node dies under its pod, whose object is then force-deleted (the KEP-2268 sequence).
async fn kill_node_and_force_delete_pod(sim: &KubeSim, node: &str) -> Result<()> {
    set_kubelet(&Api::all(sim.client()), node, "stopped").await?;
    let pods: Api<Pod> = Api::namespaced(sim.client(), "default");
    pods.delete("db", &DeleteParams::default().grace_period(0))
        .await?;
    Ok(())
}

/// Sets the node's kubelet to `state` (`stopped`, `partitioned`, `running`).
async fn set_kubelet(nodes: &Api<Node>, node: &str, state: &str) -> Result<()> {
    let annotation = json!({"metadata": {"annotations": {"sim.nodegrace.io/kubelet": state}}});
    nodes
        .patch(node, &PatchParams::default(), &Patch::Merge(annotation))
        .await?;
    Ok(())
}

/// The ephemeral volume controller makes the pod's claim, which is provisioned and attached;
/// the pod runs on it, and the claim goes with the pod. A claim of that name the pod does not
/// control is not the pod's: the pod does not start on it.
#[tokio::test]
async fn a_generic_ephemeral_volume_gets_its_claim_and_is_attached() -> Result<()> {
    let sim = sim(1).await?;
    let client = sim.client();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let scratch = json!({"spec": {"volumes": [{"name": "scratch", "ephemeral": {"volumeClaimTemplate": {
        "metadata": {"labels": {"kind": "scratch"}},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }}}]}});
    let created = pods
        .create(
            &PostParams::default(),
            &pod("cache", Some("node-0"), &scratch)?,
        )
        .await?;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    wait_until(&sim, "the pod to run on its attached claim", || async {
        Ok(running(&pods.get("cache").await?) && claims.get_opt("cache-scratch").await?.is_some())
    })
    .await?;
    let claim = claims.get("cache-scratch").await?;
    let owner = &claim.metadata.owner_references.clone().unwrap_or_default()[0];
    ensure!(
        owner.kind == "Pod"
            && Some(&owner.uid) == created.metadata.uid.as_ref()
            && owner.controller == Some(true),
        "{owner:?}"
    );
    ensure!(
        claim
            .metadata
            .labels
            .unwrap_or_default()
            .get("kind")
            .map(String::as_str)
            == Some("scratch")
    );
    let volume = claim.spec.and_then(|s| s.volume_name).unwrap_or_default();
    let attachments: Api<VolumeAttachment> = Api::all(client.clone());
    ensure!(
        attachments
            .get_opt(&kube_sim::world::attachment_name(&volume, "node-0"))
            .await?
            .is_some(),
        "no attachment for {volume}"
    );
    pods.delete("cache", &DeleteParams::default()).await?;
    wait_until(&sim, "the claim to go with its pod", || async {
        Ok(claims.get_opt("cache-scratch").await?.is_none())
    })
    .await?;
    // Someone else's claim under the name the pod's volume would take.
    claims.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "squatter-scratch"}, "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}))?).await?;
    pods.create(
        &PostParams::default(),
        &pod("squatter", Some("node-0"), &scratch)?,
    )
    .await?;
    let bound_volume = || async {
        Ok::<_, anyhow::Error>(
            claims
                .get("squatter-scratch")
                .await?
                .spec
                .and_then(|s| s.volume_name),
        )
    };
    wait_until(&sim, "the foreign claim to be bound", || async {
        Ok(bound_volume().await?.is_some())
    })
    .await?;
    let foreign = bound_volume().await?.unwrap_or_default();
    // A pod of a claim of its own, created after: once its volume is attached, the attach/
    // detach controller has judged the squatter too (every pass covers every pod).
    claims.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "witness-data"}, "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}))?).await?;
    pods.create(&PostParams::default(), &pod("witness", Some("node-0"), &json!({"spec": {"volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "witness-data"}}]}}))?).await?;
    wait_until(&sim, "the witness to run", || async {
        Ok(running(&pods.get("witness").await?))
    })
    .await?;
    ensure!(
        attachments
            .get_opt(&kube_sim::world::attachment_name(&foreign, "node-0"))
            .await?
            .is_none(),
        "the foreign claim's volume was attached for the pod"
    );
    ensure!(!running(&pods.get("squatter").await?));
    Ok(())
}

/// reconciler.go: a volume whose pod is gone is detached once the kubelet unmounted it; the
/// attacher's finalizer holds the VolumeAttachment for the detach delay.
#[tokio::test]
async fn volumes_detach_after_the_kubelet_unmounted_them() -> Result<()> {
    let sim = sim(1).await?;
    let name = attached_pod(&sim, "node-0").await?;
    let client = sim.client();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.delete("db", &DeleteParams::default()).await?;
    let nodes: Api<Node> = Api::all(client.clone());
    wait_until(&sim, "the kubelet to unmount", || async {
        let status = nodes.get("node-0").await?.status.unwrap_or_default();
        Ok(status.volumes_in_use.unwrap_or_default().is_empty())
    })
    .await?;
    let attachments: Api<VolumeAttachment> = Api::all(client);
    wait_until(&sim, "the detach to finish", || async {
        Ok(attachments.get_opt(&name).await?.is_none())
    })
    .await
}

/// The KEP-2268 case: the pod object is force-deleted from a node whose kubelet is gone. The
/// volume stays attached (still in volumesInUse) until the node gets the out-of-service taint.
#[tokio::test]
async fn a_dead_nodes_volume_stays_attached_until_out_of_service() -> Result<()> {
    let sim = sim(1).await?;
    let name = attached_pod(&sim, "node-0").await?;
    stays_attached_until_out_of_service(&sim, &name).await
}

/// The same for a generic ephemeral volume: the kubelet counts its claim's volume in use too.
#[tokio::test]
async fn a_dead_nodes_ephemeral_volume_stays_attached_until_out_of_service() -> Result<()> {
    let sim = sim(1).await?;
    let scratch = json!({"ephemeral": {"volumeClaimTemplate": {"spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}}});
    let name = attached_pod_with(&sim, "node-0", scratch).await?;
    stays_attached_until_out_of_service(&sim, &name).await
}

async fn stays_attached_until_out_of_service(sim: &KubeSim, name: &str) -> Result<()> {
    let client = sim.client();
    let nodes: Api<Node> = Api::all(client.clone());
    kill_node_and_force_delete_pod(sim, "node-0").await?;
    wait_until(sim, "node-0 to turn Unknown", || async {
        Ok(node_ready(&nodes.get("node-0").await?).as_deref() == Some("Unknown"))
    })
    .await?;
    let attachments: Api<VolumeAttachment> = Api::all(client.clone());
    ensure!(
        attachments
            .get(name)
            .await?
            .metadata
            .deletion_timestamp
            .is_none(),
        "detached while still mounted on a node not out of service"
    );
    let out_of_service = json!({"spec": {"taints": [{"key": "node.kubernetes.io/out-of-service", "value": "nodeshutdown", "effect": "NoExecute"}]}});
    nodes
        .patch(
            "node-0",
            &PatchParams::default(),
            &Patch::Merge(out_of_service),
        )
        .await?;
    wait_until(sim, "the forced detach", || async {
        Ok(attachments.get_opt(name).await?.is_none())
    })
    .await
}

/// The reconciler holds the volume it attached: a PersistentVolume deleted and made again
/// under its name for another volume does not change the name the node's `volumesInUse` is
/// read by, so the dead node's volume still counts as mounted until the out-of-service taint.
#[tokio::test]
async fn a_namesake_persistent_volume_does_not_rename_an_attached_volume() -> Result<()> {
    let sim = sim(1).await?;
    let name = attached_pod(&sim, "node-0").await?;
    let volumes: Api<k8s_openapi::api::core::v1::PersistentVolume> = Api::all(sim.client());
    volumes.delete("pv-1", &DeleteParams::default()).await?;
    wait_until(&sim, "pv-1 to be gone", || async {
        Ok(volumes.get_opt("pv-1").await?.is_none())
    })
    .await?;
    volumes.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "pv-1"}, "spec": {"accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Gi"}, "csi": {"driver": kube_sim::world::CSI_DRIVER, "volumeHandle": "vol-other"}}}))?).await?;
    stays_attached_until_out_of_service(&sim, &name).await
}

/// A running kubelet reports a mounted volume by the name it mounted it by (the volume
/// manager's actual state of the world): a namesake PersistentVolume of another volume does not
/// rename it in `volumesInUse`, so the attach/detach controller never takes it for unmounted.
#[tokio::test]
async fn a_running_kubelet_keeps_the_name_it_mounted_a_volume_by() -> Result<()> {
    let sim = sim(1).await?;
    let name = attached_pod(&sim, "node-0").await?;
    let client = sim.client();
    let nodes: Api<Node> = Api::all(client.clone());
    let in_use = || async {
        Ok::<_, anyhow::Error>(
            nodes
                .get("node-0")
                .await?
                .status
                .and_then(|status| status.volumes_in_use)
                .unwrap_or_default(),
        )
    };
    let mounted = in_use().await?;
    ensure!(mounted.len() == 1, "{mounted:?}");
    let volumes: Api<k8s_openapi::api::core::v1::PersistentVolume> = Api::all(client.clone());
    volumes.delete("pv-1", &DeleteParams::default()).await?;
    wait_until(&sim, "pv-1 to be gone", || async {
        Ok(volumes.get_opt("pv-1").await?.is_none())
    })
    .await?;
    volumes.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "pv-1"}, "spec": {"accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Gi"}, "csi": {"driver": kube_sim::world::CSI_DRIVER, "volumeHandle": "vol-other"}}}))?).await?;
    // A second pod with a volume starts on the node: the kubelet writes volumesInUse anew.
    volumes.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "pv-2"}, "spec": {"accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Gi"}, "csi": {"driver": kube_sim::world::CSI_DRIVER, "volumeHandle": "vol-2"}}}))?).await?;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    claims.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "data-2"}, "spec": {"accessModes": ["ReadWriteOnce"], "volumeName": "pv-2", "resources": {"requests": {"storage": "1Gi"}}}}))?).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let volume = json!({"name": "data", "persistentVolumeClaim": {"claimName": "data-2"}});
    pods.create(
        &PostParams::default(),
        &pod(
            "db-2",
            Some("node-0"),
            &json!({"spec": {"volumes": [volume]}}),
        )?,
    )
    .await?;
    wait_until(&sim, "the second volume reported in use", || async {
        Ok(in_use().await?.len() == 2)
    })
    .await?;
    let reported = in_use().await?;
    ensure!(
        reported.contains(&mounted[0]),
        "the mounted volume was renamed: {reported:?}, mounted as {mounted:?}"
    );
    let attachments: Api<VolumeAttachment> = Api::all(client);
    ensure!(
        !detaching(&attachments, &name).await?,
        "a mounted volume is being detached"
    );
    Ok(())
}

/// maxWaitForUnmountDuration: on a node that is not Ready, a mounted volume is detached anyway
/// once the wait ran out.
#[tokio::test]
async fn a_dead_nodes_volume_detaches_after_the_unmount_wait() -> Result<()> {
    let sim = sim_with(
        1,
        WorldOptions {
            max_wait_for_unmount: Duration::from_secs(1),
            ..quick_world()
        },
    )
    .await?;
    let name = attached_pod(&sim, "node-0").await?;
    let client = sim.client();
    let nodes: Api<Node> = Api::all(client.clone());
    kill_node_and_force_delete_pod(&sim, "node-0").await?;
    let attachments: Api<VolumeAttachment> = Api::all(client);
    wait_until(&sim, "the detach after the wait", || async {
        Ok(attachments.get_opt(&name).await?.is_none())
    })
    .await?;
    ensure!(
        node_ready(&nodes.get("node-0").await?).as_deref() == Some("Unknown"),
        "detached before the node was seen NotReady"
    );
    Ok(())
}

/// A machine that loses power while a pod of it is being deleted gracefully finishes nothing:
/// the pod stays Terminating and its volume mounted, while a live node's pod deleted after it,
/// with the same stop time, is gone. Powered again, it finishes the deletion.
#[tokio::test]
async fn a_machine_powered_off_mid_deletion_finishes_nothing() -> Result<()> {
    let sim = sim(2).await?;
    let name = attached_pod(&sim, "node-0").await?;
    let client = sim.client();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let slow = json!({"metadata": {"annotations": {"sim.nodegrace.io/stop-seconds": "1"}}});
    pods.patch("db", &PatchParams::default(), &Patch::Merge(&slow))
        .await?;
    pods.create(
        &PostParams::default(),
        &pod("witness", Some("node-1"), &slow)?,
    )
    .await?;
    wait_until(&sim, "the witness to run", || async {
        Ok(running(&pods.get("witness").await?))
    })
    .await?;
    pods.delete("db", &DeleteParams::default()).await?;
    set_kubelet(&Api::all(client.clone()), "node-0", "stopped").await?;
    pods.delete("witness", &DeleteParams::default()).await?;
    wait_until(&sim, "the witness to be gone", || async {
        Ok(pods.get_opt("witness").await?.is_none())
    })
    .await?;
    let db = pods.get("db").await?;
    ensure!(
        db.metadata.deletion_timestamp.is_some() && running(&db),
        "the dead machine's pod was finished: {:?}",
        db.status
    );
    let attachments: Api<VolumeAttachment> = Api::all(client);
    ensure!(
        !detaching(&attachments, &name).await?,
        "detached while still mounted on a machine without power"
    );
    // Back, the machine's kubelet begins the deletion again and finishes it: the pod goes and
    // its volume is detached.
    let nodes: Api<Node> = Api::all(sim.client());
    set_kubelet(&nodes, "node-0", "running").await?;
    wait_until(
        &sim,
        "the deletion to finish once the machine is back",
        || async {
            Ok(pods.get_opt("db").await?.is_none() && attachments.get_opt(&name).await?.is_none())
        },
    )
    .await
}

/// A kubelet cut off while its pod was force-deleted unmounts the orphaned volume once it
/// reaches the API server again, and the volume is detached.
#[tokio::test]
async fn a_kubelet_back_unmounts_what_was_deleted_while_it_was_cut_off() -> Result<()> {
    let sim = sim(1).await?;
    let name = attached_pod(&sim, "node-0").await?;
    let client = sim.client();
    let nodes: Api<Node> = Api::all(client.clone());
    set_kubelet(&nodes, "node-0", "partitioned").await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.delete("db", &DeleteParams::default().grace_period(0))
        .await?;
    wait_until(&sim, "node-0 to turn Unknown", || async {
        Ok(node_ready(&nodes.get("node-0").await?).as_deref() == Some("Unknown"))
    })
    .await?;
    let attachments: Api<VolumeAttachment> = Api::all(client);
    ensure!(
        attachments.get_opt(&name).await?.is_some(),
        "detached while the cut-off kubelet still had it mounted"
    );
    set_kubelet(&nodes, "node-0", "running").await?;
    wait_until(&sim, "the detach after the unmount", || async {
        Ok(attachments.get_opt(&name).await?.is_none())
    })
    .await
}

#[tokio::test]
async fn the_cloud_counts_terminations_and_stops_the_machine() -> Result<()> {
    let sim = sim(2).await?;
    let cloud = sim.world().cloud();
    wait_until(&sim, "instances for both nodes", || async {
        cloud.reconcile();
        Ok(cloud.instances().len() == 2)
    })
    .await?;
    cloud.terminate("node-1");
    cloud.terminate("node-1");
    let instance = cloud
        .instances()
        .into_iter()
        .find(|i| i.id == "node-1")
        .unwrap();
    ensure!(instance.terminate_calls == 2 && instance.state == "terminated");
    ensure!(cloud.terminate("node-9").is_none());
    let nodes: Api<Node> = Api::all(sim.client());
    let annotations = nodes
        .get("node-1")
        .await?
        .metadata
        .annotations
        .unwrap_or_default();
    ensure!(
        annotations
            .get("sim.nodegrace.io/kubelet")
            .map(String::as_str)
            == Some("stopped")
    );
    Ok(())
}

/// isMultiAttachForbidden: a ReadWriteOnce volume still attached to a dead node cannot be
/// attached to the node its pod moved to; the pod waits with a Multi-Attach error until the
/// old attachment is gone, and only then runs.
#[tokio::test]
async fn a_read_write_once_volume_moves_only_after_its_old_attachment_is_gone() -> Result<()> {
    let sim = sim(2).await?;
    let client = sim.client();
    // attached_pod's volume is ReadWriteOnce.
    let old = attached_pod(&sim, "node-0").await?;
    set_kubelet(&Api::all(client.clone()), "node-0", "stopped").await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let volume = json!({"spec": {"volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]}});
    pods.create(
        &PostParams::default(),
        &pod("db-2", Some("node-1"), &volume)?,
    )
    .await?;
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(client.clone(), "default");
    wait_until(&sim, "the Multi-Attach error", || async {
        Ok(events
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .any(|event| {
                event.reason.as_deref() == Some("FailedAttachVolume")
                    && event.involved_object.name.as_deref() == Some("db-2")
                    && event.type_.as_deref() == Some("Warning")
            }))
    })
    .await?;
    let phase = pods.get("db-2").await?.status.and_then(|s| s.phase);
    ensure!(
        phase.as_deref() == Some("Pending"),
        "started without its volume: {phase:?}"
    );
    kill_node_and_force_delete_pod(&sim, "node-0").await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let out_of_service = json!({"spec": {"taints": [{"key": "node.kubernetes.io/out-of-service", "effect": "NoExecute"}]}});
    nodes
        .patch(
            "node-0",
            &PatchParams::default(),
            &Patch::Merge(out_of_service),
        )
        .await?;
    let attachments: Api<VolumeAttachment> = Api::all(client);
    wait_until(&sim, "the old attachment to go", || async {
        Ok(attachments.get_opt(&old).await?.is_none())
    })
    .await?;
    wait_until(&sim, "db-2 to run with the volume attached", || async {
        let running = pods
            .get("db-2")
            .await?
            .status
            .and_then(|s| s.phase)
            .as_deref()
            == Some("Running");
        let attached = attachments
            .get_opt(&kube_sim::world::attachment_name("pv-1", "node-1"))
            .await?
            .is_some_and(|va| va.status.is_some_and(|s| s.attached));
        Ok(running && attached)
    })
    .await
}

/// gcTerminating: a terminating pod on a NotReady node with the out-of-service taint key is
/// marked Failed and deleted with grace 0 on the next sweep (a finalizer keeps it visible).
#[tokio::test]
async fn the_pod_gc_sweep_finishes_terminating_pods_on_out_of_service_nodes() -> Result<()> {
    let sim = sim_with_pod_gc(1, Duration::from_millis(200)).await?;
    let client = sim.client();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let held = json!({"metadata": {"finalizers": ["example.com/keep"]}});
    pods.create(
        &PostParams::default(),
        &pod("stuck", Some("node-0"), &held)?,
    )
    .await?;
    wait_until(&sim, "stuck to run", || async {
        Ok(pods
            .get("stuck")
            .await?
            .status
            .and_then(|s| s.phase)
            .as_deref()
            == Some("Running"))
    })
    .await?;
    let nodes: Api<Node> = Api::all(client.clone());
    set_kubelet(&nodes, "node-0", "stopped").await?;
    pods.delete("stuck", &DeleteParams::default()).await?;
    wait_until(&sim, "node-0 to turn Unknown", || async {
        Ok(node_ready(&nodes.get("node-0").await?).as_deref() == Some("Unknown"))
    })
    .await?;
    let stuck = pods.get("stuck").await?;
    ensure!(stuck.status.and_then(|s| s.phase).as_deref() == Some("Running"));
    // Any value and effect of the key counts.
    let taint = json!({"spec": {"taints": [{"key": "node.kubernetes.io/out-of-service", "value": "x", "effect": "NoSchedule"}]}});
    nodes
        .patch("node-0", &PatchParams::default(), &Patch::Merge(taint))
        .await?;
    wait_until(
        &sim,
        "the sweep to mark it Failed and delete it with grace 0",
        || async {
            let pod = pods.get("stuck").await?;
            let failed = pod.status.and_then(|s| s.phase).as_deref() == Some("Failed");
            Ok(failed && pod.metadata.deletion_grace_period_seconds == Some(0))
        },
    )
    .await
}

#[tokio::test]
async fn instances_power_off_and_on_with_their_kubelet() -> Result<()> {
    let sim = sim(1).await?;
    let cloud = sim.world().cloud();
    cloud.reconcile();
    let off = cloud.set_power("node-0", false).unwrap();
    ensure!(off.state == "stopped", "{off:?}");
    let nodes: Api<Node> = Api::all(sim.client());
    let kubelet = |node: Node| {
        node.metadata
            .annotations
            .unwrap_or_default()
            .get("sim.nodegrace.io/kubelet")
            .cloned()
    };
    ensure!(kubelet(nodes.get("node-0").await?).as_deref() == Some("stopped"));
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(sim.client(), "kube-node-lease");
    let renewed = |lease: k8s_openapi::api::coordination::v1::Lease| {
        lease
            .spec
            .and_then(|spec| spec.renew_time)
            .map(|time| time.0)
    };
    let before = leases.get_opt("node-0").await?.and_then(renewed);
    let on = cloud.set_power("node-0", true).unwrap();
    ensure!(on.state == "running", "{on:?}");
    // A booting kubelet reports (its Lease renewed) before it runs pods and drops the mark.
    wait_until(&sim, "the boot to finish", || async {
        Ok(kubelet(nodes.get("node-0").await?).is_none())
    })
    .await?;
    ensure!(
        renewed(leases.get("node-0").await?) > before,
        "the Lease was renewed by the boot"
    );
    cloud.terminate("node-0");
    let after = cloud.set_power("node-0", true).unwrap();
    ensure!(
        after.state == "terminated",
        "a terminated machine stays gone: {after:?}"
    );
    Ok(())
}

#[tokio::test]
async fn a_machine_terminated_after_its_node_was_replaced_leaves_the_namesake_running() -> Result<()>
{
    let sim = sim(1).await?;
    let cloud = sim.world().cloud();
    cloud.reconcile();
    let nodes: Api<Node> = Api::all(sim.client());
    // A patch, not a read-modify-replace: the kubelet writes the node meanwhile.
    nodes
        .patch(
            "node-0",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await?;
    nodes.delete("node-0", &DeleteParams::default()).await?;
    let mut namesake = kube_sim::populate::node("node-0");
    namesake["spec"]["providerID"] = serde_json::json!("sim:///node-0-b");
    nodes
        .create(&PostParams::default(), &serde_json::from_value(namesake)?)
        .await?;
    cloud.reconcile();
    let old = cloud.terminate("node-0").unwrap();
    ensure!(old.state == "terminated", "{old:?}");
    let annotations = nodes
        .get("node-0")
        .await?
        .metadata
        .annotations
        .unwrap_or_default();
    ensure!(
        !annotations.contains_key("sim.nodegrace.io/kubelet"),
        "the namesake's kubelet was stopped: {annotations:?}"
    );
    let new = cloud
        .instances()
        .into_iter()
        .find(|instance| instance.id == "node-0-b")
        .unwrap();
    ensure!(
        new.state == "running" && new.terminate_calls == 0,
        "{new:?}"
    );
    Ok(())
}

/// Answers `/ready` and `/live` with 200 or 500 as the flags say, as a program's admin port.
async fn health_server(
    ready: std::sync::Arc<std::sync::atomic::AtomicBool>,
    live: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> Result<u16> {
    use std::sync::atomic::Ordering;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let (ready, live) = (ready.clone(), live.clone());
            tokio::spawn(async move {
                let mut request = [0u8; 512];
                let n = stream.read(&mut request).await.unwrap_or(0);
                let request = String::from_utf8_lossy(&request[..n]);
                let healthy = if request.starts_with("GET /ready") {
                    ready.load(Ordering::SeqCst)
                } else {
                    live.load(Ordering::SeqCst)
                };
                let status = if healthy {
                    "200 OK"
                } else {
                    "500 Internal Server Error"
                };
                let _ = stream
                    .write_all(format!("HTTP/1.1 {status}\r\ncontent-length: 0\r\n\r\n").as_bytes())
                    .await;
            });
        }
    });
    Ok(port)
}

/// A process's readiness probe decides its pod's Ready condition, both ways; a failing
/// liveness probe restarts its container.
#[tokio::test]
async fn probes_drive_readiness_and_restart_unhealthy_containers() -> Result<()> {
    use std::sync::atomic::{AtomicBool, Ordering};
    let ready_flag = std::sync::Arc::new(AtomicBool::new(false));
    let live_flag = std::sync::Arc::new(AtomicBool::new(true));
    let port = health_server(ready_flag.clone(), live_flag.clone()).await?;
    let sim = sim_with(
        1,
        WorldOptions {
            run_images: vec!["sleeper:*=/bin".parse().map_err(anyhow::Error::msg)?],
            ..quick_world()
        },
    )
    .await?;
    let pods: Api<Pod> = Api::default_namespaced(sim.client());
    let probe = |path: &str, failures: u32| json!({"httpGet": {"host": "127.0.0.1", "port": port, "path": path}, "periodSeconds": 1, "failureThreshold": failures});
    let spec = pod(
        "probed",
        Some("node-0"),
        &json!({"spec": {"containers": [{"name": "c", "image": "sleeper:1", "command": ["sleep", "3600"],
            "readinessProbe": probe("/ready", 1), "livenessProbe": probe("/live", 2)}]}}),
    )?;
    pods.create(&PostParams::default(), &spec).await?;
    let running_unready = || async {
        let pod = pods.get("probed").await?;
        let phase = pod.status.as_ref().and_then(|s| s.phase.clone());
        Ok(phase.as_deref() == Some("Running") && !ready(&pod))
    };
    wait_until(&sim, "the pod to run, unready", running_unready).await?;
    ready_flag.store(true, Ordering::SeqCst);
    wait_until(&sim, "the probe to make it Ready", || async {
        Ok(ready(&pods.get("probed").await?))
    })
    .await?;
    ready_flag.store(false, Ordering::SeqCst);
    wait_until(&sim, "the probe to make it unready", || async {
        Ok(!ready(&pods.get("probed").await?))
    })
    .await?;
    live_flag.store(false, Ordering::SeqCst);
    // Stopped, to be restarted after the kubelet's back-off.
    wait_until(
        &sim,
        "the container to be stopped for a restart",
        || async {
            let pod = pods.get("probed").await?;
            let status = pod.status.and_then(|s| s.container_statuses);
            let status = status.as_ref().and_then(|s| s.first());
            Ok(status.is_some_and(|s| {
                s.last_state
                    .as_ref()
                    .is_some_and(|l| l.terminated.is_some())
                    && s.state.as_ref().is_some_and(|s| s.waiting.is_some())
            }))
        },
    )
    .await?;
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::default_namespaced(sim.client());
    let reasons: Vec<String> = events
        .list(&ListParams::default().fields("involvedObject.name=probed"))
        .await?
        .items
        .into_iter()
        .filter_map(|event| Some(format!("{} {}", event.reason?, event.message?)))
        .collect();
    ensure!(
        reasons.iter().any(|r| r.starts_with(
            "Unhealthy Liveness probe failed: HTTP probe failed with statuscode: 500"
        )),
        "{reasons:?}"
    );
    ensure!(
        reasons
            .iter()
            .any(|r| r == "Killing Container c failed liveness probe, will be restarted"),
        "{reasons:?}"
    );
    Ok(())
}

#[tokio::test]
async fn a_partitioned_kubelet_stops_reporting_and_the_audit_names_who_deleted_under_it()
-> Result<()> {
    let sim = sim(1).await?;
    let client: Client = sim.client();
    let nodes: Api<Node> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(client.clone(), "kube-node-lease");
    pods.create(
        &PostParams::default(),
        &pod("p", Some("node-0"), &json!({}))?,
    )
    .await?;
    wait_until(&sim, "p to be ready", || async {
        Ok(ready(&pods.get("p").await?))
    })
    .await?;
    let annotate = |value: serde_json::Value| {
        let nodes = nodes.clone();
        async move {
            nodes
                .patch(
                    "node-0",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"annotations": value}})),
                )
                .await
        }
    };
    // A clock an hour ahead shows in the renewals it writes.
    annotate(json!({"sim.nodegrace.io/clock-skew-seconds": "3600"})).await?;
    wait_until(&sim, "a renewal an hour ahead", || async {
        let renewed = leases.get("node-0").await?.spec.and_then(|s| s.renew_time);
        Ok(renewed.is_some_and(|time| {
            time.0.duration_since(jiff::Timestamp::now()) > jiff::SignedDuration::from_mins(50)
        }))
    })
    .await?;
    annotate(json!({"sim.nodegrace.io/kubelet": "partitioned"})).await?;
    wait_until(&sim, "node-0 to turn Unknown", || async {
        Ok(node_ready(&nodes.get("node-0").await?).as_deref() == Some("Unknown"))
    })
    .await?;
    pods.delete("p", &DeleteParams::default()).await?;
    let deletions = sim.world().audit().deletions();
    ensure!(
        matches!(deletions.as_slice(), [deletion] if deletion.name == "p"
            && deletion.node == "node-0"
            && deletion.kubelet == kube_sim::audit::KubeletState::Partitioned
            && deletion.user == "kube-sim-admin"
            && deletion.grace_period_seconds.is_none()),
        "{deletions:?}"
    );
    // Cut off, the kubelet cannot finish the pod; reconnected, it does.
    ensure!(pods.get("p").await?.metadata.deletion_timestamp.is_some());
    annotate(json!({"sim.nodegrace.io/kubelet": null})).await?;
    wait_until(&sim, "p to be finished once reconnected", || async {
        Ok(pods.get_opt("p").await?.is_none())
    })
    .await?;
    // Each of the three annotations above is one Node write of the client's; the kubelet's
    // own status reports are the simulator's, not an API client's.
    let writes = sim.world().audit().node_writes();
    let ours: Vec<_> = writes
        .iter()
        .filter(|write| write.name == "node-0" && write.user == "kube-sim-admin")
        .collect();
    ensure!(
        ours.len() == 3 && ours.iter().all(|write| !write.status),
        "{writes:?}"
    );
    Ok(())
}
