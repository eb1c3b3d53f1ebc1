//! The histories in which a terminating controller could act on the wrong object, wait for
//! ever, or over-spend a budget (issue 28), each through kube-sim: a namesake node, a dead
//! node, a pod stuck terminating, a node cordoned before its budget existed, a partition, and a
//! leader cut off from the API server.

use crate::common;

use std::time::{Duration, SystemTime};

use crate::common::{
    condition, controller, controller_via, create, delete_node, event_seen, has_event,
    has_finalizer, managing, ndb, node_gone, wait_for,
};
use anyhow::{Context, Result, ensure};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client};
use kube_sim::{KubeSim, WorldOptions};
use nodegrace_core::k8s::cached_node::CachedNode;
use nodegrace_testing::proxy::Proxy;
use serde_json::json;
use termination_controller::api::{DISRUPTED_TAINT, FINALIZER, NodeDisruptionBudget};

/// A Ready node as its kubelet registers it, on the machine `provider_id`.
fn node(name: &str, provider_id: &str) -> Result<Node> {
    let mut body = kube_sim::populate::node(name);
    body["spec"]["providerID"] = json!(provider_id);
    Ok(serde_json::from_value(body)?)
}

/// A pod bound to `node` (no scheduler), with `extra` merged into it.
async fn pod_on(client: &Client, name: &str, node: &str, extra: serde_json::Value) -> Result<()> {
    let mut body = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": name}},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "app"}]},
    });
    kube_sim::cluster::merge(&mut body, &extra);
    create(client, body).await
}

/// A PodDisruptionBudget named after the pods labelled `app: <app>`, with `limit` merged in.
async fn budget_for(client: &Client, app: &str, limit: serde_json::Value) -> Result<()> {
    let mut body = json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": app, "namespace": "default"},
        "spec": {"selector": {"matchLabels": {"app": app}}}});
    kube_sim::cluster::merge(&mut body["spec"], &limit);
    create(client, body).await
}

/// A pod on `node` whose budget never allows its eviction: that node's drain never ends.
async fn pinned(client: &Client, node: &str) -> Result<()> {
    pod_on(client, "pinned", node, json!({})).await?;
    budget_for(client, "pinned", json!({"minAvailable": 1})).await
}

fn instance(sim: &KubeSim, id: &str) -> Option<kube_sim::world::Instance> {
    sim.world()
        .cloud()
        .instances()
        .into_iter()
        .find(|instance| instance.id == id)
}

fn terminate_calls(sim: &KubeSim, id: &str) -> u32 {
    instance(sim, id).map_or(0, |instance| instance.terminate_calls)
}

fn cordoned(node: &Node) -> bool {
    let spec = node.spec.as_ref();
    spec.and_then(|spec| spec.unschedulable) == Some(true)
        || spec
            .and_then(|spec| spec.taints.as_ref())
            .is_some_and(|taints| taints.iter().any(|taint| taint.key == DISRUPTED_TAINT))
}

async fn ready(client: &Client, node: &str) -> Result<bool> {
    let nodes: Api<Node> = Api::all(client.clone());
    Ok(nodes.get_opt(node).await?.is_some_and(|node| {
        nodegrace_core::k8s::nodes::readiness(&node) == nodegrace_core::k8s::nodes::Readiness::Ready
    }))
}

/// The node's simulated kubelet stops reporting (its machine may run on), until it is NotReady.
async fn stop_kubelet(client: &Client, node: &str) -> Result<()> {
    Api::<Node>::all(client.clone())
        .patch(
            node,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(
                json!({"metadata": {"annotations": {"sim.nodegrace.io/kubelet": "stopped"}}}),
            ),
        )
        .await?;
    wait_for(&format!("{node} NotReady"), || async {
        Ok(!ready(client, node).await?)
    })
    .await
}

/// Powers `node`'s machine off, then deletes the node once it is NotReady: released without a
/// drain (`DrainSkipped`).
async fn release_dead(sim: &KubeSim, node: &str) -> Result<()> {
    let client = sim.client();
    sim.world()
        .cloud()
        .set_power(node, false)
        .with_context(|| format!("{node}'s machine"))?;
    wait_for(&format!("{node} NotReady"), || async {
        Ok(!ready(&client, node).await?)
    })
    .await?;
    delete_node(&client, node).await?;
    wait_for(&format!("{node} released"), || node_gone(&client, node)).await?;
    event_seen(&client, node, "DrainSkipped").await
}

