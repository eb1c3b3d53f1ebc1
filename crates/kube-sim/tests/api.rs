//! The API server's behaviour as kube-rs sees it: verbs, errors, resourceVersions, pagination,
//! watches (history, bookmarks, 410), selectors, deletion rules and CRDs (eviction: eviction.rs).

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod};
use kube::api::{
    DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions, WatchEvent,
    WatchParams,
};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Api, Client};
use kube_sim::{KubeSim, SimOptions, WorldOptions};
use serde_json::json;

use crate::common::store as store_wait;
use store_wait::wait_until;

async fn bare() -> Result<KubeSim> {
    Ok(KubeSim::start(SimOptions {
        world: WorldOptions::none(),
        bookmark_interval: Duration::from_millis(200),
        ..SimOptions::default()
    })
    .await?)
}

fn lease(name: &str) -> Result<Lease> {
    Ok(serde_json::from_value(
        json!({"metadata": {"name": name, "labels": {"team": "a"}}, "spec": {"holderIdentity": "me"}}),
    )?)
}

fn api_error(error: kube::Error) -> Result<kube::core::Status> {
    match error {
        kube::Error::Api(status) => Ok(*status),
        other => Err(other).context("expected an API error"),
    }
}

#[tokio::test]
async fn crud_and_error_bodies() -> Result<()> {
    let sim = bare().await?;
    let leases: Api<Lease> = Api::namespaced(sim.client(), "default");
    let created = leases.create(&PostParams::default(), &lease("a")?).await?;
    ensure!(created.metadata.uid.is_some() && created.metadata.creation_timestamp.is_some());
    let duplicate = api_error(
        leases
            .create(&PostParams::default(), &lease("a")?)
            .await
            .unwrap_err(),
    )?;
    ensure!(
        duplicate.code == 409 && duplicate.reason == "AlreadyExists",
        "{duplicate:?}"
    );
    ensure!(duplicate.message == "leases.coordination.k8s.io \"a\" already exists");

    let mut stale = created.clone();
    leases
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"holderIdentity": "other"}})),
        )
        .await?;
    stale.spec.as_mut().unwrap().holder_identity = Some("late".into());
    let conflict = api_error(
        leases
            .replace("a", &PostParams::default(), &stale)
            .await
            .unwrap_err(),
    )?;
    ensure!(
        conflict.code == 409
            && conflict.reason == "Conflict"
            && conflict.message.contains("the object has been modified")
    );

    let missing = api_error(leases.get("nope").await.unwrap_err())?;
    ensure!(missing.code == 404 && missing.reason == "NotFound");
    let invalid = api_error(
        leases
            .create(&PostParams::default(), &lease("Not_Valid")?)
            .await
            .unwrap_err(),
    )?;
    ensure!(
        invalid.code == 422 && invalid.reason == "Invalid",
        "{invalid:?}"
    );
    let no_namespace: Api<Lease> = Api::namespaced(sim.client(), "ghost");
    ensure!(
        api_error(
            no_namespace
                .create(&PostParams::default(), &lease("x")?)
                .await
                .unwrap_err()
        )?
        .code
            == 404
    );

    leases.delete("a", &DeleteParams::default()).await?;
    ensure!(leases.get_opt("a").await?.is_none());
    Ok(())
}

#[tokio::test]
async fn resource_versions_are_global_and_lists_paginate() -> Result<()> {
    let sim = bare().await?;
    let leases: Api<Lease> = Api::namespaced(sim.client(), "default");
    let mut versions = Vec::new();
    for index in 0..7 {
        let created = leases
            .create(&PostParams::default(), &lease(&format!("l{index}"))?)
            .await?;
        versions.push(created.metadata.resource_version.unwrap().parse::<u64>()?);
    }
    ensure!(versions.windows(2).all(|w| w[0] < w[1]), "{versions:?}");
    let mut names = Vec::new();
    let mut params = ListParams::default().limit(3);
    loop {
        let page = leases.list(&params).await?;
        names.extend(page.items.iter().filter_map(|l| l.metadata.name.clone()));
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => break,
        }
    }
    ensure!(
        names == (0..7).map(|i| format!("l{i}")).collect::<Vec<_>>(),
        "{names:?}"
    );
    Ok(())
}

