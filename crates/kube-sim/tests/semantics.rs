//! The API server's and the control plane's semantics where they decide a controller's result,
//! checked with the real kubectl against the simulator binary. Skips (loudly) only where kubectl
//! is missing.

use std::time::Duration;

use anyhow::{Result, ensure};

use crate::common::kubectl_sim;
use kubectl_sim::{Sim, kubectl_missing};

/// A Deployment whose pods take 3 s to stop, so a deletion is seen under way.
fn slow_deployment(name: &str) -> String {
    format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: {name}}}\nspec:\n  replicas: 2\n  selector: {{matchLabels: {{app: {name}}}}}\n  template:\n    metadata:\n      labels: {{app: {name}}}\n      annotations: {{sim.nodegrace.io/stop-seconds: \"3\"}}\n    spec:\n      containers: [{{name: c, image: nginx}}]\n"
    )
}

/// garbagecollector.go: a foreground deletion keeps the owner, with its `deletionTimestamp`
/// and the `foregroundDeletion` finalizer, until the dependents that block it are gone — the
/// ReplicaSet in turn waits for its pods; an orphan deletion leaves the dependents without the
/// owner's reference.
#[test]
fn cascading_deletion_in_the_foreground_and_orphaning() -> Result<()> {
    if kubectl_missing() {
        return Ok(());
    }
    let sim = Sim::start(1)?;
    sim.apply(&slow_deployment("web"))?;
    sim.apply(&slow_deployment("kept"))?;
    for deployment in ["deployment/web", "deployment/kept"] {
        sim.ok(&["rollout", "status", deployment, "--timeout=60s"])?;
    }
    sim.ok(&[
        "delete",
        "deployment",
        "web",
        "--cascade=foreground",
        "--wait=false",
    ])?;
    let held = sim.jsonpath(
        &["deployment", "web"],
        "{.metadata.finalizers} {.metadata.deletionTimestamp}",
    )?;
    ensure!(
        held.starts_with(r#"["foregroundDeletion"] "#) && held.len() > 25,
        "the owner is not held for its dependents: {held}"
    );
    sim.wait_for(
        "the ReplicaSet to wait for its pods",
        "replicasets",
        Duration::from_secs(30),
        |sim| {
            let finalizers =
                sim.jsonpath(&["rs", "-l", "app=web"], "{.items[*].metadata.finalizers}")?;
            Ok(finalizers.contains("foregroundDeletion"))
        },
    )?;
    sim.ok(&["wait", "--for=delete", "deployment/web", "--timeout=60s"])?;
    let left = sim.ok(&["get", "rs,pods", "-l", "app=web", "-o", "name"])?;
    ensure!(
        left.is_empty(),
        "the owner went before its dependents: {left}"
    );

    sim.ok(&["delete", "deployment", "kept", "--cascade=orphan"])?;
    let owners = sim.jsonpath(
        &["rs", "-l", "app=kept"],
        "{.items[*].metadata.ownerReferences}",
    )?;
    ensure!(
        owners.is_empty(),
        "the ReplicaSet still names its owner: {owners}"
    );
    let pods = sim.jsonpath(&["pods", "-l", "app=kept"], "{.items[*].status.phase}")?;
    ensure!(pods == "Running Running", "{pods}");
    Ok(())
}

/// Go's encoding: a Lease or a Node has no `metadata.generation` (their strategies set none);
/// list and map fields tagged `omitempty` are not written when empty — `ownerReferences: []`
/// sent, or the last taint removed.
#[test]
fn generation_only_where_the_kind_has_one_and_empty_fields_omitted() -> Result<()> {
    if kubectl_missing() {
        return Ok(());
    }
    let sim = Sim::start(1)?;
    sim.apply("apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata: {name: held, namespace: default}\nspec: {holderIdentity: me, leaseDurationSeconds: 15}\n")?;
    let generations = sim.jsonpath(&["lease", "held"], "{.metadata.generation}")?
        + &sim.jsonpath(&["node", "node-0"], "{.metadata.generation}")?;
    ensure!(generations.is_empty(), "generation: {generations}");
    sim.apply(&slow_deployment("web"))?;
    let generation = sim.jsonpath(&["deployment", "web"], "{.metadata.generation}")?;
    ensure!(generation == "1", "a Deployment has one: {generation}");

    sim.apply("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: plain, namespace: default, ownerReferences: [], finalizers: [], labels: {}}\ndata: {}\n")?;
    let stored: serde_json::Value =
        serde_json::from_str(&sim.ok(&["get", "configmap", "plain", "-o", "json"])?)?;
    for field in ["ownerReferences", "finalizers", "labels"] {
        ensure!(
            stored["metadata"].get(field).is_none(),
            "{field} written empty: {stored}"
        );
    }
    ensure!(stored.get("data").is_none(), "data written empty: {stored}");

    sim.ok(&["taint", "node", "node-0", "dedicated=db:NoSchedule"])?;
    sim.ok(&["taint", "node", "node-0", "dedicated-"])?;
    let node: serde_json::Value =
        serde_json::from_str(&sim.ok(&["get", "node", "node-0", "-o", "json"])?)?;
    ensure!(
        node["spec"].get("taints").is_none(),
        "taints written empty: {}",
        node["spec"]
    );
    Ok(())
}

/// The scheduler writes a pod's `PodScheduled=False` when it changes, not on every failed
/// attempt: a later pass, seen by a pod it binds, leaves the unschedulable pod untouched.
#[test]
fn an_unschedulable_pod_is_not_rewritten_on_every_attempt() -> Result<()> {
    if kubectl_missing() {
        return Ok(());
    }
    let sim = Sim::start(1)?;
    let pod = |name: &str, selector: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  nodeSelector: {{{selector}}}\n  containers: [{{name: c, image: nginx}}]\n"
        )
    };
    sim.apply(&pod("nowhere", "disk: tape"))?;
    let condition = "{.status.conditions[?(@.type==\"PodScheduled\")].reason}";
    sim.wait_for(
        "nowhere to be unschedulable",
        "pods",
        Duration::from_secs(30),
        |sim| Ok(sim.jsonpath(&["pod", "nowhere"], condition)? == "Unschedulable"),
    )?;
    let before = sim.jsonpath(&["pod", "nowhere"], "{.metadata.resourceVersion}")?;
    sim.apply(&pod("witness", "kubernetes.io/hostname: node-0"))?;
    sim.wait_for(
        "witness to be bound",
        "pods",
        Duration::from_secs(30),
        |sim| {
            Ok(!sim
                .jsonpath(&["pod", "witness"], "{.spec.nodeName}")?
                .is_empty())
        },
    )?;
    let after = sim.jsonpath(&["pod", "nowhere"], "{.metadata.resourceVersion}")?;
    ensure!(before == after, "rewritten: {before} -> {after}");
    Ok(())
}