async fn remove_finalizer_by_hand(client: &Client, name: &str) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let mut node = nodes.get(name).await?;
    node.metadata
        .finalizers
        .get_or_insert_with(Vec::new)
        .retain(|finalizer| finalizer != FINALIZER);
    nodes.replace(name, &PostParams::default(), &node).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namesake_node_is_never_touched_by_the_deleted_nodes_termination() -> Result<()> {
    let sim = common::sim(1).await?;
    let client = sim.client();
    let controller = controller(&sim, &[]).await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    for run in 0..20 {
        let name = format!("reused-{run}");
        let (first, second) = (format!("{name}-first"), format!("{name}-second"));
        nodes
            .create(
                &PostParams::default(),
                &node(&name, &format!("sim:///{first}"))?,
            )
            .await?;
        wait_for("the finalizer on the first node", || {
            has_finalizer(&client, &name)
        })
        .await?;
        let guard = format!("guard-{run}");
        pod_on(
            &client,
            &guard,
            &name,
            json!({"metadata": {"annotations": {"nodegrace.io/do-not-evict": "true"}}}),
        )
        .await?;
        delete_node(&client, &name).await?;
        wait_for("the drain blocked by the do-not-evict pod", || async {
            Ok(condition(&client, &name, "Terminating")
                .await?
                .is_some_and(|(reason, _)| reason == "BlockedByDoNotEvict"))
        })
        .await?;
        // The operator lets the node go by hand (the documented way out) and a machine
        // registers again under the same name.
        remove_finalizer_by_hand(&client, &name).await?;
        wait_for("the first node gone", || node_gone(&client, &name)).await?;
        nodes
            .create(
                &PostParams::default(),
                &node(&name, &format!("sim:///{second}"))?,
            )
            .await?;
        let tenant = format!("tenant-{run}");
        pod_on(&client, &tenant, &name, json!({})).await?;
        pods.delete(&guard, &DeleteParams::default().grace_period(0))
            .await?;
        wait_for("the first node's termination to end", || async {
            Ok(controller.gauge("nodes_terminating").await? == 0)
        })
        .await?;
        let namesake = nodes.get(&name).await?;
        ensure!(
            !cordoned(&namesake),
            "run {run}: the namesake was cordoned: {:?}",
            namesake.spec
        );
        let tenant_pod = pods.get(&tenant).await?;
        ensure!(
            tenant_pod.metadata.deletion_timestamp.is_none(),
            "run {run}: the namesake's pod was evicted"
        );
        ensure!(
            terminate_calls(&sim, &second) == 0,
            "run {run}: the namesake's machine got a terminate call"
        );
        ensure!(
            terminate_calls(&sim, &first) == 0,
            "run {run}: the let-go node's machine got a terminate call after it was let go"
        );
    }
    controller.stop().await
}

