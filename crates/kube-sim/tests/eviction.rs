//! The eviction subresource, branch by branch against
//! kubernetes/pkg/registry/core/pod/storage/eviction.go (EvictionREST.Create, canIgnorePDB,
//! checkAndDecrement, createTooManyRequestsError), and the availability audit it feeds.
//! The disruption controller is off: each case writes the budget status it needs.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use kube_sim::{KubeSim, SimOptions, WorldOptions};
use serde_json::{Value, json};

#[derive(Clone, Copy)]
enum Phase {
    Pending,
    Running,
    Succeeded,
    Failed,
}

struct Case {
    name: &'static str,
    phase: Phase,
    ready: bool,
    /// Already deleted with a grace period (terminating).
    deleting: bool,
    labels: Value,
    /// (spec, status) of each budget; selectors default to `app: web`.
    budgets: Vec<(Value, Value)>,
    /// The Eviction's body beyond apiVersion/kind/metadata.name.
    eviction: Value,
    query: &'static str,
    expect: Expect,
}

struct Expect {
    code: u16,
    retry_after: Option<&'static str>,
    /// A substring of the Status message or of its first cause.
    says: &'static str,
    /// Whether the pod is gone or terminating afterwards.
    pod_leaves: bool,
    /// The first budget's disruptionsAllowed afterwards.
    allowed_after: Option<i64>,
}

fn case(name: &'static str, expect: Expect) -> Case {
    Case {
        name,
        phase: Phase::Running,
        ready: true,
        deleting: false,
        labels: json!({"app": "web"}),
        budgets: Vec::new(),
        eviction: json!({}),
        query: "",
        expect,
    }
}

fn status(allowed: i64, healthy: i64, desired: i64) -> Value {
    json!({"observedGeneration": 1, "disruptionsAllowed": allowed, "currentHealthy": healthy, "desiredHealthy": desired, "expectedPods": 3})
}

fn web_budget() -> Value {
    json!({"minAvailable": 2, "selector": {"matchLabels": {"app": "web"}}})
}

fn evicted(says: &'static str, allowed_after: Option<i64>) -> Expect {
    Expect {
        code: 201,
        retry_after: None,
        says,
        pod_leaves: true,
        allowed_after,
    }
}

fn refused(code: u16, retry_after: Option<&'static str>, says: &'static str) -> Expect {
    Expect {
        code,
        retry_after,
        says,
        pod_leaves: false,
        allowed_after: None,
    }
}