/// Every page of a list is of its first page's moment, as etcd serves a continued list: writes
/// between pages do not show in it, and a watch from the list's version delivers them. A
/// continue token older than the history is refused (410), as after etcd's compaction.
#[tokio::test]
async fn a_continued_list_reads_its_first_pages_moment() -> Result<()> {
    let sim = bare().await?;
    let leases: Api<Lease> = Api::namespaced(sim.client(), "default");
    for name in ["a", "b", "c"] {
        leases.create(&PostParams::default(), &lease(name)?).await?;
    }
    let first = leases.list(&ListParams::default().limit(1)).await?;
    let version = first.metadata.resource_version.clone().unwrap();
    let token = first.metadata.continue_.clone().unwrap();

    let relabel = json!({"metadata": {"labels": {"team": "b"}}});
    leases
        .patch("b", &PatchParams::default(), &Patch::Merge(&relabel))
        .await?;
    leases.delete("c", &DeleteParams::default()).await?;
    leases.create(&PostParams::default(), &lease("bb")?).await?;

    let mut seen = vec![first.items[0].clone()];
    let mut params = ListParams::default().limit(1).continue_token(&token);
    loop {
        let page = leases.list(&params).await?;
        ensure!(
            page.metadata.resource_version.as_deref() == Some(version.as_str()),
            "every page carries the first page's version: {:?}",
            page.metadata
        );
        seen.extend(page.items);
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => break,
        }
    }
    let described: Vec<(String, String)> = seen
        .iter()
        .map(|lease| {
            let team = lease.metadata.labels.as_ref().and_then(|l| l.get("team"));
            (
                lease.metadata.name.clone().unwrap(),
                team.cloned().unwrap_or_default(),
            )
        })
        .collect();
    let expected = [("a", "a"), ("b", "a"), ("c", "a")].map(|(n, t)| (n.into(), t.into()));
    ensure!(described == expected, "{described:?}");

    let mut changes = leases
        .watch(&WatchParams::default(), &version)
        .await?
        .boxed();
    let mut watched = Vec::new();
    while watched.len() < 3 {
        let change = match changes.try_next().await?.context("the watch ended")? {
            WatchEvent::Modified(l) => format!("modified {}", l.metadata.name.unwrap()),
            WatchEvent::Deleted(l) => format!("deleted {}", l.metadata.name.unwrap()),
            WatchEvent::Added(l) => format!("added {}", l.metadata.name.unwrap()),
            _ => continue,
        };
        watched.push(change);
    }
    ensure!(
        watched == ["modified b", "deleted c", "added bb"],
        "{watched:?}"
    );

    sim.store().compact();
    let expired = leases
        .list(&ListParams::default().limit(1).continue_token(&token))
        .await;
    match expired {
        Err(kube::Error::Api(status)) => ensure!(status.code == 410, "{status:?}"),
        other => anyhow::bail!("expected 410, got {other:?}"),
    }
    Ok(())
}

#[tokio::test]
async fn selectors_filter_lists_including_not_equal() -> Result<()> {
    let sim = bare().await?;
    let leases: Api<Lease> = Api::namespaced(sim.client(), "default");
    leases.create(&PostParams::default(), &lease("a")?).await?;
    let mut other = lease("b")?;
    other.metadata.labels = Some([("team".to_owned(), "b".to_owned())].into());
    leases.create(&PostParams::default(), &other).await?;
    let names = |list: kube::core::ObjectList<Lease>| {
        list.items
            .into_iter()
            .filter_map(|l| l.metadata.name)
            .collect::<Vec<_>>()
    };
    ensure!(names(leases.list(&ListParams::default().labels("team=a")).await?) == ["a"]);
    ensure!(
        names(
            leases
                .list(&ListParams::default().labels("team!=a"))
                .await?
        ) == ["b"]
    );
    ensure!(
        names(
            leases
                .list(&ListParams::default().labels("team in (a,b)"))
                .await?
        ) == ["a", "b"]
    );
    let all: Api<Lease> = Api::all(sim.client());
    ensure!(
        names(
            all.list(
                &ListParams::default()
                    .fields("metadata.name=b,metadata.namespace!=kube-node-lease")
            )
            .await?
        ) == ["b"]
    );
    let bad = api_error(
        all.list(&ListParams::default().fields("spec.holderIdentity=me"))
            .await
            .unwrap_err(),
    )?;
    ensure!(bad.code == 400);
    Ok(())
}