/// A server-side dry run of a create is judged as the create would be — a namesake answers
/// 409 AlreadyExists, an invalid object 422 — and stores nothing.
#[test]
fn a_dry_run_create_is_judged_as_the_create() -> Result<()> {
    if kubectl_missing() {
        return Ok(());
    }
    let sim = Sim::start(1)?;
    let config = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: settings, namespace: default}\ndata: {level: debug}\n";
    sim.apply(config)?;
    let path = sim.dir.path().join("settings.yaml");
    std::fs::write(&path, config)?;
    let file = path.to_str().unwrap_or_default();
    let namesake = sim.kubectl(&["create", "--dry-run=server", "-f", file])?;
    let said = String::from_utf8_lossy(&namesake.stderr);
    ensure!(
        !namesake.status.success() && said.contains("already exists"),
        "a dry run over a namesake: {said}"
    );
    let fresh = config.replace("name: settings", "name: other");
    std::fs::write(&path, &fresh)?;
    let judged = sim.ok(&[
        "create",
        "--dry-run=server",
        "-f",
        file,
        "-o",
        "jsonpath={.metadata.uid}",
    ])?;
    ensure!(
        !judged.is_empty(),
        "a dry run returns the object as created"
    );
    let stored = sim.kubectl(&["get", "configmap", "other"])?;
    ensure!(!stored.status.success(), "a dry run stored the object");
    let mismatched =
        slow_deployment("web").replace("matchLabels: {app: web}", "matchLabels: {app: other}");
    std::fs::write(&path, mismatched)?;
    let invalid = sim.kubectl(&["create", "--dry-run=server", "-f", file])?;
    let said = String::from_utf8_lossy(&invalid.stderr);
    ensure!(
        !invalid.status.success() && said.contains("`selector` does not match template `labels`"),
        "an invalid dry run: {said}"
    );
    Ok(())
}