/// A node waiting for its budget has no task of its own, only a seat in the leader's waiting
/// room: let go by hand and replaced by a namesake, it leaves the room, and the namesake is
/// neither told the wait nor granted nor cordoned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namesake_of_a_node_waiting_for_its_budget_is_neither_told_nor_granted() -> Result<()> {
    let sim = common::sim(1).await?;
    let client = sim.client();
    let controller = controller(&sim, &[]).await?;
    ndb(
        &client,
        "frozen",
        json!({"selector": {"matchLabels": {"pool": "frozen"}}, "maxUnavailable": 0}),
    )
    .await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let name = "waiting";
    let frozen = |machine: &str| -> Result<Node> {
        let mut body = node(name, &format!("sim:///{machine}"))?;
        body.metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert("pool".to_owned(), "frozen".to_owned());
        Ok(body)
    };
    nodes
        .create(&PostParams::default(), &frozen("first")?)
        .await?;
    wait_for("the finalizer on the first node", || {
        has_finalizer(&client, name)
    })
    .await?;
    delete_node(&client, name).await?;
    wait_for("the first node told it waits for its budget", || async {
        Ok(condition(&client, name, "Terminating")
            .await?
            .is_some_and(|(reason, _)| reason == "AwaitingBudget"))
    })
    .await?;
    ensure!(controller.gauge("nodes_terminating").await? == 1);
    remove_finalizer_by_hand(&client, name).await?;
    wait_for("the first node gone", || node_gone(&client, name)).await?;
    nodes
        .create(&PostParams::default(), &frozen("second")?)
        .await?;
    wait_for("the first node out of the waiting room", || async {
        Ok(controller.gauge("nodes_terminating").await? == 0)
    })
    .await?;
    wait_for("the finalizer on the namesake", || {
        has_finalizer(&client, name)
    })
    .await?;
    let namesake = nodes.get(name).await?;
    ensure!(
        !cordoned(&namesake),
        "the namesake was cordoned: {:?}",
        namesake.spec
    );
    let told = condition(&client, name, "Terminating").await?;
    ensure!(told.is_none(), "the namesake was told the wait: {told:?}");
    let budget: NodeDisruptionBudget = Api::all(client.clone()).get("frozen").await?;
    let grants = budget
        .status
        .map(|status| status.disrupted_nodes)
        .unwrap_or_default();
    ensure!(grants.is_empty(), "the namesake was granted: {grants:?}");
    controller.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_node_is_released_without_waiting_for_its_pods() -> Result<()> {
    let sim = common::sim(2).await?;
    let client = sim.client();
    let controller = managing(&sim, &[]).await?;
    pod_on(&client, "on-dead", "node-0", json!({})).await?;
    budget_for(&client, "on-dead", json!({"maxUnavailable": 1})).await?;
    release_dead(&sim, "node-0").await?;
    ensure!(terminate_calls(&sim, "node-0") == 1);
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    ensure!(
        pods.get("on-dead")
            .await?
            .metadata
            .deletion_timestamp
            .is_none(),
        "a pod of a stopped machine is not evicted: nothing would confirm its end"
    );
    controller.stop().await
}