/// A pod list by `spec.nodeName` is read from the store's node index: it must still answer
/// as a scan would, through deletions, namespaces, other terms, pages and unbound pods.
#[tokio::test]
async fn pods_listed_by_node_follow_their_binding_and_deletion() -> Result<()> {
    let sim = bare().await?;
    let namespaces: Api<Namespace> = Api::all(sim.client());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "other"}}))?,
        )
        .await?;
    let pod = |name: &str, node: &str| -> Result<Pod> {
        Ok(serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"app": name}},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]}
        }))?)
    };
    let here: Api<Pod> = Api::namespaced(sim.client(), "default");
    let there: Api<Pod> = Api::namespaced(sim.client(), "other");
    for (name, node) in [("a", "n1"), ("b", "n1"), ("c", "n2"), ("d", "")] {
        here.create(&PostParams::default(), &pod(name, node)?)
            .await?;
    }
    there
        .create(&PostParams::default(), &pod("e", "n1")?)
        .await?;
    let all: Api<Pod> = Api::all(sim.client());
    let names = |list: kube::core::ObjectList<Pod>| {
        list.items
            .into_iter()
            .map(|pod| {
                format!(
                    "{}/{}",
                    pod.metadata.namespace.unwrap_or_default(),
                    pod.metadata.name.unwrap_or_default()
                )
            })
            .collect::<Vec<_>>()
    };
    let on = |fields: &str| ListParams::default().fields(fields);
    ensure!(
        names(all.list(&on("spec.nodeName=n1")).await?) == ["default/a", "default/b", "other/e"]
    );
    ensure!(names(here.list(&on("spec.nodeName=n1")).await?) == ["default/a", "default/b"]);
    ensure!(names(there.list(&on("spec.nodeName=n1")).await?) == ["other/e"]);
    ensure!(
        names(all.list(&on("spec.nodeName=n1,metadata.name!=b")).await?)
            == ["default/a", "other/e"]
    );
    ensure!(names(all.list(&on("spec.nodeName=n1").labels("app=b")).await?) == ["default/b"]);
    ensure!(names(all.list(&on("spec.nodeName=")).await?) == ["default/d"]);
    ensure!(names(all.list(&on("spec.nodeName=n3")).await?).is_empty());
    let first = all.list(&on("spec.nodeName=n1").limit(2)).await?;
    let token = first.metadata.continue_.clone().context("a next page")?;
    ensure!(names(first) == ["default/a", "default/b"]);
    let rest = all
        .list(&on("spec.nodeName=n1").limit(2).continue_token(&token))
        .await?;
    ensure!(names(rest) == ["other/e"]);
    here.delete("a", &DeleteParams::default().grace_period(0))
        .await?;
    ensure!(names(all.list(&on("spec.nodeName=n1")).await?) == ["default/b", "other/e"]);
    Ok(())
}

#[tokio::test]
async fn watches_resume_from_history_and_expired_versions_get_410() -> Result<()> {
    let sim = bare().await?;
    let leases: Api<Lease> = Api::namespaced(sim.client(), "default");
    let first = leases.create(&PostParams::default(), &lease("a")?).await?;
    let version = first.metadata.resource_version.clone().unwrap();
    leases.create(&PostParams::default(), &lease("b")?).await?;
    leases.delete("a", &DeleteParams::default()).await?;
    let mut stream = leases
        .watch(&WatchParams::default().timeout(2), &version)
        .await?
        .boxed();
    let mut seen = Vec::new();
    while let Some(event) = stream.try_next().await? {
        match event {
            WatchEvent::Added(l) => seen.push(format!("added {}", l.metadata.name.unwrap())),
            WatchEvent::Deleted(l) => seen.push(format!("deleted {}", l.metadata.name.unwrap())),
            _ => {}
        }
        if seen.len() == 2 {
            break;
        }
    }
    ensure!(seen == ["added b", "deleted a"], "{seen:?}");

    sim.store().compact();
    let mut expired = leases
        .watch(&WatchParams::default(), &version)
        .await?
        .boxed();
    match expired.try_next().await? {
        Some(WatchEvent::Error(status)) => ensure!(status.code == 410, "{status:?}"),
        other => anyhow::bail!("expected 410, got {other:?}"),
    }
    Ok(())
}

#[tokio::test]
async fn bookmarks_arrive_when_allowed() -> Result<()> {
    let sim = bare().await?;
    let leases: Api<Lease> = Api::namespaced(sim.client(), "default");
    let list = leases.list(&ListParams::default()).await?;
    let version = list.metadata.resource_version.unwrap();
    let mut stream = leases
        .watch(&WatchParams::default().timeout(10), &version)
        .await?
        .boxed();
    let event = tokio::time::timeout(Duration::from_secs(9), stream.try_next()).await??;
    ensure!(matches!(event, Some(WatchEvent::Bookmark(_))), "{event:?}");
    Ok(())
}

