//! Admission: real HTTPS webhooks called with AdmissionReview v1, and CRD schemas.

use std::convert::Infallible;

use anyhow::{Result, ensure};
use base64::Engine;
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube_sim::{KubeSim, SimOptions, WorldOptions};
use serde_json::{Value, json};

/// Denies objects labelled `deny: "true"`; adds the label `mutated: "yes"` when mutating.
async fn review(request: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let path = request.uri().path().to_owned();
    let body = request
        .into_body()
        .collect()
        .await
        .map(http_body_util::Collected::to_bytes)
        .unwrap_or_default();
    let review: Value = serde_json::from_slice(&body).unwrap_or_default();
    let uid = review["request"]["uid"].clone();
    let object = &review["request"]["object"];
    let mut response = json!({"uid": uid, "allowed": true});
    if path == "/validate" && object["metadata"]["labels"]["deny"] == "true" {
        response = json!({"uid": uid, "allowed": false, "status": {"code": 403, "message": "deny label present"}});
    }
    // Evictions of "protected" are denied, naming the object kind the review carried.
    if path == "/eviction" && review["request"]["name"] == "protected" {
        let message = format!(
            "no {} of {}/{} {}",
            review["request"]["kind"]["kind"]
                .as_str()
                .unwrap_or_default(),
            review["request"]["resource"]["resource"]
                .as_str()
                .unwrap_or_default(),
            review["request"]["subResource"]
                .as_str()
                .unwrap_or_default(),
            object["metadata"]["name"].as_str().unwrap_or_default(),
        );
        response =
            json!({"uid": uid, "allowed": false, "status": {"code": 403, "message": message}});
    }
    if path == "/mutate" {
        let patch = if object["metadata"]["labels"].is_object() {
            json!([{"op": "add", "path": "/metadata/labels/mutated", "value": "yes"}])
        } else {
            json!([{"op": "add", "path": "/metadata/labels", "value": {"mutated": "yes"}}])
        };
        response["patchType"] = json!("JSONPatch");
        response["patch"] =
            json!(base64::engine::general_purpose::STANDARD.encode(patch.to_string()));
    }
    // Answers the API server must check: warnings, a reason, and malformed responses.
    match path.as_str() {
        "/warn" => {
            response["warnings"] = json!(["look \"out\"", "twice"]);
            if object["metadata"]["labels"]["deny"] == "true" {
                response["allowed"] = json!(false);
                response["status"] = json!({"code": 200, "reason": "Forbidden"});
            }
        }
        "/patch-without-type" => {
            response["patch"] = json!(base64::engine::general_purpose::STANDARD.encode("[]"));
        }
        "/validate-with-patch" => {
            response["patchType"] = json!("JSONPatch");
            response["patch"] = json!(base64::engine::general_purpose::STANDARD.encode("[]"));
        }
        "/v1beta1" => {
            let answer = json!({"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview", "response": response});
            return Ok(Response::new(Full::new(Bytes::from(answer.to_string()))));
        }
        _ => {}
    }
    let answer = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response});
    Ok(Response::new(Full::new(Bytes::from(answer.to_string()))))
}

/// An HTTPS webhook server on 127.0.0.1; returns its base URL and CA bundle (base64 PEM).
async fn webhook_server() -> Result<(String, String)> {
    let tls = kube_sim::tls::generate()?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("https://127.0.0.1:{}", listener.local_addr()?.port());
    let acceptor = tls.acceptor.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(stream) = acceptor.accept(stream).await else {
                    return;
                };
                let service = hyper::service::service_fn(review);
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok((
        url,
        base64::engine::general_purpose::STANDARD.encode(&tls.ca_pem),
    ))
}