/// A dead node released without a drain leaves its pods bound to a Node that no longer exists.
/// kube-controller-manager's pod GC deletes them once its quarantine has passed, their
/// ReplicaSet replaces them, and a later drain of the same workload, under its budget of
/// maxUnavailable 1, finishes (without the pod GC, the dead node's unready pods held that
/// budget for ever and the second node never went).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_nodes_pods_are_collected_and_a_later_drain_of_their_workload_finishes() -> Result<()>
{
    let world = WorldOptions {
        pod_gc_period: Duration::from_millis(200),
        pod_gc_quarantine: Duration::from_secs(1),
        ..common::world()
    };
    let sim = common::cluster(3)
        .world(world)
        .with(common::web(6))
        .start()
        .await?;
    let client = sim.client();
    let controller = managing(&sim, &[]).await?;
    ensure!(
        !common::pods_on(&client, "node-0").await?.is_empty(),
        "web has pods on node-0"
    );
    release_dead(&sim, "node-0").await?;
    wait_for("no pod bound to node-0", || async {
        Ok(common::pods_on(&client, "node-0").await?.is_empty())
    })
    .await?;
    common::wait_ready(&client, "web", 6).await?;
    delete_node(&client, "node-1").await?;
    wait_for("node-1 drained and released", || {
        node_gone(&client, "node-1")
    })
    .await?;
    // A drain that went as it should is told in the Event that released the node.
    wait_for("node-1's release told with its drain", || async {
        let notes =
            nodegrace_testing::cluster::event_notes(&client, "node-1", "FinalizerRemoved").await?;
        Ok(notes.iter().any(|note| note.contains("drained: ")))
    })
    .await?;
    let violations = sim.world().audit().violations();
    ensure!(violations.is_empty(), "{violations:?}");
    controller.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_ready_timeout_releases_a_powered_off_node() -> Result<()> {
    let sim = common::sim(3).await?;
    let client = sim.client();
    let controller = managing(&sim, &["--not-ready-timeout=1s"]).await?;
    sim.world()
        .cloud()
        .set_power("node-2", false)
        .context("node-2's machine")?;
    wait_for("node-2 deleted and released", || {
        node_gone(&client, "node-2")
    })
    .await?;
    for reason in ["NotReadyTimeout", "DrainSkipped", "FinalizerRemoved"] {
        event_seen(&client, "node-2", reason).await?;
    }
    ensure!(terminate_calls(&sim, "node-2") == 1);
    controller.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_held_by_a_finalizer_does_not_hold_a_ready_node() -> Result<()> {
    let sim = common::sim(1).await?;
    let client = sim.client();
    let controller = managing(&sim, &[]).await?;
    pod_on(
        &client,
        "held",
        "node-0",
        json!({"metadata": {"finalizers": ["example.com/never-removed"]}}),
    )
    .await?;
    delete_node(&client, "node-0").await?;
    wait_for("node-0 released", || node_gone(&client, "node-0")).await?;
    event_seen(&client, "node-0", "PodLeftTerminating").await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let held = pods.get("held").await?;
    ensure!(
        held.metadata.deletion_timestamp.is_some(),
        "the pod was evicted and its object stays, held by its finalizer"
    );
    ensure!(terminate_calls(&sim, "node-0") == 1);
    controller.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_machine_is_released_once_its_pods_are_stuck_terminating() -> Result<()> {
    let sim = common::sim(1).await?;
    let client = sim.client();
    let controller = managing(&sim, &["--stuck-terminating-after=2s"]).await?;
    pod_on(
        &client,
        "hung",
        "node-0",
        json!({"spec": {"terminationGracePeriodSeconds": 1}}),
    )
    .await?;
    // The kubelet stops answering while the provider still reports the machine running (a
    // hung kernel): the drain runs, and nothing ever confirms the pod's end.
    stop_kubelet(&client, "node-0").await?;
    delete_node(&client, "node-0").await?;
    wait_for("node-0 released", || node_gone(&client, "node-0")).await?;
    event_seen(&client, "node-0", "PodLeftTerminating").await?;
    ensure!(
        !has_event(&client, "node-0", "DrainSkipped").await?,
        "the machine was running"
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    ensure!(
        pods.get("hung")
            .await?
            .metadata
            .deletion_timestamp
            .is_some(),
        "evicted, never confirmed gone"
    );
    ensure!(terminate_calls(&sim, "node-0") == 1);
    controller.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_draining_before_its_budget_existed_counts_as_disrupted() -> Result<()> {
    let sim = common::sim(3).await?;
    let client = sim.client();
    let controller = managing(&sim, &[]).await?;
    // node-1's drain never ends: its one pod's budget never allows a disruption.
    pinned(&client, "node-1").await?;
    delete_node(&client, "node-1").await?;
    wait_for("node-1 draining", || async {
        Ok(condition(&client, "node-1", "Terminating")
            .await?
            .is_some_and(|(reason, _)| reason == "Draining"))
    })
    .await?;
    ndb(
        &client,
        "trio",
        json!({"selector": {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In",
            "values": ["node-0", "node-1", "node-2"]}]}, "maxUnavailable": 1}),
    )
    .await?;
    let budgets: Api<NodeDisruptionBudget> = Api::all(client.clone());
    wait_for(
        "the budget's numbers: 3 selected, 2 available, 2 desired, 0 allowed",
        || async {
            let status = budgets.get_status("trio").await?.status.unwrap_or_default();
            Ok((
                status.expected_nodes,
                status.current_available,
                status.desired_available,
                status.disruptions_allowed,
            ) == (3, 2, 2, 0))
        },
    )
    .await?;
    delete_node(&client, "node-2").await?;
    wait_for("node-2 waiting for the budget", || async {
        Ok(condition(&client, "node-2", "Terminating")
            .await?
            .is_some_and(|(reason, _)| reason == "AwaitingBudget"))
    })
    .await?;
    let nodes: Api<Node> = Api::all(client.clone());
    ensure!(
        !cordoned(&nodes.get("node-2").await?),
        "node-2 was granted and cordoned"
    );
    controller.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_nodes_not_ready_at_once_are_a_partition_and_are_not_deleted() -> Result<()> {
    let sim = common::sim(10).await?;
    let client = sim.client();
    // The six go NotReady over one or two passes of the node lifecycle; a timeout shorter than
    // that spread lets the first one's deletion go ahead while it is still one of ten (a
    // loaded machine spreads the passes further).
    let controller = managing(&sim, &["--not-ready-timeout=5s"]).await?;
    let cut_off: Vec<String> = (0..6).map(|index| format!("node-{index}")).collect();
    for node in &cut_off {
        sim.world()
            .cloud()
            .set_power(node, false)
            .context("machine")?;
    }
    for node in &cut_off {
        wait_for(&format!("{node}'s deletion held"), || async {
            has_event(&client, node, "NotReadyDeletionHeld").await
        })
        .await?;
    }
    ensure!(controller.gauge("not_ready_deletions_held").await? == 1);
    let nodes: Api<Node> = Api::all(client.clone());
    for node in nodes.list(&ListParams::default()).await? {
        ensure!(
            node.metadata.deletion_timestamp.is_none(),
            "{:?} was deleted in a partition",
            node.metadata.name
        );
    }
    // Five come back: one dead machine of ten is a dead machine.
    for node in &cut_off[1..] {
        sim.world()
            .cloud()
            .set_power(node, true)
            .context("machine")?;
    }
    wait_for("node-0 deleted and released", || {
        node_gone(&client, "node-0")
    })
    .await?;
    event_seen(&client, "node-0", "NotReadyTimeout").await?;
    for node in &cut_off[1..] {
        ensure!(
            !node_gone(&client, node).await?,
            "{node} came back and stays"
        );
    }
    controller.stop().await
}

/// A kubeconfig like the simulator's that reaches it through `proxy`.
fn kubeconfig_through(
    sim: &KubeSim,
    proxy: &Proxy,
    dir: &std::path::Path,
) -> Result<std::path::PathBuf> {
    let original = std::fs::read_to_string(sim.kubeconfig_path())?;
    ensure!(
        original.contains(sim.url()),
        "the kubeconfig names {}",
        sim.url()
    );
    let path = dir.join(format!("kubeconfig-{}", proxy.address.port()));
    std::fs::write(&path, original.replace(sim.url(), &proxy.url()))?;
    Ok(path)
}

fn acts(request: &nodegrace_testing::proxy::Request) -> bool {
    request.path.contains("/eviction")
        || request.path.starts_with("/sim/v1/instances") && request.method == "DELETE"
        || request.method == "DELETE" && request.path.starts_with("/api/v1/")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_from_the_api_server_stops_before_its_lease_can_pass() -> Result<()> {
    let sim = common::sim(2).await?;
    let client = sim.client();
    let upstream: std::net::SocketAddr = sim
        .url()
        .trim_start_matches("http://")
        .parse()
        .context("the simulator's address")?;
    let dir = tempfile::tempdir()?;
    let (proxy_a, proxy_b) = (Proxy::start(upstream).await?, Proxy::start(upstream).await?);
    let election = |identity: &'static str| {
        [
            "--leader-elect=true".to_owned(),
            "--leader-election-namespace=default".to_owned(),
            format!("--leader-election-identity={identity}"),
            "--leader-election-lease-duration=3s".to_owned(),
            "--leader-election-renew-margin=1s".to_owned(),
        ]
    };
    let holder = || async {
        let leases: Api<Lease> = Api::namespaced(client.clone(), "default");
        let lease = leases.get_opt("termination-controller").await?;
        Ok::<_, anyhow::Error>(lease.and_then(|lease| lease.spec))
    };
    let flags_a = election("a");
    let a = controller_via(
        &kubeconfig_through(&sim, &proxy_a, dir.path())?,
        &flags_a.iter().map(String::as_str).collect::<Vec<_>>(),
    )
    .await?;
    wait_for("a leads", || async {
        Ok(holder()
            .await?
            .and_then(|spec| spec.holder_identity)
            .as_deref()
            == Some("a"))
    })
    .await?;
    let flags_b = election("b");
    let b = controller_via(
        &kubeconfig_through(&sim, &proxy_b, dir.path())?,
        &flags_b.iter().map(String::as_str).collect::<Vec<_>>(),
    )
    .await?;
    // node-1's drain keeps the leader busy: its pod's budget refuses every eviction.
    common::finalizer_on_every_node(&client, 2).await?;
    pinned(&client, "node-1").await?;
    delete_node(&client, "node-1").await?;
    wait_for("a evicting", || async {
        Ok(proxy_a.requests().iter().any(acts))
    })
    .await?;
    proxy_a.cut();
    // The last renewal the server holds from a: its lease may pass at renewTime + 3 s.
    let last_renewal: SystemTime = holder()
        .await?
        .and_then(|spec| spec.renew_time)
        .context("a renewed its lease")?
        .0
        .into();
    wait_for("b takes over", || async {
        Ok(holder()
            .await?
            .and_then(|spec| spec.holder_identity)
            .as_deref()
            == Some("b"))
    })
    .await?;
    let handover = SystemTime::now();
    let b_evicting = wait_for("b evicting", || async {
        Ok(proxy_b
            .requests()
            .iter()
            .any(|request| acts(request) && request.at > handover))
    })
    .await;
    if let Err(error) = b_evicting {
        let seen: Vec<String> = proxy_b
            .requests()
            .iter()
            .map(|request| {
                let at = match request.at.duration_since(handover) {
                    Ok(after) => after.as_secs_f64(),
                    Err(before) => -before.duration().as_secs_f64(),
                };
                format!("{at:+.3} {} {}", request.method, request.path)
            })
            .collect();
        anyhow::bail!("{error}; b sent since the handover: {seen:#?}");
    }
    let may_pass = last_renewal + Duration::from_secs(3);
    // a's process goes on (its watches and lease manager keep trying): once it has tried
    // anything 2 s past that point, any work still running (evictions retry within 1.2 s)
    // would have tried too.
    wait_for("a alive 2 s after its lease could pass", || async {
        Ok(proxy_a
            .requests()
            .iter()
            .any(|request| request.at >= may_pass + Duration::from_secs(2)))
    })
    .await?;
    let late: Vec<_> = proxy_a
        .requests()
        .into_iter()
        .filter(|request| acts(request) && request.at >= may_pass)
        .collect();
    ensure!(
        late.is_empty(),
        "a acted after its lease could pass to b: {late:?}"
    );
    proxy_a.heal();
    b.stop().await?;
    a.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_budgets_gauge_goes_with_it() -> Result<()> {
    let sim = common::sim(1).await?;
    let client = sim.client();
    let controller = controller(&sim, &[]).await?;
    ndb(
        &client,
        "short-lived",
        json!({"selector": {"matchLabels": {"pool": "x"}}, "maxUnavailable": 1}),
    )
    .await?;
    let series = "nodegrace_termination_controller_ndb_disruptions_allowed{ndb=\"short-lived\"}";
    wait_for("the budget's gauge", || async {
        Ok(nodegrace_testing::sample(&controller.admin().get("/metrics").await?, series).is_some())
    })
    .await?;
    let budgets: Api<NodeDisruptionBudget> = Api::all(client.clone());
    budgets
        .delete("short-lived", &DeleteParams::default())
        .await?;
    wait_for("the gauge gone with the budget", || async {
        Ok(nodegrace_testing::sample(&controller.admin().get("/metrics").await?, series).is_none())
    })
    .await?;
    controller.stop().await
}

/// A replica whose node cache is behind — its watch down for a while, as when its API traffic
/// is cut, while it still answers reviews — must not grant from that cache. Here the cache is
/// another cluster's view of the same names (all Ready, none disrupted), while in the real one
/// node-2 is already cordoned by us under the budget's only unit: the grant for node-1 must be
/// refused, as a fresh read shows. (The explorer found this: seed 1 granted two nodes of a
/// `maxUnavailable: 1` budget at once from a cache 14 s behind.)
#[tokio::test]
async fn a_grant_is_decided_on_a_fresh_read_never_on_a_cache_left_behind() -> Result<()> {
    use kube::runtime::watcher;
    use nodegrace_core::k8s::watched::{WatchCounters, Watched};
    use termination_controller::grants::Budgets;
    use termination_controller::waits::Verdict;

    let real = common::sim(3).await?;
    let elsewhere = common::sim(3).await?;
    common::workers_budget(&real.client()).await?;
    let nodes: Api<Node> = Api::all(real.client());
    nodes
        .patch(
            "node-2",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(
                json!({"spec": {"taints": [{"key": DISRUPTED_TAINT, "effect": "NoSchedule"}]}}),
            ),
        )
        .await?;
    let budgets = Budgets {
        api: Api::all(real.client()),
        cache: Watched::start(
            Api::<NodeDisruptionBudget>::all(real.client()),
            watcher::Config::default(),
            WatchCounters::default(),
        ),
        nodes: Watched::start(
            Api::<CachedNode>::all(elsewhere.client()),
            watcher::Config::default(),
            WatchCounters::default(),
        ),
        fresh: std::sync::Arc::new(termination_controller::fresh_nodes::FreshNodes::new(
            Api::all(real.client()),
        )),
        clock: std::sync::Arc::new(nodegrace_core::clock::SystemClock),
        waits: termination_controller::waits::Waits::default(),
        index: std::sync::Arc::default(),
    };
    budgets.cache.synced().await?;
    budgets.nodes.synced().await?;
    let verdict = budgets
        .acquire(&CachedNode::from(nodes.get("node-1").await?))
        .await?;
    ensure!(
        matches!(&verdict, Verdict::Waiting { budget, .. } if budget == "workers"),
        "node-1 was granted while node-2 is disrupted: {verdict:?}"
    );
    Ok(())
}

/// A grant decided just before another node of its budget died must not start a disruption
/// the budget no longer allows: before the cordon, the node's task re-reads the nodes and gives
/// the grant back. (The explorer found the window: seed 11 cordoned a node 3 ms after another
/// of its `maxUnavailable: 1` budget turned NotReady, on a grant read just before.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_overtaken_by_a_dead_node_is_given_back_before_the_cordon() -> Result<()> {
    use kube::api::{Patch, PatchParams};

    let sim = common::sim(3).await?;
    let client = sim.client();
    let controller = managing(&sim, &[]).await?;
    common::workers_budget(&client).await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let uid = nodes.get("node-1").await?.metadata.uid;
    let budgets: Api<NodeDisruptionBudget> = Api::all(client.clone());
    // The grant, as a decision made while all three nodes were Ready would have written it.
    budgets
        .patch_status(
            "workers",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"disruptedNodes": {"node-1": {"uid": uid, "grantedAt": jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string()}}}})),
        )
        .await?;
    stop_kubelet(&client, "node-2").await?;
    delete_node(&client, "node-1").await?;
    wait_for("node-1 waiting for the budget again", || async {
        Ok(condition(&client, "node-1", "Terminating")
            .await?
            .is_some_and(|(reason, _)| reason == "AwaitingBudget"))
    })
    .await?;
    ensure!(
        !cordoned(&nodes.get("node-1").await?),
        "node-1 was cordoned with node-2 dead under a maxUnavailable: 1 budget"
    );
    wait_for("the grant given back", || async {
        let status = budgets
            .get_status("workers")
            .await?
            .status
            .unwrap_or_default();
        Ok(!status.disrupted_nodes.contains_key("node-1"))
    })
    .await?;
    // Given back by a patch that tests the grant it removes: no read of the budget, no
    // conflict with the granting pass's writes.
    let budget_status = |verb: &str| {
        sim.requests()
            .of("nodegrace-termination-controller")
            .iter()
            .filter(|(kind, _)| {
                kind.verb == verb
                    && kind.resource == "nodedisruptionbudgets"
                    && kind.subresource == "status"
            })
            .map(|(_, count)| *count)
            .sum::<u64>()
    };
    ensure!(
        budget_status("patch") == 1 && budget_status("get") == 0,
        "budget status: {} patch(es), {} read(s)",
        budget_status("patch"),
        budget_status("get")
    );
    controller.stop().await
}