#[tokio::test]
async fn reflectors_recover_from_closed_watches_and_410() -> Result<()> {
    let sim = bare().await?;
    let leases: Api<Lease> = Api::namespaced(sim.client(), "default");
    let (store, writer) = reflector::store();
    let mut events = reflector::reflector(
        writer,
        watcher(leases.clone(), watcher::Config::default().any_semantic()),
    )
    .default_backoff()
    .boxed();
    // The test drives the reflector itself and looks again after every event it yields (the
    // errors of a cut watch included: the backoff keeps the stream going past them).
    let mut drive_until = async |what: &str, done: &dyn Fn(&watcher::Event<Lease>) -> bool| {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            match tokio::time::timeout_at(deadline, events.next()).await {
                Ok(Some(Ok(event))) if done(&event) => return Ok(()),
                Ok(Some(_)) => {}
                Ok(None) => anyhow::bail!("the reflector ended before {what}"),
                Err(_) => anyhow::bail!("timed out waiting for {what}"),
            }
        }
    };
    drive_until("the reflector's first list", &|event| {
        matches!(event, watcher::Event::InitDone)
    })
    .await?;
    leases
        .create(&PostParams::default(), &lease("before")?)
        .await?;
    drive_until("the reflector to see before", &|_| store.state().len() == 1).await?;
    // History gone and every watch cut: the watcher must re-list to catch up.
    sim.store().compact();
    sim.faults().close_watches();
    leases
        .create(&PostParams::default(), &lease("after")?)
        .await?;
    drive_until("the reflector to recover", &|_| store.state().len() == 2).await
}

#[tokio::test]
async fn finalizers_hold_deletion_and_preconditions_guard_it() -> Result<()> {
    let sim = bare().await?;
    let maps: Api<ConfigMap> = Api::namespaced(sim.client(), "default");
    let held: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "held", "finalizers": ["test/hold"]}}))?;
    let created = maps.create(&PostParams::default(), &held).await?;
    let wrong_uid = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some("nope".into()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    let refused = api_error(maps.delete("held", &wrong_uid).await.unwrap_err())?;
    ensure!(
        refused.code == 409 && refused.message.contains("Precondition failed: UID"),
        "{refused:?}"
    );
    let right_uid = DeleteParams {
        preconditions: Some(Preconditions {
            uid: created.metadata.uid.clone(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    maps.delete("held", &right_uid).await?;
    let marked = maps.get("held").await?;
    ensure!(marked.metadata.deletion_timestamp.is_some());
    maps.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await?;
    ensure!(maps.get_opt("held").await?.is_none());
    Ok(())
}

#[tokio::test]
async fn pods_on_nodes_terminate_gracefully() -> Result<()> {
    let sim = bare().await?;
    let pods: Api<Pod> = Api::namespaced(sim.client(), "default");
    let pod: Pod = serde_json::from_value(
        json!({"metadata": {"name": "p"}, "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i"}]}}),
    )?;
    pods.create(&PostParams::default(), &pod).await?;
    pods.delete("p", &DeleteParams::default().grace_period(20))
        .await?;
    let terminating = pods.get("p").await?;
    ensure!(terminating.metadata.deletion_grace_period_seconds == Some(20));
    // A shorter grace shortens it; a longer one does not lengthen it.
    pods.delete("p", &DeleteParams::default().grace_period(40))
        .await?;
    ensure!(pods.get("p").await?.metadata.deletion_grace_period_seconds == Some(20));
    pods.delete("p", &DeleteParams::default().grace_period(0))
        .await?;
    ensure!(pods.get_opt("p").await?.is_none());
    let unbound: Pod = serde_json::from_value(
        json!({"metadata": {"name": "q"}, "spec": {"containers": [{"name": "c", "image": "i"}]}}),
    )?;
    pods.create(&PostParams::default(), &unbound).await?;
    pods.delete("q", &DeleteParams::default()).await?;
    ensure!(
        pods.get_opt("q").await?.is_none(),
        "unbound pods go at once"
    );
    Ok(())
}

#[tokio::test]
async fn crds_serve_their_resources() -> Result<()> {
    let sim = bare().await?;
    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> = Api::all(sim.client());
    let crd = serde_json::from_value(json!({
        "metadata": {"name": "nodedisruptionbudgets.nodegrace.io"},
        "spec": {"group": "nodegrace.io", "scope": "Cluster", "names": {"kind": "NodeDisruptionBudget", "plural": "nodedisruptionbudgets", "singular": "nodedisruptionbudget"},
                 "versions": [{"name": "v1alpha1", "served": true, "storage": true, "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}, "subresources": {"status": {}}}]}
    }))?;
    crds.create(&PostParams::default(), &crd).await?;
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("nodegrace.io", "v1alpha1", "NodeDisruptionBudget"),
        "nodedisruptionbudgets",
    );
    let budgets: Api<DynamicObject> = Api::all_with(sim.client(), &resource);
    let object: DynamicObject = serde_json::from_value(
        json!({"apiVersion": "nodegrace.io/v1alpha1", "kind": "NodeDisruptionBudget", "metadata": {"name": "all"}, "spec": {"maxUnavailable": 1}}),
    )?;
    budgets.create(&PostParams::default(), &object).await?;
    ensure!(budgets.get("all").await?.data["spec"]["maxUnavailable"] == 1);
    let discovery = kube::Discovery::new(sim.client()).run().await?;
    ensure!(discovery.groups().any(|g| g.name() == "nodegrace.io"));
    Ok(())
}

#[tokio::test]
async fn namespaces_delete_their_content_and_owners_their_dependents() -> Result<()> {
    let sim = KubeSim::start(SimOptions {
        world: WorldOptions {
            kubelet: false,
            ..WorldOptions::none()
        }
        .with_garbage_collector(),
        ..SimOptions::default()
    })
    .await?;
    let client: Client = sim.client();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "doomed"}}))?,
        )
        .await?;
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), "doomed");
    let owner = maps
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "owner"}}))?,
        )
        .await?;
    let dependent: ConfigMap = serde_json::from_value(
        json!({"metadata": {"name": "dependent", "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.metadata.uid}]}}),
    )?;
    maps.create(&PostParams::default(), &dependent).await?;
    maps.delete("owner", &DeleteParams::default()).await?;
    wait_until(&sim, "the dependent to be collected", || async {
        Ok(maps.get_opt("dependent").await?.is_none())
    })
    .await?;

    maps.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "content"}}))?,
    )
    .await?;
    namespaces
        .delete("doomed", &DeleteParams::default())
        .await?;
    let terminating = namespaces.get("doomed").await?;
    ensure!(terminating.status.and_then(|s| s.phase).as_deref() == Some("Terminating"));
    wait_until(&sim, "the namespace to go", || async {
        Ok(namespaces.get_opt("doomed").await?.is_none())
    })
    .await?;
    let _: Option<Node> = None;
    Ok(())
}