fn configuration(
    kind: &str,
    name: &str,
    url: &str,
    ca: &str,
    policy: &str,
    object_selector: &Value,
) -> Value {
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": kind,
        "metadata": {"name": name},
        "webhooks": [{
            "name": format!("{name}.nodegrace.io"),
            "clientConfig": {"url": url, "caBundle": ca},
            "rules": [{"operations": ["CREATE", "UPDATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["configmaps"]}],
            "failurePolicy": policy,
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": 5,
            "objectSelector": object_selector,
        }],
    })
}

async fn create_raw(sim: &KubeSim, plural: &str, body: &Value) -> Result<()> {
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(
            "admissionregistration.k8s.io",
            "v1",
            body["kind"].as_str().unwrap_or_default(),
        ),
        plural,
    );
    let api: Api<DynamicObject> = Api::all_with(sim.client(), &resource);
    api.create(
        &PostParams::default(),
        &serde_json::from_value(body.clone())?,
    )
    .await?;
    Ok(())
}

fn map(name: &str, labels: &Value) -> Result<ConfigMap> {
    Ok(serde_json::from_value(
        json!({"metadata": {"name": name, "labels": labels}}),
    )?)
}

#[tokio::test]
async fn webhooks_mutate_validate_and_follow_their_failure_policy() -> Result<()> {
    let sim = KubeSim::start(SimOptions {
        world: WorldOptions::none(),
        ..SimOptions::default()
    })
    .await?;
    let (url, ca) = webhook_server().await?;
    create_raw(
        &sim,
        "mutatingwebhookconfigurations",
        &configuration(
            "MutatingWebhookConfiguration",
            "mutate",
            &format!("{url}/mutate"),
            &ca,
            "Fail",
            &json!({}),
        ),
    )
    .await?;
    create_raw(
        &sim,
        "validatingwebhookconfigurations",
        &configuration(
            "ValidatingWebhookConfiguration",
            "validate",
            &format!("{url}/validate"),
            &ca,
            "Fail",
            &json!({}),
        ),
    )
    .await?;
    let maps: Api<ConfigMap> = Api::namespaced(sim.client(), "default");

    let created = maps
        .create(&PostParams::default(), &map("ok", &json!({"a": "b"}))?)
        .await?;
    ensure!(
        created
            .metadata
            .labels
            .unwrap_or_default()
            .get("mutated")
            .map(String::as_str)
            == Some("yes")
    );
    let denied = maps
        .create(
            &PostParams::default(),
            &map("no", &json!({"deny": "true"}))?,
        )
        .await
        .unwrap_err();
    let kube::Error::Api(status) = denied else {
        anyhow::bail!("expected an API error, got {denied:?}")
    };
    ensure!(
        status.code == 403
            && status.message.contains(
                "admission webhook \"validate.nodegrace.io\" denied the request: deny label present"
            ),
        "{status:?}"
    );

    // A webhook nobody answers: Ignore lets the write through, Fail refuses it.
    let dead = "https://127.0.0.1:9/";
    create_raw(
        &sim,
        "validatingwebhookconfigurations",
        &configuration(
            "ValidatingWebhookConfiguration",
            "ignored",
            dead,
            &ca,
            "Ignore",
            &json!({"matchLabels": {"probe": "ignore"}}),
        ),
    )
    .await?;
    maps.create(
        &PostParams::default(),
        &map("ignored", &json!({"probe": "ignore"}))?,
    )
    .await?;
    create_raw(
        &sim,
        "validatingwebhookconfigurations",
        &configuration(
            "ValidatingWebhookConfiguration",
            "failing",
            dead,
            &ca,
            "Fail",
            &json!({"matchLabels": {"probe": "fail"}}),
        ),
    )
    .await?;
    let failed = maps
        .create(
            &PostParams::default(),
            &map("failed", &json!({"probe": "fail"}))?,
        )
        .await
        .unwrap_err();
    let kube::Error::Api(status) = failed else {
        anyhow::bail!("expected an API error, got {failed:?}")
    };
    ensure!(
        status.code == 500
            && status
                .message
                .contains("failed calling webhook \"failing.nodegrace.io\""),
        "{status:?}"
    );
    Ok(())
}