#[allow(clippy::too_many_lines)]
fn cases() -> Vec<Case> {
    let with = |mut case: Case, change: &dyn Fn(&mut Case)| {
        change(&mut case);
        case
    };
    vec![
        case("no budget: plain delete", evicted("Success", None)),
        with(
            case(
                "budget allows one: decremented",
                evicted("Success", Some(0)),
            ),
            &|c| c.budgets = vec![(web_budget(), status(1, 3, 2))],
        ),
        with(
            case(
                "budget allows none: 429 without Retry-After",
                refused(
                    429,
                    None,
                    "The disruption budget b0 needs 2 healthy pods and has 2 currently",
                ),
            ),
            &|c| c.budgets = vec![(web_budget(), status(0, 2, 2))],
        ),
        with(
            case(
                "status older than the spec: 429 with Retry-After 10",
                refused(
                    429,
                    Some("10"),
                    "The disruption budget b0 is still being processed by the server.",
                ),
            ),
            &|c| {
                let mut stale = status(1, 3, 2);
                stale["observedGeneration"] = json!(0);
                c.budgets = vec![(web_budget(), stale)];
            },
        ),
        with(
            case(
                "negative disruptionsAllowed: 403",
                refused(403, None, "pdb disruptions allowed is negative"),
            ),
            &|c| c.budgets = vec![(web_budget(), status(-1, 1, 2))],
        ),
        with(
            case(
                "disruptedPods over 2000: 403",
                refused(403, None, "DisruptedPods map too big"),
            ),
            &|c| {
                let mut full = status(1, 3, 2);
                full["disruptedPods"] = (0..2001)
                    .map(|i| (format!("p{i}"), json!("2026-01-01T00:00:00Z")))
                    .collect::<serde_json::Map<_, _>>()
                    .into();
                c.budgets = vec![(web_budget(), full)];
            },
        ),
        with(
            case(
                "two budgets: 500",
                refused(500, None, "more than one PodDisruptionBudget"),
            ),
            &|c| {
                c.budgets = vec![
                    (web_budget(), status(1, 3, 2)),
                    (web_budget(), status(1, 3, 2)),
                ];
            },
        ),
        with(
            case(
                "unready, IfHealthyBudget, healthy >= desired > 0: goes without spending",
                evicted("Success", Some(0)),
            ),
            &|c| {
                c.ready = false;
                c.budgets = vec![(web_budget(), status(0, 2, 2))];
            },
        ),
        with(
            case(
                "unready, desiredHealthy 0: the budget decides (429)",
                refused(429, None, "needs 0 healthy pods and has 0 currently"),
            ),
            &|c| {
                c.ready = false;
                c.budgets = vec![(web_budget(), status(0, 0, 0))];
            },
        ),
        with(
            case(
                "unready, IfHealthyBudget, healthy < desired: 429",
                refused(429, None, "needs 2 healthy pods and has 1 currently"),
            ),
            &|c| {
                c.ready = false;
                c.budgets = vec![(web_budget(), status(0, 1, 2))];
            },
        ),
        with(
            case(
                "unready, AlwaysAllow, healthy < desired: goes",
                evicted("Success", Some(0)),
            ),
            &|c| {
                c.ready = false;
                let mut spec = web_budget();
                spec["unhealthyPodEvictionPolicy"] = json!("AlwaysAllow");
                c.budgets = vec![(spec, status(0, 1, 2))];
            },
        ),
        with(
            case(
                "ready, AlwaysAllow, none allowed: 429",
                refused(429, None, "needs 2"),
            ),
            &|c| {
                let mut spec = web_budget();
                spec["unhealthyPodEvictionPolicy"] = json!("AlwaysAllow");
                c.budgets = vec![(spec, status(0, 2, 2))];
            },
        ),
        with(
            case("Succeeded pod: budget ignored", evicted("Success", Some(0))),
            &|c| {
                c.phase = Phase::Succeeded;
                c.budgets = vec![(web_budget(), status(0, 2, 2))];
            },
        ),
        with(
            case("Failed pod: budget ignored", evicted("Success", Some(0))),
            &|c| {
                c.phase = Phase::Failed;
                c.budgets = vec![(web_budget(), status(0, 2, 2))];
            },
        ),
        with(
            case("Pending pod: budget ignored", evicted("Success", Some(0))),
            &|c| {
                c.phase = Phase::Pending;
                c.budgets = vec![(web_budget(), status(0, 2, 2))];
            },
        ),
        with(
            case(
                "terminating pod: budget ignored",
                evicted("Success", Some(0)),
            ),
            &|c| {
                c.deleting = true;
                c.budgets = vec![(web_budget(), status(0, 2, 2))];
            },
        ),
        with(
            case(
                "pod without labels: no budget applies, even one selecting label absence",
                evicted("Success", Some(0)),
            ),
            &|c| {
                c.labels = json!({});
                c.budgets = vec![(
                    json!({"minAvailable": 2, "selector": {"matchExpressions": [{"key": "app", "operator": "DoesNotExist"}]}}),
                    status(0, 2, 2),
                )];
            },
        ),
        with(
            case(
                "empty selector matches nothing",
                evicted("Success", Some(0)),
            ),
            &|c| c.budgets = vec![(json!({"minAvailable": 2, "selector": {}}), status(0, 2, 2))],
        ),
        with(
            case(
                "Eviction named for another pod: 400",
                refused(
                    400,
                    None,
                    "name in URL does not match name in Eviction object",
                ),
            ),
            &|c| c.eviction = json!({"metadata": {"name": "someone-else"}}),
        ),
        with(
            case(
                "dry run: allowed, nothing changes",
                Expect {
                    code: 201,
                    retry_after: None,
                    says: "Success",
                    pod_leaves: false,
                    allowed_after: Some(1),
                },
            ),
            &|c| {
                c.query = "?dryRun=All";
                c.budgets = vec![(web_budget(), status(1, 3, 2))];
            },
        ),
        with(
            case(
                "uid precondition of another pod: 409",
                refused(
                    409,
                    None,
                    "Precondition failed: UID in precondition: not-this-one",
                ),
            ),
            &|c| c.eviction = json!({"deleteOptions": {"preconditions": {"uid": "not-this-one"}}}),
        ),
    ]
}