#[tokio::test]
async fn injected_faults_reach_clients() -> Result<()> {
    let sim = bare().await?;
    let leases: Api<Lease> = Api::namespaced(sim.client(), "default");
    sim.faults().add_rule(kube_sim::faults::ErrorRule {
        verb: "list".into(),
        resource: "leases".into(),
        rate: 1.0,
        failure: kube_sim::faults::FailureKind::InternalError,
    });
    ensure!(api_error(leases.list(&ListParams::default()).await.unwrap_err())?.code == 500);
    sim.faults().clear();
    leases.list(&ListParams::default()).await?;
    sim.faults().outage(Duration::from_secs(30));
    ensure!(leases.list(&ListParams::default()).await.is_err());
    sim.faults().end_outage();
    leases.list(&ListParams::default()).await?;
    Ok(())
}

#[tokio::test]
async fn tls_serving_with_the_ca_in_the_kubeconfig() -> Result<()> {
    let sim = KubeSim::start(SimOptions {
        tls: true,
        world: WorldOptions::none(),
        ..SimOptions::default()
    })
    .await?;
    ensure!(sim.url().starts_with("https://"));
    let kubeconfig = std::fs::read_to_string(sim.kubeconfig_path())?;
    ensure!(kubeconfig.contains("certificate-authority-data"));
    let namespaces: Api<Namespace> = Api::all(sim.client());
    ensure!(namespaces.list(&ListParams::default()).await?.items.len() == 4);
    Ok(())
}

#[tokio::test]
async fn deletecollection_removes_what_the_selector_matches() -> Result<()> {
    let sim = bare().await?;
    let leases: Api<Lease> = Api::namespaced(sim.client(), "default");
    for name in ["a", "b"] {
        leases.create(&PostParams::default(), &lease(name)?).await?;
    }
    let mut other = lease("c")?;
    other.metadata.labels = Some([("team".to_owned(), "b".to_owned())].into());
    leases.create(&PostParams::default(), &other).await?;
    leases
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().labels("team=a"),
        )
        .await?;
    let left: Vec<String> = leases
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|l| l.metadata.name)
        .collect();
    ensure!(left == ["c"], "{left:?}");
    Ok(())
}