#[tokio::test]
async fn crd_schemas_and_their_cel_rules_are_enforced() -> Result<()> {
    let sim = KubeSim::start(SimOptions {
        world: WorldOptions::none(),
        ..SimOptions::default()
    })
    .await?;
    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> = Api::all(sim.client());
    let crd = |rules: bool| -> Result<_> {
        let mut schema = json!({"type": "object", "properties": {"spec": {"type": "object", "required": ["maxUnavailable"], "properties": {"maxUnavailable": {"type": "integer", "minimum": 0}}}}});
        if rules {
            schema["x-kubernetes-validations"] = json!([{"rule": "self.spec.maxUnavailable < 10"}]);
        }
        Ok(serde_json::from_value(json!({
            "metadata": {"name": "nodedisruptionbudgets.nodegrace.io"},
            "spec": {"group": "nodegrace.io", "scope": "Cluster", "names": {"kind": "NodeDisruptionBudget", "plural": "nodedisruptionbudgets"},
                     "versions": [{"name": "v1alpha1", "served": true, "storage": true, "schema": {"openAPIV3Schema": schema}}]}
        }))?)
    };
    crds.create(&PostParams::default(), &crd(true)?).await?;
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("nodegrace.io", "v1alpha1", "NodeDisruptionBudget"),
        "nodedisruptionbudgets",
    );
    let budgets: Api<DynamicObject> = Api::all_with(sim.client(), &resource);
    let object = |spec: Value| -> Result<DynamicObject> {
        Ok(serde_json::from_value(
            json!({"apiVersion": "nodegrace.io/v1alpha1", "kind": "NodeDisruptionBudget", "metadata": {"name": "b"}, "spec": spec}),
        )?)
    };
    let invalid = budgets
        .create(
            &PostParams::default(),
            &object(json!({"maxUnavailable": -1}))?,
        )
        .await
        .unwrap_err();
    let kube::Error::Api(status) = invalid else {
        anyhow::bail!("expected 422")
    };
    ensure!(
        status.code == 422 && status.message.contains("spec.maxUnavailable"),
        "{status:?}"
    );
    let ruled = budgets
        .create(
            &PostParams::default(),
            &object(json!({"maxUnavailable": 12}))?,
        )
        .await
        .unwrap_err();
    let kube::Error::Api(status) = ruled else {
        anyhow::bail!("expected 422")
    };
    ensure!(
        status.code == 422
            && status.message.contains(
                "<nil>: Invalid value: \"object\": failed rule: self.spec.maxUnavailable < 10"
            ),
        "{status:?}"
    );
    budgets
        .create(
            &PostParams::default(),
            &object(json!({"maxUnavailable": 1}))?,
        )
        .await?;
    Ok(())
}