/// Built-in kinds decode as their Go types: kubectl's default `fieldValidation=Strict` refuses
/// an unknown field with a 400 naming it, `--validate=false` has it dropped, a value of the
/// wrong type is refused either way, and a quantity may be a number. A custom resource's
/// metadata is an ObjectMeta too: a field it does not have is unknown.
#[test]
fn bodies_decode_as_the_go_types() -> Result<()> {
    if kubectl_missing() {
        return Ok(());
    }
    let sim = Sim::start(1)?;
    let path = sim.dir.path().join("body.yaml");
    let file = path.to_str().unwrap_or_default().to_owned();
    let attempt = |yaml: &str, extra: &[&str]| -> Result<(bool, String)> {
        std::fs::write(&path, yaml)?;
        let mut args = vec!["apply", "-f", file.as_str()];
        args.extend_from_slice(extra);
        let output = sim.kubectl(&args)?;
        Ok((
            output.status.success(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        ))
    };
    let typo = "apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata: {name: typo, namespace: default}\nspec: {holderIdentiy: me}\n";
    let (created, said) = attempt(typo, &[])?;
    ensure!(
        !created
            && said.contains("Lease in version \"v1\" cannot be handled as a Lease: strict decoding error: unknown field \"spec.holderIdentiy\""),
        "an unknown field under Strict: {said}"
    );
    let (created, said) = attempt(typo, &["--validate=false"])?;
    ensure!(created, "an unknown field without validation: {said}");
    let spec = sim.jsonpath(&["lease", "typo"], "{.spec}")?;
    ensure!(spec == "{}", "the unknown field was kept: {spec}");

    let quoted = "apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata: {name: quoted, namespace: default}\nspec: {leaseDurationSeconds: \"15\"}\n";
    let (created, said) = attempt(quoted, &["--validate=false"])?;
    ensure!(
        !created
            && said.contains("cannot be handled as a Lease")
            && said.contains("spec.leaseDurationSeconds"),
        "a string where an int32 belongs: {said}"
    );

    let sized = "apiVersion: v1\nkind: Pod\nmetadata: {name: sized, namespace: default}\nspec:\n  containers: [{name: c, image: nginx, resources: {requests: {cpu: 1, memory: 64Mi}}}]\n";
    let (created, said) = attempt(sized, &[])?;
    ensure!(created, "a number as a quantity: {said}");
    let cpu = sim.jsonpath(
        &["pod", "sized"],
        "{.spec.containers[0].resources.requests.cpu}",
    )?;
    ensure!(cpu == "1", "{cpu}");

    sim.apply("apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata: {name: widgets.example.com}\nspec:\n  group: example.com\n  names: {kind: Widget, plural: widgets, singular: widget, listKind: WidgetList}\n  scope: Namespaced\n  versions:\n  - name: v1\n    served: true\n    storage: true\n    schema:\n      openAPIV3Schema:\n        type: object\n        properties:\n          spec:\n            type: object\n            properties:\n              size: {type: integer}\n              template: {type: object, x-kubernetes-embedded-resource: true, x-kubernetes-preserve-unknown-fields: true}\n")?;
    sim.wait_for(
        "widgets to be served",
        "customresourcedefinitions",
        Duration::from_secs(30),
        |sim| Ok(sim.kubectl(&["get", "widgets"])?.status.success()),
    )?;
    let widget = "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w, namespace: default, colour: red}\nspec:\n  size: 1\n  template: {apiVersion: v1, kind: Pod, metadata: {name: p, shade: blue}, spec: {any: 1}}\n";
    let (created, said) = attempt(widget, &[])?;
    ensure!(
        !created && said.contains("unknown field \"metadata.colour\""),
        "an unknown metadata field of a custom resource under Strict: {said}"
    );
    let (created, said) = attempt(widget, &["--validate=false"])?;
    ensure!(created, "{said}");
    let stored: serde_json::Value =
        serde_json::from_str(&sim.ok(&["get", "widget", "w", "-o", "json"])?)?;
    ensure!(
        stored["metadata"].get("colour").is_none()
            && stored["spec"]["template"]["metadata"]
                .get("shade")
                .is_none()
            && stored["spec"]["template"]["apiVersion"] == "v1"
            && stored["spec"]["template"]["spec"]["any"] == 1,
        "metadata kept a field ObjectMeta does not have: {stored}"
    );
    Ok(())
}

/// Paginated lists without selectors say how many items are left
/// (`metadata.remainingItemCount`), lists with one do not; a watch from a version older than
/// the server's window (`resourceVersion=1`) answers 410 Expired.
#[test]
fn lists_count_what_is_left_and_old_watches_expire() -> Result<()> {
    if kubectl_missing() {
        return Ok(());
    }
    let sim = Sim::start(1)?;
    sim.apply("apiVersion: v1\nkind: Namespace\nmetadata: {name: paged}\n")?;
    for name in ["a", "b", "c"] {
        sim.apply(&format!("apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata: {{name: {name}, namespace: paged, labels: {{team: x}}}}\n"))?;
    }
    let page = |path: &str| -> Result<serde_json::Value> {
        Ok(serde_json::from_str(&sim.ok(&["get", "--raw", path])?)?)
    };
    let first = page("/apis/coordination.k8s.io/v1/namespaces/paged/leases?limit=1")?;
    ensure!(
        first["metadata"]["remainingItemCount"] == 2,
        "{}",
        first["metadata"]
    );
    let token = first["metadata"]["continue"].as_str().unwrap_or_default();
    let second = page(&format!(
        "/apis/coordination.k8s.io/v1/namespaces/paged/leases?limit=1&continue={token}"
    ))?;
    ensure!(
        second["metadata"]["remainingItemCount"] == 1,
        "{}",
        second["metadata"]
    );
    let all = page("/apis/coordination.k8s.io/v1/leases")?;
    let total = all["items"].as_array().map_or(0, Vec::len);
    let everywhere = page("/apis/coordination.k8s.io/v1/leases?limit=2")?;
    ensure!(
        everywhere["metadata"]["remainingItemCount"] == total - 2,
        "{total} leases: {}",
        everywhere["metadata"]
    );
    let selected = page(
        "/apis/coordination.k8s.io/v1/namespaces/paged/leases?limit=1&labelSelector=team%3Dx",
    )?;
    ensure!(
        selected["metadata"].get("remainingItemCount").is_none()
            && selected["metadata"]["continue"].is_string(),
        "{}",
        selected["metadata"]
    );

    let expired = sim.ok(&[
        "get",
        "--raw",
        "/api/v1/namespaces?watch=true&resourceVersion=1&timeoutSeconds=5",
    ])?;
    let event: serde_json::Value =
        serde_json::from_str(expired.lines().next().unwrap_or_default())?;
    ensure!(
        event["type"] == "ERROR"
            && event["object"]["code"] == 410
            && event["object"]["reason"] == "Expired",
        "{expired}"
    );
    Ok(())
}

/// Webhook configurations are validated as admissionregistration/v1 validates them: without
/// `sideEffects` and `admissionReviewVersions` the 422 names both; a valid one has a generation
/// its webhooks' changes bump.
#[test]
fn webhook_configurations_are_validated() -> Result<()> {
    if kubectl_missing() {
        return Ok(());
    }
    let sim = Sim::start(0)?;
    let path = sim.dir.path().join("webhooks.yaml");
    let configuration = |extra: &str, timeout: u32| {
        format!(
            "apiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingWebhookConfiguration\nmetadata: {{name: guard}}\nwebhooks:\n- name: guard.example.com\n  clientConfig: {{url: \"https://guard.example.com/\"}}\n  timeoutSeconds: {timeout}\n{extra}"
        )
    };
    std::fs::write(&path, configuration("", 5))?;
    let refused = sim.kubectl(&["apply", "-f", path.to_str().unwrap_or_default()])?;
    let said = String::from_utf8_lossy(&refused.stderr);
    ensure!(
        !refused.status.success()
            && said.contains("The ValidatingWebhookConfiguration \"guard\" is invalid")
            && said.contains("* webhooks[0].sideEffects: Required value: must specify one of None, NoneOnDryRun")
            && said.contains("* webhooks[0].admissionReviewVersions: Required value: must specify one of v1, v1beta1"),
        "{said}"
    );
    let complete = "  sideEffects: None\n  admissionReviewVersions: [v1]\n";
    sim.apply(&configuration(complete, 5))?;
    let generation = sim.jsonpath(
        &["validatingwebhookconfiguration", "guard"],
        "{.metadata.generation}",
    )?;
    ensure!(generation == "1", "{generation}");
    sim.apply(&configuration(complete, 10))?;
    let generation = sim.jsonpath(
        &["validatingwebhookconfiguration", "guard"],
        "{.metadata.generation}",
    )?;
    ensure!(generation == "2", "{generation}");
    Ok(())
}

/// kubectl's `create` generators send protobuf; each object reads as the same generator's JSON
/// (`--dry-run=client -o json`, created in a twin namespace) does, once the zero values a
/// protobuf body carries for Go's non-pointer fields are set aside.
#[test]
fn the_create_generators_protobuf_reads_as_their_json() -> Result<()> {
    if kubectl_missing() {
        return Ok(());
    }
    let sim = Sim::start(1)?;
    sim.ok(&["create", "namespace", "pb"])?;
    sim.apply("apiVersion: v1\nkind: Namespace\nmetadata: {name: js}\n")?;
    let generators: &[&[&str]] = &[
        &["configmap", "settings", "--from-literal=level=debug"],
        &[
            "secret",
            "generic",
            "creds",
            "--from-literal=password=hunter2",
        ],
        &[
            "deployment",
            "web",
            "--image=nginx",
            "--replicas=0",
            "--port=80",
        ],
        &[
            "poddisruptionbudget",
            "web",
            "--selector=app=web",
            "--min-available=50%",
        ],
        &["job", "once", "--image=busybox", "--", "echo", "hi"],
        &[
            "cronjob",
            "tick",
            "--image=busybox",
            "--schedule=*/5 * * * *",
            "--",
            "date",
        ],
        &["serviceaccount", "robot"],
        &["role", "reader", "--verb=get,list", "--resource=pods"],
        &["rolebinding", "reads", "--role=reader", "--user=alice"],
        &["service", "clusterip", "front", "--tcp=80:8080"],
    ];
    let path = sim.dir.path().join("twin.json");
    let file = path.to_str().unwrap_or_default().to_owned();
    for generator in generators {
        // Flags before the generator's own words: a job's command follows its `--`.
        let mut created = vec!["create", "-n", "pb", "-o", "json"];
        created.extend_from_slice(generator);
        let from_protobuf: serde_json::Value = serde_json::from_str(&sim.ok(&created)?)?;
        let mut twin = vec!["create", "-n", "js", "--dry-run=client", "-o", "json"];
        twin.extend_from_slice(generator);
        std::fs::write(&path, sim.ok(&twin)?)?;
        let from_json: serde_json::Value =
            serde_json::from_str(&sim.ok(&["create", "-f", &file, "-o", "json"])?)?;
        let (read, expected) = (comparable(&from_protobuf), comparable(&from_json));
        ensure!(
            read == expected,
            "kubectl create {generator:?}: protobuf {read} != JSON {expected}"
        );
    }
    for cluster_wide in [
        &[
            "clusterrole",
            "node-reader",
            "--verb=get",
            "--resource=nodes",
        ][..],
        &[
            "clusterrolebinding",
            "node-readers",
            "--clusterrole=node-reader",
            "--user=bob",
        ],
        &["priorityclass", "high", "--value=1000"],
    ] {
        let mut created = vec!["create", "-o", "jsonpath={.kind}"];
        created.extend_from_slice(cluster_wide);
        ensure!(
            !sim.ok(&created)?.is_empty(),
            "kubectl create {cluster_wide:?}"
        );
    }
    let value = sim.jsonpath(&["priorityclass", "high"], "{.value}")?;
    ensure!(value == "1000", "{value}");
    let token = sim.ok(&["create", "token", "robot", "-n", "pb"])?;
    ensure!(
        token.trim().split('.').count() == 3,
        "a TokenRequest: {token}"
    );
    // Deletions without the Eviction API send their DeleteOptions in protobuf.
    sim.ok(&[
        "drain",
        "node-0",
        "--disable-eviction",
        "--ignore-daemonsets",
        "--timeout=60s",
    ])?;
    let left = sim.ok(&[
        "get",
        "pods",
        "-A",
        "--field-selector=spec.nodeName=node-0",
        "-o",
        "name",
    ])?;
    ensure!(
        left.is_empty(),
        "drained without evictions, yet left: {left}"
    );
    Ok(())
}

/// What a create stored, without what differs by namespace, time or chance: metadata but labels
/// and annotations, the object's uid where it is named, status, a Service's address, and the
/// zero values (`0`, `false`) a protobuf body carries for Go's
/// non-pointer fields.
fn comparable(object: &serde_json::Value) -> serde_json::Value {
    fn without_zeros(value: &serde_json::Value) -> serde_json::Value {
        match value {
            serde_json::Value::Object(map) => map
                .iter()
                .filter(|(_, v)| **v != serde_json::json!(0) && **v != serde_json::json!(false))
                .map(|(k, v)| (k.clone(), without_zeros(v)))
                .collect(),
            serde_json::Value::Array(items) => items.iter().map(without_zeros).collect(),
            other => other.clone(),
        }
    }
    // A Job's selector and labels name the Job's own uid.
    let uid = object["metadata"]["uid"].as_str().unwrap_or("no uid");
    let text = object.to_string().replace(uid, "<uid>");
    let mut object: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    let metadata = serde_json::json!({
        "labels": object["metadata"]["labels"],
        "annotations": object["metadata"]["annotations"],
    });
    object["metadata"] = metadata;
    if let Some(map) = object.as_object_mut() {
        map.remove("status");
    }
    // A Service's address is allocated at random.
    if let Some(spec) = object["spec"].as_object_mut() {
        spec.remove("clusterIP");
        spec.remove("clusterIPs");
    }
    without_zeros(&object)
}