/// pkg/registry/core/rest/storage_core.go + pkg/apis/events/v1/conversion.go: events.k8s.io/v1
/// is a view of the core Event storage, so each API sees what the other wrote.
#[tokio::test]
async fn events_written_through_either_api_are_one_collection() -> Result<()> {
    use k8s_openapi::api::core::v1::Event as CoreEvent;
    use k8s_openapi::api::events::v1::Event;
    let sim = bare().await?;
    let client = sim.client();
    let view: Api<Event> = Api::namespaced(client.clone(), "default");
    let core: Api<CoreEvent> = Api::namespaced(client.clone(), "default");
    let mut watch = view.watch(&WatchParams::default(), "0").await?.boxed();
    let recorded: Event = serde_json::from_value(json!({
        "metadata": {"name": "node-1.a"},
        "regarding": {"kind": "Node", "name": "node-1"},
        "note": "terminating pods", "reason": "NodeShutdown", "type": "Normal", "action": "Terminate",
        "reportingController": "nodegrace-graceful-shutdown-agent", "reportingInstance": "node-1",
        "eventTime": "2026-01-01T00:00:00.000000Z",
    }))?;
    let created = view.create(&PostParams::default(), &recorded).await?;
    ensure!(created.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("node-1"));

    let seen = core
        .list(&ListParams::default().fields("involvedObject.name=node-1"))
        .await?;
    ensure!(seen.items.len() == 1, "{:?}", seen.items);
    let event = &seen.items[0];
    ensure!(
        event.message.as_deref() == Some("terminating pods"),
        "{event:?}"
    );
    ensure!(event.reporting_component.as_deref() == Some("nodegrace-graceful-shutdown-agent"));
    ensure!(event.metadata.uid == created.metadata.uid);

    let other: CoreEvent = serde_json::from_value(json!({
        "metadata": {"name": "pod.b"},
        "involvedObject": {"kind": "Pod", "name": "web", "namespace": "default"},
        "message": "pulled", "reason": "Pulled", "type": "Normal", "source": {"component": "kubelet"},
    }))?;
    core.create(&PostParams::default(), &other).await?;
    let through_view = view.get("pod.b").await?;
    ensure!(
        through_view.note.as_deref() == Some("pulled"),
        "{through_view:?}"
    );
    ensure!(
        through_view
            .deprecated_source
            .and_then(|s| s.component)
            .as_deref()
            == Some("kubelet")
    );
    let selected = view
        .list(&ListParams::default().fields("regarding.name=node-1"))
        .await?;
    ensure!(
        selected.items.len() == 1 && selected.items[0].note.as_deref() == Some("terminating pods")
    );
    let refused = view
        .list(&ListParams::default().fields("involvedObject.name=node-1"))
        .await
        .expect_err("the view has no involvedObject field label");
    let status = api_error(refused)?;
    ensure!(
        status.code == 400
            && status
                .message
                .contains("field label not supported: involvedObject.name"),
        "{status:?}"
    );

    view.patch(
        "node-1.a",
        &PatchParams::default(),
        &Patch::Merge(json!({"note": "all pods stopped"})),
    )
    .await?;
    ensure!(core.get("node-1.a").await?.message.as_deref() == Some("all pods stopped"));

    let mut notes = Vec::new();
    while notes.len() < 3 {
        match tokio::time::timeout(Duration::from_secs(5), watch.try_next()).await?? {
            Some(WatchEvent::Added(event) | WatchEvent::Modified(event)) => {
                notes.push(event.note.unwrap_or_default());
            }
            Some(_) => {}
            None => anyhow::bail!("the watch ended"),
        }
    }
    ensure!(
        notes == ["terminating pods", "pulled", "all pods stopped"],
        "{notes:?}"
    );
    Ok(())
}