/// Subresource writes are admitted like any other: a webhook whose rules name `pods/eviction`
/// gets the Eviction (policy/v1) on CREATE, and its namespaceSelector may use the namespace's
/// `kubernetes.io/metadata.name` label.
#[tokio::test]
async fn webhooks_admit_pod_evictions() -> Result<()> {
    let sim = KubeSim::start(SimOptions {
        world: WorldOptions::none(),
        ..SimOptions::default()
    })
    .await?;
    let (url, ca) = webhook_server().await?;
    let mut config = configuration(
        "ValidatingWebhookConfiguration",
        "evictions",
        &format!("{url}/eviction"),
        &ca,
        "Fail",
        &json!({}),
    );
    config["webhooks"][0]["rules"] = json!([{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods/eviction"]}]);
    config["webhooks"][0]["namespaceSelector"] =
        json!({"matchLabels": {"kubernetes.io/metadata.name": "default"}});
    create_raw(&sim, "validatingwebhookconfigurations", &config).await?;
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(sim.client(), "default");
    for name in ["protected", "free"] {
        let pod = json!({"metadata": {"name": name}, "spec": {"containers": [{"name": "c", "image": "i"}]}});
        pods.create(&PostParams::default(), &serde_json::from_value(pod)?)
            .await?;
    }
    let denied = pods
        .evict("protected", &kube::api::EvictParams::default())
        .await
        .unwrap_err();
    let kube::Error::Api(status) = denied else {
        anyhow::bail!("expected an API error, got {denied:?}")
    };
    ensure!(
        status.code == 403
            && status
                .message
                .contains("no Eviction of pods/eviction protected"),
        "{status:?}"
    );
    pods.evict("free", &kube::api::EvictParams::default())
        .await?;
    ensure!(pods.get_opt("free").await?.is_none(), "free was evicted");
    Ok(())
}

/// The API server's checks of a webhook's answer (VerifyAdmissionResponse) and what it passes
/// on: warnings as `Warning` headers (also with a denial), the webhook's reason, a code of at
/// least 400, and the message "without explanation".
#[tokio::test]
async fn webhook_answers_are_checked_and_their_warnings_passed_on() -> Result<()> {
    let sim = KubeSim::start(SimOptions {
        nodes: 0,
        ..SimOptions::default()
    })
    .await?;
    let (url, ca) = webhook_server().await?;
    for (kind, plural, name, path) in [
        (
            "ValidatingWebhookConfiguration",
            "validatingwebhookconfigurations",
            "warn",
            "/warn",
        ),
        (
            "MutatingWebhookConfiguration",
            "mutatingwebhookconfigurations",
            "untyped",
            "/patch-without-type",
        ),
        (
            "ValidatingWebhookConfiguration",
            "validatingwebhookconfigurations",
            "patching",
            "/validate-with-patch",
        ),
        (
            "ValidatingWebhookConfiguration",
            "validatingwebhookconfigurations",
            "beta",
            "/v1beta1",
        ),
    ] {
        create_raw(
            &sim,
            plural,
            &configuration(
                kind,
                name,
                &format!("{url}{path}"),
                &ca,
                "Fail",
                &json!({"matchLabels": {"probe": name}}),
            ),
        )
        .await?;
    }
    let client = sim.client();
    let post = |labels: Value| {
        let body = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"generateName": "m-", "labels": labels}});
        http::Request::post("/api/v1/namespaces/default/configmaps")
            .header("content-type", "application/json")
            .body(body.to_string().into_bytes())
    };
    let warnings = |response: &http::Response<kube::client::Body>| -> Vec<String> {
        response
            .headers()
            .get_all(http::header::WARNING)
            .iter()
            .filter_map(|value| value.to_str().ok().map(str::to_owned))
            .collect()
    };
    let response = client
        .send(post(json!({"probe": "warn"}))?.map(Into::into))
        .await?;
    ensure!(response.status() == 201, "{:?}", response.status());
    ensure!(
        warnings(&response) == [r#"299 - "look \"out\"""#, r#"299 - "twice""#],
        "{:?}",
        warnings(&response)
    );
    let response = client
        .send(post(json!({"probe": "warn", "deny": "true"}))?.map(Into::into))
        .await?;
    ensure!(response.status() == 400, "a code below 400 becomes 400");
    ensure!(
        warnings(&response).len() == 2,
        "warnings come with a denial"
    );
    let body = response.into_body().collect_bytes().await?;
    let status: Value = serde_json::from_slice(&body)?;
    ensure!(status["reason"] == "Forbidden", "{status}");
    ensure!(
        status["message"]
            == "admission webhook \"warn.nodegrace.io\" denied the request: Forbidden",
        "{status}"
    );
    let maps: Api<ConfigMap> = Api::default_namespaced(client.clone());
    for (probe, expected) in [
        (
            "untyped",
            "webhook returned response.patch but not response.patchType",
        ),
        (
            "patching",
            "validating webhook may not return response.patch",
        ),
        (
            "beta",
            "expected webhook response of admission.k8s.io/v1, Kind=AdmissionReview, got admission.k8s.io/v1beta1",
        ),
    ] {
        let error = maps
            .create(
                &PostParams::default(),
                &map(probe, &json!({"probe": probe}))?,
            )
            .await
            .unwrap_err();
        ensure!(error.to_string().contains(expected), "{probe}: {error}");
    }
    Ok(())
}