async fn namespace(client: &Client, name: &str) -> Result<()> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": name}}))?,
        )
        .await?;
    Ok(())
}

async fn prepare(client: &Client, ns: &str, case: &Case) -> Result<()> {
    namespace(client, ns).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let pod = json!({"metadata": {"name": "p", "labels": case.labels}, "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i"}]}});
    pods.create(&PostParams::default(), &serde_json::from_value(pod)?)
        .await?;
    let phase = match case.phase {
        Phase::Pending => None,
        Phase::Running => Some("Running"),
        Phase::Succeeded => Some("Succeeded"),
        Phase::Failed => Some("Failed"),
    };
    if let Some(phase) = phase {
        let ready = if case.ready { "True" } else { "False" };
        let status =
            json!({"status": {"phase": phase, "conditions": [{"type": "Ready", "status": ready}]}});
        pods.patch_status("p", &PatchParams::default(), &Patch::Merge(status))
            .await?;
    }
    if case.deleting {
        pods.delete("p", &DeleteParams::default()).await?;
    }
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), ns);
    for (index, (spec, status)) in case.budgets.iter().enumerate() {
        let name = format!("b{index}");
        let budget = json!({"metadata": {"name": name}, "spec": spec});
        budgets
            .create(&PostParams::default(), &serde_json::from_value(budget)?)
            .await?;
        budgets
            .patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "status": status })),
            )
            .await?;
    }
    Ok(())
}

/// Posts the Eviction raw, so the code and headers are seen as sent.
async fn post_eviction(
    client: &Client,
    ns: &str,
    case: &Case,
) -> Result<(u16, Option<String>, Value)> {
    let mut eviction = json!({"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "p", "namespace": ns}});
    json_patch::merge(&mut eviction, &case.eviction);
    let request = http::Request::post(format!(
        "/api/v1/namespaces/{ns}/pods/p/eviction{}",
        case.query
    ))
    .header(http::header::CONTENT_TYPE, "application/json")
    .body(kube::client::Body::from(serde_json::to_vec(&eviction)?))?;
    let response = client.send(request).await?;
    let code = response.status().as_u16();
    let retry_after = response
        .headers()
        .get(http::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body = http_body_util::BodyExt::collect(response.into_body())
        .await?
        .to_bytes();
    Ok((code, retry_after, serde_json::from_slice(&body)?))
}

async fn check(client: &Client, ns: &str, case: &Case) -> Result<()> {
    let (code, retry_after, body) = post_eviction(client, ns, case).await?;
    let expect = &case.expect;
    ensure!(code == expect.code, "code {code}, body {body}");
    ensure!(
        retry_after.as_deref() == expect.retry_after,
        "Retry-After {retry_after:?}"
    );
    let said = format!(
        "{} {} {}",
        body["status"], body["message"], body["details"]["causes"][0]["message"]
    );
    ensure!(said.contains(expect.says), "said {said}");
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let pod = pods.get_opt("p").await?;
    let left = pod
        .as_ref()
        .is_none_or(|p| p.metadata.deletion_timestamp.is_some());
    ensure!(left == expect.pod_leaves, "pod left: {left}");
    if expect.pod_leaves
        && !case.deleting
        && let Some(pod) = &pod
    {
        let target = pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "DisruptionTarget"));
        ensure!(
            target.is_some_and(|t| t.reason.as_deref() == Some("EvictionByEvictionAPI")),
            "DisruptionTarget: {target:?}"
        );
    }
    if let Some(allowed) = expect.allowed_after {
        let budgets: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), ns);
        let status = budgets.get("b0").await?.status.context("budget status")?;
        ensure!(
            status.disruptions_allowed.map(i64::from) == Some(allowed),
            "disruptionsAllowed {:?}",
            status.disruptions_allowed
        );
        let recorded = status
            .disrupted_pods
            .as_ref()
            .is_some_and(|pods| pods.contains_key("p"));
        let spent = case.budgets[0].1["disruptionsAllowed"].as_i64() != Some(allowed);
        ensure!(recorded == spent, "disruptedPods has p: {recorded}");
    }
    Ok(())
}