/// handlers/delete.go answers 200 for an object its finalizers hold (202 only when the client
/// asked for orphanDependents=false).
#[tokio::test]
async fn a_delete_held_by_finalizers_answers_200() -> Result<()> {
    let sim = bare().await?;
    let maps: Api<ConfigMap> = Api::namespaced(sim.client(), "default");
    for name in ["held", "held-too"] {
        let map = json!({"metadata": {"name": name, "finalizers": ["nodegrace.io/hold"]}});
        maps.create(&PostParams::default(), &serde_json::from_value(map)?)
            .await?;
    }
    let delete = |name: &str, body: &str| {
        http::Request::delete(format!("/api/v1/namespaces/default/configmaps/{name}"))
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(kube::client::Body::from(body.as_bytes().to_vec()))
    };
    let held = sim.client().send(delete("held", "{}")?).await?;
    ensure!(held.status() == 200, "{}", held.status());
    let orphaning = sim
        .client()
        .send(delete("held-too", r#"{"orphanDependents": false}"#)?)
        .await?;
    ensure!(orphaning.status() == 202, "{}", orphaning.status());
    Ok(())
}

/// A filtered watch, resumed from a version, sees an object leave its set as DELETED and
/// enter it as ADDED (cache_watcher.go judges prevObject and object).
#[tokio::test]
async fn selector_watches_resumed_from_a_version_see_objects_leave_and_enter() -> Result<()> {
    let sim = bare().await?;
    let leases: Api<Lease> = Api::namespaced(sim.client(), "default");
    let created = leases.create(&PostParams::default(), &lease("a")?).await?;
    let version = created.metadata.resource_version.clone().unwrap();
    let relabel = |team: &str| Patch::Merge(json!({"metadata": {"labels": {"team": team}}}));
    leases
        .patch("a", &PatchParams::default(), &relabel("b"))
        .await?;
    leases
        .patch("a", &PatchParams::default(), &relabel("a"))
        .await?;
    leases
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"holderIdentity": "you"}})),
        )
        .await?;
    let mut stream = leases
        .watch(
            &WatchParams::default().labels("team=a").timeout(2),
            &version,
        )
        .await?
        .boxed();
    let mut seen = Vec::new();
    while let Some(event) = stream.try_next().await? {
        match event {
            WatchEvent::Added(_) => seen.push("ADDED"),
            WatchEvent::Modified(_) => seen.push("MODIFIED"),
            WatchEvent::Deleted(_) => seen.push("DELETED"),
            _ => {}
        }
        if seen.len() == 3 {
            break;
        }
    }
    ensure!(seen == ["DELETED", "ADDED", "MODIFIED"], "{seen:?}");
    Ok(())
}

/// A metadata watcher (kube-rs `metadata_watcher`, `Accept: …;as=PartialObjectMetadata`) gets
/// PartialObjectMetadata objects, not whole ones (apiserver endpoints/handlers/response.go).
#[tokio::test]
async fn metadata_only_lists_and_watches() -> Result<()> {
    let sim = bare().await?;
    let leases: Api<Lease> = Api::default_namespaced(sim.client());
    leases.create(&PostParams::default(), &lease("a")?).await?;
    let listed = leases.list_metadata(&ListParams::default()).await?;
    let first = listed.items.first().context("one lease")?;
    ensure!(
        first
            .types
            .as_ref()
            .is_some_and(|t| t.kind == "PartialObjectMetadata")
    );
    let mut events = leases
        .watch_metadata(
            &WatchParams::default(),
            &listed.metadata.resource_version.unwrap_or_default(),
        )
        .await?
        .boxed();
    leases.create(&PostParams::default(), &lease("b")?).await?;
    let event = tokio::time::timeout(Duration::from_secs(10), events.try_next())
        .await??
        .context("a watch event")?;
    let WatchEvent::Added(partial) = event else {
        anyhow::bail!("expected ADDED, got {event:?}");
    };
    ensure!(partial.metadata.name.as_deref() == Some("b"));
    // The body on the wire carries no spec: only the metadata came.
    let raw = sim
        .client()
        .request_text(
            http::Request::get("/apis/coordination.k8s.io/v1/namespaces/default/leases/b")
                .header(
                    "accept",
                    "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1",
                )
                .body(Vec::new())?,
        )
        .await?;
    ensure!(
        !raw.contains("\"spec\"") && raw.contains("\"kind\":\"PartialObjectMetadata\""),
        "{raw}"
    );
    Ok(())
}

/// A uid in a write names the object meant: a PUT for a replaced object is a 409 precondition
/// failure, a patch naming another uid is refused as an immutable-field change.
#[tokio::test]
async fn writes_that_name_another_uid_are_refused() -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::{Patch, PatchParams, PostParams};
    let sim = kube_sim::KubeSim::start(kube_sim::SimOptions::default()).await?;
    let maps: kube::Api<ConfigMap> = kube::Api::namespaced(sim.client(), "default");
    let mut map: ConfigMap =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "m"}}))?;
    map = maps.create(&PostParams::default(), &map).await?;
    map.metadata.uid = Some("someone-else".to_owned());
    let error = maps
        .replace("m", &PostParams::default(), &map)
        .await
        .unwrap_err();
    let kube::Error::Api(status) = &error else {
        anyhow::bail!("{error}")
    };
    anyhow::ensure!(status.code == 409, "{status:?}");
    anyhow::ensure!(
        status
            .message
            .contains("Precondition failed: UID in precondition"),
        "{status:?}"
    );
    let patch = serde_json::json!({"metadata": {"uid": "someone-else"}, "data": {"a": "b"}});
    let error = maps
        .patch("m", &PatchParams::default(), &Patch::Strategic(patch))
        .await
        .unwrap_err();
    let kube::Error::Api(status) = &error else {
        anyhow::bail!("{error}")
    };
    anyhow::ensure!(status.code == 422, "{status:?}");
    Ok(())
}

/// A watch list (client-go's reflectors send one by default since 1.35), with the WatchList
/// feature gate on: the current objects as ADDED, then a bookmark marking their end, then
/// changes; without `resourceVersionMatch=NotOlderThan` it is refused as upstream refuses it.
#[tokio::test]
async fn a_watch_list_sends_the_current_objects_then_marks_their_end() -> Result<()> {
    let sim = KubeSim::start(SimOptions {
        world: WorldOptions::none(),
        bookmark_interval: Duration::from_millis(200),
        watch_list: true,
        ..SimOptions::default()
    })
    .await?;
    let leases: Api<Lease> = Api::namespaced(sim.client(), "default");
    for name in ["a", "b"] {
        leases.create(&PostParams::default(), &lease(name)?).await?;
    }
    let config = watcher::Config::default().streaming_lists();
    let mut events = watcher(leases.clone(), config).boxed();
    let mut initial = Vec::new();
    loop {
        let event = tokio::time::timeout(Duration::from_secs(10), events.try_next())
            .await
            .context("the watch list never marked the end of its initial events")??
            .context("the stream ended")?;
        match event {
            watcher::Event::Init => {}
            watcher::Event::InitApply(lease) => {
                initial.push(lease.metadata.name.unwrap_or_default());
            }
            watcher::Event::InitDone => break,
            other => anyhow::bail!("before InitDone: {other:?}"),
        }
    }
    initial.sort();
    ensure!(initial == ["a", "b"], "{initial:?}");
    leases.create(&PostParams::default(), &lease("c")?).await?;
    let next = tokio::time::timeout(Duration::from_secs(10), events.try_next()).await??;
    ensure!(
        matches!(&next, Some(watcher::Event::Apply(lease)) if lease.metadata.name.as_deref() == Some("c")),
        "{next:?}"
    );

    let refused = sim
        .client()
        .request_text(
            http::Request::get("/apis/coordination.k8s.io/v1/namespaces/default/leases?watch=true&sendInitialEvents=true&allowWatchBookmarks=true")
                .body(Vec::new())?,
        )
        .await
        .unwrap_err();
    let status = api_error(refused)?;
    ensure!(status.code == 422, "{status:?}");
    ensure!(
        status.message
            == "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
        "{status:?}"
    );
    Ok(())
}

/// 1.33's default: the WatchList feature gate is off, so a watch asking for its initial events
/// is a 422 (client-go's reflectors then list and watch); a watcher that lists first works.
#[tokio::test]
async fn without_the_watch_list_gate_initial_events_are_forbidden() -> Result<()> {
    let sim = bare().await?;
    let leases: Api<Lease> = Api::namespaced(sim.client(), "default");
    leases.create(&PostParams::default(), &lease("a")?).await?;
    let refused = sim
        .client()
        .request_text(
            http::Request::get("/apis/coordination.k8s.io/v1/namespaces/default/leases?watch=true&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan")
                .body(Vec::new())?,
        )
        .await
        .unwrap_err();
    let status = api_error(refused)?;
    ensure!(
        status.code == 422
            && status.message
                == "ListOptions.meta.k8s.io \"\" is invalid: sendInitialEvents: Forbidden: sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled",
        "{status:?}"
    );
    let mut events = watcher(leases, watcher::Config::default()).boxed();
    loop {
        let event = tokio::time::timeout(Duration::from_secs(10), events.try_next())
            .await
            .context("the list and watch never synced")??
            .context("the stream ended")?;
        if matches!(event, watcher::Event::InitDone) {
            return Ok(());
        }
    }
}