#[tokio::test]
async fn every_branch_of_the_eviction_rest() -> Result<()> {
    let sim = KubeSim::start(SimOptions {
        world: WorldOptions::none(),
        ..SimOptions::default()
    })
    .await?;
    let client = sim.client_without_retries().await?;
    let mut failures = Vec::new();
    for (index, case) in cases().iter().enumerate() {
        let ns = format!("case-{index}");
        prepare(&client, &ns, case).await?;
        if let Err(error) = check(&client, &ns, case).await {
            failures.push(format!("{}: {error:#}", case.name));
        }
    }
    ensure!(failures.is_empty(), "{}", failures.join("\n"));
    Ok(())
}

/// The audit measures availability: a plain DELETE that takes a budget's healthy pods below
/// desiredHealthy is recorded with pod, budget and cause; one that leaves enough is not.
#[tokio::test]
async fn deletes_below_desired_healthy_are_recorded() -> Result<()> {
    let sim = KubeSim::start(SimOptions {
        world: WorldOptions {
            disruption: true,
            ..WorldOptions::none()
        },
        ..SimOptions::default()
    })
    .await?;
    let client = sim.client_without_retries().await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    for name in ["a", "b", "c"] {
        let pod = json!({"metadata": {"name": name, "labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}});
        pods.create(&PostParams::default(), &serde_json::from_value(pod)?)
            .await?;
        let ready = json!({"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}});
        pods.patch_status(name, &PatchParams::default(), &Patch::Merge(ready))
            .await?;
    }
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), "default");
    budgets
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "web"}, "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "web"}}}}))?,
        )
        .await?;
    let computed = kube::runtime::wait::await_condition(
        budgets.clone(),
        "web",
        |budget: Option<&PodDisruptionBudget>| {
            budget
                .and_then(|b| b.status.as_ref())
                .is_some_and(|s| s.current_healthy == Some(3) && s.desired_healthy == Some(2))
        },
    );
    tokio::time::timeout(Duration::from_secs(10), computed)
        .await
        .context("budget status never computed")??;
    pods.delete("a", &DeleteParams::default()).await?;
    ensure!(
        sim.world().audit().violations().is_empty(),
        "3 → 2 healthy is allowed"
    );
    pods.delete("b", &DeleteParams::default()).await?;
    let violations = sim.world().audit().violations();
    ensure!(violations.len() == 1, "{violations:?}");
    let violation = &violations[0];
    ensure!(
        violation.pod == "b"
            && violation.budget == "web"
            && violation.healthy == 1
            && violation.desired_healthy == 2
            && violation.by == kube_sim::audit::Disruption::Delete,
        "{violation:?}"
    );
    Ok(())
}
