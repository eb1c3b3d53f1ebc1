//! Conformance with the real kubectl: the simulator binary driven the way people drive a
//! cluster. Skips (loudly) only where kubectl is missing.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};

use crate::common::kubectl_sim;
use kubectl_sim::{Sim, kubectl_missing};

const POD: &str = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\n  labels: {app: web}\nspec:\n  nodeName: node-0\n  containers:\n  - {name: c, image: nginx}\n";

#[test]
fn get_describe_apply_and_api_resources() -> Result<()> {
    if kubectl_missing() {
        return Ok(());
    }
    let sim = Sim::start(2)?;
    let nodes = sim.ok(&["get", "nodes"])?;
    ensure!(
        nodes.contains("node-0") && nodes.contains("Ready"),
        "{nodes}"
    );
    ensure!(sim.apply(POD)?.contains("pod/web created"));
    ensure!(sim.apply(POD)?.contains("pod/web unchanged"));
    sim.wait_for("web to run", "pods", Duration::from_secs(10), |sim| {
        Ok(sim.ok(&["get", "pod", "web"])?.contains("Running"))
    })?;
    let described = sim.ok(&["describe", "pod", "web"])?;
    // kubectl aligns the values by the longest field name and shows `node/hostIP`.
    let field = |name: &str, value: &str| {
        described.lines().any(|line| {
            line.starts_with(name)
                && line
                    .split_whitespace()
                    .nth(1)
                    .is_some_and(|v| v.starts_with(value))
        })
    };
    ensure!(
        field("Node:", "node-0/") && field("Status:", "Running"),
        "{described}"
    );
    let resources = sim.ok(&["api-resources"])?;
    for resource in [
        "pods",
        "leases",
        "poddisruptionbudgets",
        "volumeattachments",
        "customresourcedefinitions",
    ] {
        ensure!(
            resources.contains(resource),
            "{resource} missing from {resources}"
        );
    }
    let json = sim.ok(&["get", "pod", "web", "-o", "jsonpath={.spec.nodeName}"])?;
    ensure!(json == "node-0", "{json}");
    Ok(())
}

#[test]
fn patch_label_annotate_taint_cordon_and_delete() -> Result<()> {
    if kubectl_missing() {
        return Ok(());
    }
    let sim = Sim::start(2)?;
    sim.apply(POD)?;
    sim.ok(&["label", "pod", "web", "tier=front"])?;
    sim.ok(&["annotate", "pod", "web", "owner=team-a"])?;
    sim.ok(&[
        "patch",
        "pod",
        "web",
        "--type=merge",
        "-p",
        r#"{"metadata":{"labels":{"merge":"1"}}}"#,
    ])?;
    sim.ok(&[
        "patch",
        "pod",
        "web",
        "--type=json",
        "-p",
        r#"[{"op":"add","path":"/metadata/labels/json","value":"1"}]"#,
    ])?;
    sim.ok(&[
        "patch",
        "pod",
        "web",
        "-p",
        r#"{"metadata":{"labels":{"strategic":"1"}}}"#,
    ])?;
    let labels = sim.ok(&["get", "pod", "web", "-o", "jsonpath={.metadata.labels}"])?;
    for label in ["tier", "merge", "json", "strategic"] {
        ensure!(labels.contains(label), "{label} missing: {labels}");
    }
    ensure!(
        sim.ok(&[
            "get",
            "pod",
            "web",
            "-o",
            "jsonpath={.metadata.annotations.owner}"
        ])? == "team-a"
    );
    ensure!(
        sim.ok(&["get", "pods", "-l", "tier=front", "-o", "name"])?
            .contains("pod/web")
    );
    ensure!(
        sim.ok(&["get", "pods", "-l", "tier!=front", "-o", "name"])?
            .trim()
            .is_empty()
    );
    ensure!(
        sim.ok(&[
            "get",
            "pods",
            "--field-selector",
            "spec.nodeName=node-0",
            "-o",
            "name"
        ])?
        .contains("pod/web")
    );

    sim.ok(&["taint", "node", "node-1", "dedicated=db:NoSchedule"])?;
    ensure!(
        sim.ok(&[
            "get",
            "node",
            "node-1",
            "-o",
            "jsonpath={.spec.taints[0].key}"
        ])? == "dedicated"
    );
    sim.ok(&["taint", "node", "node-1", "dedicated=db:NoSchedule-"])?;
    ensure!(
        sim.ok(&["get", "node", "node-1", "-o", "jsonpath={.spec.taints}"])?
            .trim()
            .is_empty()
    );
    sim.ok(&["cordon", "node-1"])?;
    ensure!(sim.ok(&["get", "nodes"])?.contains("SchedulingDisabled"));
    sim.ok(&["uncordon", "node-1"])?;
    ensure!(!sim.ok(&["get", "nodes"])?.contains("SchedulingDisabled"));

    let missing = sim.kubectl(&["get", "pod", "nope"])?;
    ensure!(
        !missing.status.success()
            && String::from_utf8_lossy(&missing.stderr).contains("pods \"nope\" not found")
    );
    sim.ok(&["delete", "pod", "web", "--wait=true", "--timeout=30s"])?;
    ensure!(sim.ok(&["get", "pods", "-o", "name"])?.trim().is_empty());
    Ok(())
}

#[test]
fn get_watch_streams_changes() -> Result<()> {
    use std::io::{BufRead, BufReader};
    if kubectl_missing() {
        return Ok(());
    }
    let sim = Sim::start(1)?;
    sim.apply(&POD.replace("name: web", "name: first"))?;
    let mut watcher = Command::new("kubectl")
        .args(["get", "pods", "-w", "--request-timeout=10s"])
        .env("KUBECONFIG", sim.kubeconfig())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let mut lines = BufReader::new(watcher.stdout.take().context("no stdout")?).lines();
    // The listing comes first; once it shows, the watch resumes from the listed version, so
    // nothing done afterwards can be missed.
    loop {
        let line = lines.next().context("the watch ended before listing")??;
        if line.contains("first") {
            break;
        }
    }
    sim.apply(POD)?;
    sim.ok(&["label", "pod", "web", "seen=yes"])?;
    let mut seen = 0;
    for line in lines {
        if line?.contains("web") {
            seen += 1;
            if seen == 2 {
                break;
            }
        }
    }
    let _ = watcher.kill();
    let _ = watcher.wait();
    ensure!(seen >= 2, "the watch saw {seen} changes of web");
    Ok(())
}

#[test]
fn drain_under_a_pdb_completes_without_violations() -> Result<()> {
    if kubectl_missing() {
        return Ok(());
    }
    let sim = Sim::start(3)?;
    sim.apply(
        "apiVersion: apps/v1\nkind: ReplicaSet\nmetadata: {name: web}\nspec:\n  replicas: 4\n  selector: {matchLabels: {app: web}}\n  template:\n    metadata:\n      labels: {app: web}\n      annotations: {sim.nodegrace.io/ready-after-seconds: \"0.3\", sim.nodegrace.io/stop-seconds: \"0.2\"}\n    spec:\n      containers: [{name: c, image: nginx}]\n---\napiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: {name: web}\nspec:\n  maxUnavailable: 1\n  selector: {matchLabels: {app: web}}\n",
    )?;
    sim.wait_for("4 ready pods", "pods", Duration::from_secs(20), |sim| {
        Ok(sim
            .ok(&[
                "get",
                "pods",
                "-l",
                "app=web",
                "-o",
                "jsonpath={.items[*].status.conditions[?(@.type==\"Ready\")].status}",
            ])?
            .matches("True")
            .count()
            == 4)
    })?;
    let busiest = sim.ok(&[
        "get",
        "pods",
        "-l",
        "app=web",
        "-o",
        "jsonpath={.items[*].spec.nodeName}",
    ])?;
    let node = busiest
        .split_whitespace()
        .next()
        .context("no pods placed")?
        .to_owned();
    let drained = sim.ok(&["drain", &node, "--ignore-daemonsets", "--timeout=120s"])?;
    ensure!(drained.contains("drained"), "{drained}");
    let placements = sim.ok(&[
        "get",
        "pods",
        "-l",
        "app=web",
        "-o",
        "jsonpath={.items[*].spec.nodeName}",
    ])?;
    ensure!(
        !placements.split_whitespace().any(|n| n == node),
        "pods still on {node}: {placements}"
    );
    sim.wait_for("4 replacements", "pods", Duration::from_secs(20), |sim| {
        Ok(sim
            .ok(&[
                "get",
                "pods",
                "-l",
                "app=web",
                "--field-selector",
                "status.phase=Running",
                "-o",
                "name",
            ])?
            .lines()
            .count()
            == 4)
    })?;
    let violations = http_get(&format!("{}/sim/v1/audit/violations", sim.url))?;
    ensure!(violations.trim() == "[]", "PDB violations: {violations}");
    Ok(())
}

/// `kubectl get events` lists Events recorded through events.k8s.io/v1 (one storage on a real
/// server), with the printer's columns.
#[test]
fn kubectl_get_events_shows_events_recorded_through_events_v1() -> Result<()> {
    if kubectl_missing() {
        return Ok(());
    }
    let sim = Sim::start(2)?;
    sim.apply(
        "apiVersion: events.k8s.io/v1\nkind: Event\nmetadata: {name: node-1.a, namespace: default}\n\
         regarding: {kind: Node, name: node-1}\nnote: terminating pods\nreason: NodeShutdown\n\
         type: Normal\naction: Terminate\nreportingController: nodegrace-x\nreportingInstance: node-1\n\
         eventTime: \"2026-01-01T00:00:00.000000Z\"\n",
    )?;
    let listed = sim.ok(&[
        "get",
        "events",
        "--field-selector",
        "involvedObject.name=node-1",
    ])?;
    let header = listed.lines().next().unwrap_or_default();
    for column in ["LAST SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"] {
        ensure!(header.contains(column), "{listed}");
    }
    ensure!(
        listed.contains("NodeShutdown")
            && listed.contains("node/node-1")
            && listed.contains("terminating pods"),
        "{listed}"
    );
    let through_view = sim.ok(&[
        "get",
        "events.events.k8s.io",
        "-o",
        "jsonpath={.items[0].note}",
    ])?;
    ensure!(through_view == "terminating pods", "{through_view}");
    Ok(())
}

/// A GET through curl-less plain TCP, for the /sim/v1 endpoints.
fn http_get(url: &str) -> Result<String> {
    use std::io::{Read, Write};
    let rest = url.strip_prefix("http://").context("plain http expected")?;
    let (host, path) = rest
        .split_once('/')
        .map_or((rest, "/".to_owned()), |(h, p)| (h, format!("/{p}")));
    let mut stream = std::net::TcpStream::connect(host)?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    Ok(response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default())
}

// Conformance: eviction and disruption (pkg/registry/core/pod/storage/eviction.go).

/// An unready pod whose budget desires no healthy pods and allows no disruption is refused:
/// IfHealthyBudget lets an unready pod go only while desiredHealthy > 0.
#[test]
fn conformance_eviction_refuses_an_unready_pod_of_an_empty_budget() -> Result<()> {
    if kubectl_missing() {
        return Ok(());
    }
    let sim = Sim::start(1)?;
    sim.apply(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: stuck, labels: {app: stuck}}\n\
         spec:\n  containers: [{name: c, image: i}]\n  nodeSelector: {none: none}\n",
    )?;
    sim.ok(&[
        "patch",
        "pod",
        "stuck",
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"phase":"Running","conditions":[{"type":"Ready","status":"False"}]}}"#,
    ])?;
    sim.apply(
        "apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: {name: stuck}\n\
         spec: {maxUnavailable: 0, selector: {matchLabels: {app: stuck}}}\n",
    )?;
    sim.wait_for(
        "the budget's status",
        "poddisruptionbudgets",
        Duration::from_secs(10),
        |sim| {
            Ok(sim.ok(&[
                "get",
                "pdb",
                "stuck",
                "-o",
                "jsonpath={.status.observedGeneration}",
            ])? == "1")
        },
    )?;
    let eviction = sim.dir.path().join("eviction.json");
    std::fs::write(
        &eviction,
        r#"{"apiVersion":"policy/v1","kind":"Eviction","metadata":{"name":"stuck","namespace":"default"}}"#,
    )?;
    let output = sim.kubectl(&[
        "create",
        "--raw",
        "/api/v1/namespaces/default/pods/stuck/eviction",
        "-f",
        eviction.to_str().unwrap_or_default(),
    ])?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    ensure!(
        !output.status.success() && stderr.contains("violate the pod's disruption budget"),
        "{stderr}"
    );
    Ok(())
}

// Conformance: pods, nodes, volumes.

/// A created pod starts Pending whatever status it was written with; DefaultTolerationSeconds
/// gives it 300 s on not-ready/unreachable nodes; its kubelet records the usual events.
#[test]
fn conformance_pods_are_admitted_and_described_as_on_a_real_cluster() -> Result<()> {
    if kubectl_missing() {
        return Ok(());
    }
    let sim = Sim::start(1)?;
    sim.apply(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: forged}\n\
         spec:\n  containers: [{name: c, image: nginx}]\n  nodeSelector: {none: none}\n\
         status: {phase: Succeeded}\n",
    )?;
    let phase = sim.ok(&["get", "pod", "forged", "-o", "jsonpath={.status.phase}"])?;
    ensure!(phase == "Pending", "{phase}");
    sim.apply(POD)?;
    sim.wait_for("web's events", "events", Duration::from_secs(10), |sim| {
        Ok(sim.ok(&["describe", "pod", "web"])?.contains("Started"))
    })?;
    let described = sim.ok(&["describe", "pod", "web"])?;
    for expected in [
        "node.kubernetes.io/not-ready:NoExecute op=Exists for 300s",
        "node.kubernetes.io/unreachable:NoExecute op=Exists for 300s",
        "Pulled",
        "Created",
        "Started",
        "/var/run/secrets/kubernetes.io/serviceaccount from kube-api-access-",
        "ConfigMapName:           kube-root-ca.crt",
    ] {
        ensure!(
            described.contains(expected),
            "{expected} not in {described}"
        );
    }
    ensure!(
        described
            .lines()
            .any(|line| line.starts_with("QoS Class:") && line.ends_with(" BestEffort")),
        "no BestEffort QoS class in {described}"
    );
    let labels = sim.ok(&[
        "get",
        "namespace",
        "kube-system",
        "-o",
        "jsonpath={.metadata.labels}",
    ])?;
    ensure!(
        labels.contains(r#""kubernetes.io/metadata.name":"kube-system""#),
        "{labels}"
    );
    Ok(())
}

/// A VolumeAttachment's status starts empty whatever was written, and its spec is immutable.
#[test]
fn conformance_volume_attachments_keep_their_spec() -> Result<()> {
    if kubectl_missing() {
        return Ok(());
    }
    let sim = Sim::start(1)?;
    let attachment = "apiVersion: storage.k8s.io/v1\nkind: VolumeAttachment\nmetadata: {name: va}\n\
         spec: {attacher: other.csi, nodeName: node-0, source: {persistentVolumeName: pv-x}}\n\
         status: {attached: true}\n";
    sim.apply(attachment)?;
    let attached = sim.ok(&[
        "get",
        "volumeattachment",
        "va",
        "-o",
        "jsonpath={.status.attached}",
    ])?;
    ensure!(attached == "false", "{attached}");
    let output = sim.kubectl(&[
        "patch",
        "volumeattachment",
        "va",
        "--type=merge",
        "-p",
        r#"{"spec":{"nodeName":"node-9"}}"#,
    ])?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    ensure!(
        !output.status.success()
            && stderr.contains("spec: Invalid value")
            && stderr.contains("field is immutable"),
        "{stderr}"
    );
    Ok(())
}

// Conformance: writes (registry/generic/registry/store.go, apimachinery meta/v1 time types).

/// Leases need a resourceVersion to be replaced, and may be created by PUT.
#[test]
fn conformance_leases_are_updated_conditionally_and_created_by_put() -> Result<()> {
    if kubectl_missing() {
        return Ok(());
    }
    let sim = Sim::start(0)?;
    let lease = sim.dir.path().join("lease.yaml");
    std::fs::write(
        &lease,
        r#"{"apiVersion":"coordination.k8s.io/v1","kind":"Lease","metadata":{"name":"l","namespace":"default"},"spec":{"holderIdentity":"me"}}"#,
    )?;
    let path = lease.to_str().unwrap_or_default();
    // Raw PUTs: `kubectl replace -f` fetches the live version first.
    let url = "/apis/coordination.k8s.io/v1/namespaces/default/leases/l";
    sim.ok(&["replace", "--raw", url, "-f", path])?;
    let holder = sim.ok(&["get", "lease", "l", "-o", "jsonpath={.spec.holderIdentity}"])?;
    ensure!(holder == "me", "{holder}");
    let output = sim.kubectl(&["replace", "--raw", url, "-f", path])?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    ensure!(
        !output.status.success()
            && stderr.contains(
                "metadata.resourceVersion: Invalid value: 0x0: must be specified for an update"
            ),
        "{stderr}"
    );
    Ok(())
}

/// metav1.Time is stored in whole seconds; metav1.MicroTime needs six fractional digits.
#[test]
fn conformance_times_are_stored_as_the_go_types_serialise() -> Result<()> {
    if kubectl_missing() {
        return Ok(());
    }
    let sim = Sim::start(1)?;
    sim.apply(POD)?;
    sim.ok(&[
        "patch", "pod", "web", "--subresource=status", "--type=strategic", "-p",
        r#"{"status":{"conditions":[{"type":"nodegrace.io/Checked","status":"True","lastTransitionTime":"2026-01-01T00:00:00.987654Z"}]}}"#,
    ])?;
    let time = sim.ok(&[
        "get",
        "pod",
        "web",
        "-o",
        r#"jsonpath={.status.conditions[?(@.type=="nodegrace.io/Checked")].lastTransitionTime}"#,
    ])?;
    ensure!(time == "2026-01-01T00:00:00Z", "{time}");
    let lease = sim.dir.path().join("lease.yaml");
    std::fs::write(
        &lease,
        "apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata: {name: l, namespace: default}\n\
         spec: {holderIdentity: me, renewTime: \"2026-01-01T00:00:00.123Z\"}\n",
    )?;
    let output = sim.kubectl(&["create", "-f", lease.to_str().unwrap_or_default()])?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    ensure!(
        !output.status.success() && stderr.contains("cannot be handled as a Lease"),
        "{stderr}"
    );
    Ok(())
}

// Conformance: workloads (pkg/controller/deployment, pkg/controller/statefulset,
// pkg/registry/*/scale, pkg/apis/*/v1/defaults.go).

const WORKLOADS: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec: {containers: [{name: c, image: nginx}]}
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: db}
spec:
  replicas: 2
  serviceName: db
  selector: {matchLabels: {app: db}}
  template:
    metadata: {labels: {app: db}}
    spec: {containers: [{name: c, image: postgres}]}
  volumeClaimTemplates:
  - metadata: {name: data}
    spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Gi}}}
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: agent}
spec:
  selector: {matchLabels: {app: agent}}
  template:
    metadata: {labels: {app: agent}}
    spec: {containers: [{name: c, image: agent}]}
---
apiVersion: v1
kind: Service
metadata: {name: db}
spec: {selector: {app: db}, ports: [{port: 5432}]}
---
apiVersion: v1
kind: Secret
metadata: {name: creds}
stringData: {password: hunter2}
---
apiVersion: batch/v1
kind: Job
metadata: {name: once}
spec:
  template:
    spec: {restartPolicy: Never, containers: [{name: c, image: busybox}]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: node-reader}
rules: [{apiGroups: [""], resources: [nodes], verbs: [get, list, watch]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: node-reader}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: node-reader}
subjects: [{kind: ServiceAccount, name: default, namespace: default}]
"#;

/// Deployments, StatefulSets and DaemonSets roll out as `kubectl rollout status` reads them,
/// scale through `/scale`, and the other kinds a chart holds are stored with their defaults.
#[test]
fn conformance_workloads_roll_out_and_scale() -> Result<()> {
    if kubectl_missing() {
        return Ok(());
    }
    let sim = Sim::start(2)?;
    sim.apply(WORKLOADS)?;
    for workload in ["deployment/web", "statefulset/db", "daemonset/agent"] {
        sim.ok(&["rollout", "status", workload, "--timeout=60s"])?;
    }
    let pods = sim.jsonpath(&["pods", "-l", "app=db"], "{.items[*].metadata.name}")?;
    ensure!(pods == "db-0 db-1", "{pods}");
    let claims = sim.jsonpath(
        &["pvc", "data-db-0", "data-db-1"],
        "{.items[*].status.phase}",
    )?;
    ensure!(claims == "Bound Bound", "{claims}");
    let volume = sim.jsonpath(
        &["pod", "db-0"],
        "{.spec.volumes[0].persistentVolumeClaim.claimName}",
    )?;
    ensure!(volume == "data-db-0", "{volume}");
    sim.ok(&["scale", "deployment", "web", "--replicas=3"])?;
    sim.ok(&["rollout", "status", "deployment/web", "--timeout=60s"])?;
    let ready = sim.jsonpath(&["deployment", "web"], "{.status.readyReplicas}")?;
    ensure!(ready == "3", "{ready}");
    let replica_sets = sim.jsonpath(&["rs", "-l", "app=web"], "{.items[*].spec.replicas}")?;
    ensure!(replica_sets == "3", "{replica_sets}");
    sim.ok(&["scale", "statefulset", "db", "--replicas=3"])?;
    sim.ok(&["rollout", "status", "statefulset/db", "--timeout=60s"])?;
    let strategy = sim.jsonpath(&["daemonset", "agent"], "{.spec.updateStrategy.type}")?;
    ensure!(strategy == "RollingUpdate", "{strategy}");
    let address = sim.jsonpath(
        &["service", "db"],
        "{.spec.clusterIP} {.spec.ports[0].targetPort}",
    )?;
    ensure!(
        address.starts_with("10.96.") && address.ends_with(" 5432"),
        "{address}"
    );
    let secret = sim.jsonpath(&["secret", "creds"], "{.type} {.data.password}")?;
    ensure!(secret == "Opaque aHVudGVyMg==", "{secret}");
    let selector = sim.jsonpath(&["job", "once"], "{.spec.selector.matchLabels}")?;
    ensure!(
        selector.contains("batch.kubernetes.io/controller-uid"),
        "{selector}"
    );
    let kinds = sim.ok(&[
        "get",
        "clusterrole,clusterrolebinding,apiservices",
        "-o",
        "name",
    ])?;
    for expected in [
        "clusterrole.rbac.authorization.k8s.io/cluster-admin",
        "clusterrolebinding.rbac.authorization.k8s.io/node-reader",
        "apiservice.apiregistration.k8s.io/v1.apps",
    ] {
        ensure!(kinds.contains(expected), "{expected} missing from {kinds}");
    }
    let output = sim.kubectl(&["create", "-f", "-"])?;
    ensure!(!output.status.success(), "an empty create must fail");
    Ok(())
}

/// A StatefulSet pod stuck Terminating on a node whose kubelet is gone blocks its ordinal: the
/// replacement comes only once the old pod object is gone (the case KEP-2268 exists for).
#[test]
fn conformance_statefulset_replaces_a_pod_only_after_it_is_gone() -> Result<()> {
    if kubectl_missing() {
        return Ok(());
    }
    let sim = Sim::start(1)?;
    sim.apply(WORKLOADS)?;
    sim.ok(&["rollout", "status", "statefulset/db", "--timeout=60s"])?;
    let old = sim.jsonpath(&["pod", "db-0"], "{.metadata.uid}")?;
    sim.stop_kubelet("node-0")?;
    sim.ok(&["delete", "pod", "db-0", "--wait=false"])?;
    // Scaling up makes the controller look at the set again; db-2 must wait behind db-0.
    sim.ok(&["scale", "statefulset", "db", "--replicas=3"])?;
    sim.wait_for(
        "the scale to be observed",
        "statefulsets",
        Duration::from_secs(30),
        |sim| Ok(sim.jsonpath(&["sts", "db"], "{.status.observedGeneration}")? == "2"),
    )?;
    let still = sim.jsonpath(
        &["pod", "db-0"],
        "{.metadata.uid} {.metadata.deletionTimestamp}",
    )?;
    ensure!(
        still.starts_with(&old) && still.len() > old.len() + 1,
        "{still}"
    );
    let pods = sim.ok(&["get", "pods", "-l", "app=db", "-o", "name"])?;
    ensure!(!pods.contains("db-2"), "{pods}");
    sim.ok(&["delete", "pod", "db-0", "--force", "--grace-period=0"])?;
    sim.ok(&["annotate", "node", "node-0", "sim.nodegrace.io/kubelet-"])?;
    sim.wait_for("a new db-0", "pods", Duration::from_secs(30), |sim| {
        let uid = sim.jsonpath(
            &["pods", "-l", "app=db"],
            "{.items[?(@.metadata.name==\"db-0\")].metadata.uid}",
        )?;
        Ok(!uid.is_empty() && uid != old)
    })?;
    let claim = sim.jsonpath(
        &["pod", "db-0"],
        "{.spec.volumes[0].persistentVolumeClaim.claimName}",
    )?;
    ensure!(
        claim == "data-db-0",
        "the replacement keeps its claim: {claim}"
    );
    Ok(())
}

/// Containers of mapped images run as processes: `kubectl logs` shows their output, the pod
/// ends Succeeded, and a container that exits under restartPolicy Always backs off.
#[test]
fn conformance_logs_of_containers_run_as_processes() -> Result<()> {
    if kubectl_missing() {
        return Ok(());
    }
    let sim = Sim::start_with(1, &["--run-image", "busybox:*=/bin"])?;
    sim.apply(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: counter}\nspec:\n  restartPolicy: Never\n  \
         containers: [{name: c, image: 'busybox:stable', command: [sh, -c, 'for i in 1 2 3; do echo line $i; done']}]\n\
         ---\napiVersion: v1\nkind: Pod\nmetadata: {name: crasher}\nspec:\n  \
         containers: [{name: c, image: 'busybox:stable', command: [sh, -c, 'echo bye; exit 3']}]\n",
    )?;
    sim.wait_for(
        "counter to succeed",
        "pods",
        Duration::from_secs(30),
        |sim| Ok(sim.jsonpath(&["pod", "counter"], "{.status.phase}")? == "Succeeded"),
    )?;
    let logs = sim.ok(&["logs", "counter"])?;
    ensure!(logs == "line 1\nline 2\nline 3\n", "{logs:?}");
    let tail = sim.ok(&["logs", "counter", "--tail=1"])?;
    ensure!(tail == "line 3\n", "{tail:?}");
    sim.wait_for("crasher to back off", "pods", Duration::from_secs(30), |sim| {
        let state = sim.jsonpath(&["pod", "crasher"], "{.status.containerStatuses[0].state.waiting.reason} {.status.containerStatuses[0].lastState.terminated.exitCode}")?;
        Ok(state == "CrashLoopBackOff 3")
    })?;
    let output = sim.kubectl(&["logs", "counter", "-c", "nope"])?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    ensure!(
        stderr.contains("container nope is not valid for pod counter"),
        "{stderr}"
    );
    Ok(())
}

#[test]
fn serve_flags_set_the_lease_renewal_and_the_node_monitor_grace() -> Result<()> {
    if kubectl_missing() {
        return Ok(());
    }
    let sim = Sim::with_quick_leases()?;
    let renewed = || {
        sim.jsonpath(
            &["lease", "-n", "kube-node-lease", "node-0"],
            "{.spec.renewTime}",
        )
    };
    let first = renewed()?;
    // Both deadlines are far shorter than the real defaults (10 s renewal, 40 s grace).
    sim.wait_for("a second renewal", "leases", Duration::from_secs(5), |_| {
        Ok(renewed()? != first)
    })?;
    sim.stop_kubelet("node-0")?;
    sim.wait_node_unknown("node-0", Duration::from_secs(20))
}

/// The taint manager counts `tolerationSeconds` from when it first saw the pod under the taint
/// (kubectl writes no `timeAdded`): the pod goes once, not never.
#[test]
fn a_toleration_of_a_kubectl_taint_runs_out() -> Result<()> {
    if kubectl_missing() {
        return Ok(());
    }
    let sim = Sim::start(1)?;
    sim.apply(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: patient}\nspec:\n  nodeName: node-0\n  \
         containers: [{name: c, image: nginx}]\n  tolerations:\n  - {key: example.com/maintenance, \
         operator: Exists, effect: NoExecute, tolerationSeconds: 3}\n",
    )?;
    sim.wait_for("patient to run", "pods", Duration::from_secs(10), |sim| {
        Ok(sim.ok(&["get", "pod", "patient"])?.contains("Running"))
    })?;
    let tainted = Instant::now();
    sim.ok(&[
        "taint",
        "nodes",
        "node-0",
        "example.com/maintenance=now:NoExecute",
    ])?;
    let added = sim.jsonpath(&["node", "node-0"], "{.spec.taints[0].timeAdded}")?;
    ensure!(added.is_empty(), "kubectl wrote timeAdded {added}");
    let evicted = || -> Result<bool> {
        let output = sim.kubectl(&[
            "get",
            "pod",
            "patient",
            "-o",
            "jsonpath={.metadata.deletionTimestamp}",
        ])?;
        Ok(!output.status.success() || !output.stdout.is_empty())
    };
    sim.wait_for(
        "patient to be evicted",
        "pods",
        Duration::from_secs(30),
        |_| evicted(),
    )?;
    let after = tainted.elapsed();
    eprintln!("evicted {after:?} after the taint (tolerationSeconds 3)");
    // Not before its toleration ran out, wherever the machine is slow.
    ensure!(after >= Duration::from_secs(3), "evicted after {after:?}");
    Ok(())
}

/// A node the controller turns Unknown has its pods' Ready conditions turned False, with a
/// `NodeNotReady` Warning on each (upstream's MarkPodsNotReady).
#[test]
fn pods_on_a_node_that_went_unknown_turn_unready() -> Result<()> {
    if kubectl_missing() {
        return Ok(());
    }
    let sim = Sim::with_quick_leases()?;
    sim.apply(POD)?;
    let ready = |sim: &Sim| {
        sim.jsonpath(
            &["pod", "web"],
            r#"{.status.conditions[?(@.type=="Ready")].status}"#,
        )
    };
    sim.wait_for("web to be Ready", "pods", Duration::from_secs(10), |sim| {
        Ok(ready(sim)? == "True")
    })?;
    sim.stop_kubelet("node-0")?;
    sim.wait_for(
        "web to turn unready",
        "pods",
        Duration::from_secs(20),
        |sim| Ok(ready(sim)? == "False"),
    )?;
    let node = sim.node_ready("node-0")?;
    ensure!(node == "Unknown", "node Ready {node}");
    // Only the Ready condition changes; the pod still runs as far as the API knows.
    let phase = sim.jsonpath(&["pod", "web"], "{.status.phase}")?;
    ensure!(phase == "Running", "{phase}");
    sim.wait_for(
        "the NodeNotReady event",
        "events",
        Duration::from_secs(10),
        |sim| {
            Ok(sim
                .ok(&[
                    "get",
                    "events",
                    "--field-selector",
                    "reason=NodeNotReady",
                    "-o",
                    "name",
                ])?
                .lines()
                .count()
                == 1)
        },
    )
}

const READER: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: apps}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: reader, namespace: apps}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: pod-reader, namespace: apps}
rules: [{apiGroups: [""], resources: [pods], verbs: [get, list]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: reader, namespace: apps}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: pod-reader}
subjects: [{kind: ServiceAccount, name: reader}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: node-0-reader}
rules: [{apiGroups: [""], resources: [nodes], verbs: [get], resourceNames: [node-0]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: reader-node-0}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: node-0-reader}
subjects: [{kind: ServiceAccount, name: reader, namespace: apps}]
"#;

/// ServiceAccount tokens authenticate, RBAC decides, and kubectl sees the real answers:
/// `auth can-i` (impersonating), `auth whoami`, the 403 message, 401 for a forged token.
#[test]
fn conformance_rbac_is_enforced_for_service_account_tokens() -> Result<()> {
    if kubectl_missing() {
        return Ok(());
    }
    // kubectl sends tokens over TLS only.
    let sim = Sim::start_with(2, &["--tls"])?;
    sim.apply(READER)?;
    let can_i = |args: &[&str]| -> Result<String> {
        let mut all = vec!["auth", "can-i"];
        all.extend_from_slice(args);
        all.push("--as=system:serviceaccount:apps:reader");
        let output = sim.kubectl(&all)?;
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
    };
    ensure!(can_i(&["list", "pods", "-n", "apps"])? == "yes");
    ensure!(can_i(&["list", "pods", "-n", "default"])? == "no");
    ensure!(can_i(&["get", "node/node-0"])? == "yes");
    ensure!(can_i(&["get", "node/node-1"])? == "no");
    ensure!(can_i(&["patch", "node/node-0"])? == "no");

    let token_flag = sim.token_flag("apps", "reader", None)?;
    sim.ok(&["get", "pods", "-n", "apps", &token_flag])?;
    sim.ok(&["get", "node", "node-0", &token_flag])?;
    let whoami = sim.ok(&[
        "auth",
        "whoami",
        &token_flag,
        "-o",
        "jsonpath={.status.userInfo.username}",
    ])?;
    ensure!(whoami == "system:serviceaccount:apps:reader", "{whoami}");
    let refused = sim.kubectl(&["get", "nodes", &token_flag])?;
    let stderr = String::from_utf8_lossy(&refused.stderr);
    ensure!(
        !refused.status.success()
            && stderr.contains(r#"Error from server (Forbidden): nodes is forbidden: User "system:serviceaccount:apps:reader" cannot list resource "nodes" in API group "" at the cluster scope"#),
        "{stderr}"
    );
    let forged = sim.kubectl(&["get", "pods", "-n", "apps", "--token=forged.token.here"])?;
    let stderr = String::from_utf8_lossy(&forged.stderr);
    ensure!(
        !forged.status.success() && stderr.contains("Unauthorized"),
        "{stderr}"
    );
    // The account gone, its tokens authenticate no one.
    sim.ok(&["delete", "serviceaccount", "reader", "-n", "apps"])?;
    let orphaned = sim.kubectl(&["get", "pods", "-n", "apps", &token_flag])?;
    ensure!(
        !orphaned.status.success(),
        "a deleted account's token still works"
    );
    Ok(())
}

const IN_CLUSTER: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: apps}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: lister, namespace: apps}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: pod-lister, namespace: apps}
rules: [{apiGroups: [""], resources: [pods], verbs: [list]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: lister, namespace: apps}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: pod-lister}
subjects: [{kind: ServiceAccount, name: lister}]
---
apiVersion: v1
kind: ConfigMap
metadata: {name: settings, namespace: apps}
data: {greeting: hello, settings.yaml: "level: 3\n"}
---
apiVersion: v1
kind: Secret
metadata: {name: creds, namespace: apps}
stringData: {password: hunter2}
---
apiVersion: v1
kind: Pod
metadata: {name: lister, namespace: apps, labels: {app: lister}}
spec:
  serviceAccountName: lister
  restartPolicy: Never
  nodeName: node-0
  containers:
  - name: c
    image: tools:1
    command: [sh, -c]
    args:
    - |
      echo "node=$(NODE) greeting=$GREETING password=$PASSWORD ip=$POD_IP"
      cat /etc/app/settings.yaml
      echo "namespace=$(cat /var/run/secrets/kubernetes.io/serviceaccount/namespace)"
      kubectl get pods -o name
      kubectl get nodes 2>&1 | tail -1
    env:
    - {name: NODE, valueFrom: {fieldRef: {fieldPath: spec.nodeName}}}
    - {name: POD_IP, valueFrom: {fieldRef: {fieldPath: status.podIP}}}
    - {name: GREETING, valueFrom: {configMapKeyRef: {name: settings, key: greeting}}}
    - {name: PASSWORD, valueFrom: {secretKeyRef: {name: creds, key: password}}}
    volumeMounts:
    - {name: settings, mountPath: /etc/app, readOnly: true}
  volumes:
  - {name: settings, configMap: {name: settings}}
"#;

/// A container run as a process is in the cluster as a real one is: its environment from the
/// downward API, ConfigMaps and Secrets, its volumes mounted at their paths, and kubectl in it
/// finds the API server, authenticates with the pod's token and meets its RBAC.
#[test]
fn conformance_processes_run_in_the_cluster_with_their_service_account() -> Result<()> {
    if kubectl_missing() {
        return Ok(());
    }
    let kubectl = Command::new("sh")
        .args(["-c", "command -v kubectl"])
        .output()?;
    let kubectl = String::from_utf8_lossy(&kubectl.stdout).trim().to_owned();
    let bin = std::path::Path::new(&kubectl)
        .parent()
        .context("kubectl has no directory")?;
    let rule = format!("tools:*={}", bin.display());
    let sim = Sim::start_with(1, &["--tls", "--run-image", &rule])?;
    sim.apply(IN_CLUSTER)?;
    sim.wait_for(
        "the pod to finish",
        "pods",
        Duration::from_secs(60),
        |sim| {
            let phase = sim.jsonpath(&["pod", "lister", "-n", "apps"], "{.status.phase}")?;
            Ok(phase == "Succeeded" || phase == "Failed")
        },
    )?;
    let logs = sim.ok(&["logs", "lister", "-n", "apps"])?;
    let ip = sim.jsonpath(&["pod", "lister", "-n", "apps"], "{.status.podIP}")?;
    ensure!(ip.starts_with("127."), "{ip}");
    for expected in [
        format!("node=node-0 greeting=hello password=hunter2 ip={ip}"),
        "level: 3".to_owned(),
        "namespace=apps".to_owned(),
        "pod/lister".to_owned(),
        r#"User "system:serviceaccount:apps:lister" cannot list resource "nodes""#.to_owned(),
    ] {
        ensure!(
            logs.contains(&expected),
            "{expected:?} missing from the logs:\n{logs}"
        );
    }
    // The mounts were the container's own: the host has no /etc/app.
    ensure!(!std::path::Path::new("/etc/app").exists());
    Ok(())
}

const OWN_NODE_POLICY: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: agents}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: agent, namespace: agents}
---
apiVersion: v1
kind: Pod
metadata: {name: agent-0, namespace: agents}
spec:
  serviceAccountName: agent
  nodeName: node-0
  containers: [{name: c, image: agent}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: node-labeller}
rules: [{apiGroups: [""], resources: [nodes], verbs: [get, patch]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: agent-node-labeller}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: node-labeller}
subjects: [{kind: ServiceAccount, name: agent, namespace: agents}]
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: agent-own-node}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
    - {apiGroups: [""], apiVersions: [v1], operations: [UPDATE], resources: [nodes, nodes/status]}
  matchConditions:
  - {name: is-the-agent, expression: "request.userInfo.username == 'system:serviceaccount:agents:agent'"}
  validations:
  - expression: >-
      'authentication.kubernetes.io/node-name' in request.userInfo.extra &&
      request.userInfo.extra['authentication.kubernetes.io/node-name'][0] == object.metadata.name
    messageExpression: "'the agent may write only its own Node, not ' + object.metadata.name"
    reason: Forbidden
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: agent-own-node}
spec: {policyName: agent-own-node, validationActions: [Deny]}
"#;

/// A ValidatingAdmissionPolicy sees the node a pod-bound token carries: the agent on node-0
/// may label node-0 and no other node; the admin is not matched.
#[test]
fn conformance_admission_policies_judge_with_the_tokens_node() -> Result<()> {
    if kubectl_missing() {
        return Ok(());
    }
    let sim = Sim::start_with(2, &["--tls"])?;
    sim.apply(OWN_NODE_POLICY)?;
    let uid = sim.jsonpath(&["pod", "agent-0", "-n", "agents"], "{.metadata.uid}")?;
    let token = sim.token_flag("agents", "agent", Some(("agent-0", &uid)))?;
    let whoami = sim.ok(&["auth", "whoami", &token, "-o", "json"])?;
    ensure!(
        whoami.contains(r#""authentication.kubernetes.io/node-name": ["#)
            && whoami.contains("node-0"),
        "{whoami}"
    );
    sim.ok(&["label", "node", "node-0", "agent=was-here", &token])?;
    let refused = sim.kubectl(&["label", "node", "node-1", "agent=was-here", &token])?;
    let stderr = String::from_utf8_lossy(&refused.stderr);
    ensure!(
        !refused.status.success()
            && stderr.contains(r#"Error from server (Forbidden): nodes "node-1" is forbidden: ValidatingAdmissionPolicy 'agent-own-node' with binding 'agent-own-node' denied request: the agent may write only its own Node, not node-1"#),
        "{stderr}"
    );
    sim.ok(&["label", "node", "node-1", "admin=was-here"])?;
    // An expression that does not compile is refused with the policy.
    let broken = sim.dir.path().join("broken.yaml");
    std::fs::write(
        &broken,
        "apiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingAdmissionPolicy\nmetadata: {name: broken}\nspec:\n  matchConstraints: {resourceRules: [{apiGroups: [''], apiVersions: [v1], operations: [UPDATE], resources: [nodes]}]}\n  validations: [{expression: 'object.metadata.name =='}]\n",
    )?;
    let output = sim.kubectl(&["apply", "-f", broken.to_str().unwrap_or_default()])?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    ensure!(
        !output.status.success() && stderr.contains("compilation failed"),
        "{stderr}"
    );
    Ok(())
}

/// The helm the chart checks install under target/tools, if there.
fn helm() -> Option<PathBuf> {
    let helm = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/tools/helm");
    if helm.is_file() {
        return Some(helm);
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "helm is missing from target/tools (`cargo xtask charts` installs it)"
    );
    eprintln!("SKIPPED: helm is not under target/tools; `cargo xtask charts` installs it");
    None
}

/// graceful-shutdown-agent's token marks and deletes the pods of its own node only: another
/// node's pod is refused by the policy (status write and delete), one of its own node's goes.
fn pods_of_other_nodes_are_refused(sim: &Sim, selector: &str, token: &str) -> Result<()> {
    let pod_on = |node: &str| -> Result<String> {
        sim.jsonpath(
            &[
                "pods",
                "-n",
                "nodegrace",
                "-l",
                selector,
                "--field-selector",
                &format!("spec.nodeName={node}"),
            ],
            "{.items[0].metadata.name}",
        )
    };
    let theirs = pod_on("node-1")?;
    // `kubectl patch --subresource=status` reads the status first; the agent itself never
    // does, so its chart does not grant it: a test-only rule lets the patch reach the policy.
    sim.apply(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {name: read-pod-status}\nrules: [{apiGroups: [''], resources: [pods/status], verbs: [get]}]\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {name: read-pod-status}\nroleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: read-pod-status}\nsubjects: [{kind: ServiceAccount, name: graceful-shutdown-agent, namespace: nodegrace}]\n",
    )?;
    let refusal = format!(
        "graceful-shutdown-agent may write only the Node its pod runs on and that node's pods, not pod nodegrace/{theirs}"
    );
    let marked = sim.kubectl(&[
        "patch",
        "pod",
        &theirs,
        "-n",
        "nodegrace",
        "--subresource=status",
        "-p",
        r#"{"status":{"conditions":[{"type":"DisruptionTarget","status":"True","reason":"TerminationByKubelet"}]}}"#,
        token,
    ])?;
    let stderr = String::from_utf8_lossy(&marked.stderr);
    ensure!(
        !marked.status.success() && stderr.contains(&refusal),
        "{stderr}"
    );
    let deleted = sim.kubectl(&[
        "delete",
        "pod",
        &theirs,
        "-n",
        "nodegrace",
        "--wait=false",
        token,
    ])?;
    let stderr = String::from_utf8_lossy(&deleted.stderr);
    ensure!(
        !deleted.status.success() && stderr.contains(&refusal),
        "{stderr}"
    );
    // Another pod of its own node (not the one its token is bound to) goes.
    let neighbour = sim.jsonpath(
        &[
            "pods",
            "-n",
            "nodegrace",
            "-l",
            "app.kubernetes.io/name=shutdown-inhibitor-agent",
            "--field-selector",
            "spec.nodeName=node-0",
        ],
        "{.items[0].metadata.name}",
    )?;
    sim.ok(&[
        "delete",
        "pod",
        &neighbour,
        "-n",
        "nodegrace",
        "--wait=false",
        token,
    ])?;
    Ok(())
}

/// Each node agent's chart as rendered (RBAC and its own-node ValidatingAdmissionPolicy): the
/// agent's pod-bound token writes its own Node's status, is refused another Node's by the
/// policy, and anything its ClusterRole does not grant by RBAC.
#[test]
fn node_agent_charts_let_an_agent_write_only_its_own_node() -> Result<()> {
    if kubectl_missing() {
        return Ok(());
    }
    let Some(helm) = helm() else {
        return Ok(());
    };
    let sim = Sim::start_with(2, &["--tls"])?;
    sim.apply("apiVersion: v1\nkind: Namespace\nmetadata: {name: nodegrace}\n")?;
    let charts = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../charts");
    for chart in ["shutdown-inhibitor-agent", "graceful-shutdown-agent"] {
        let rendered = Command::new(&helm)
            .args(["template", chart])
            .arg(charts.join(chart))
            .args(["--namespace", "nodegrace"])
            .output()?;
        ensure!(rendered.status.success(), "helm template {chart} failed");
        sim.apply(&String::from_utf8_lossy(&rendered.stdout))?;
        // The DaemonSet's pods run simulated (their image maps to no binary): enough to bind
        // a token to the one on node-0.
        let selector = format!("app.kubernetes.io/name={chart}");
        let pod_on_node_0 = || -> Result<String> {
            sim.jsonpath(
                &[
                    "pods",
                    "-n",
                    "nodegrace",
                    "-l",
                    &selector,
                    "--field-selector",
                    "spec.nodeName=node-0",
                ],
                "{.items[0].metadata.name} {.items[0].metadata.uid}",
            )
        };
        sim.wait_for(
            "the agent's pod on node-0",
            "pods",
            Duration::from_secs(20),
            |_| Ok(pod_on_node_0()?.contains(' ')),
        )?;
        let found = pod_on_node_0()?;
        let (pod, uid) = found.split_once(' ').context("no pod")?;
        let token = sim.token_flag("nodegrace", chart, Some((pod, uid)))?;
        let condition =
            r#"{"status":{"conditions":[{"type":"ChartCheck","status":"True","reason":"Test"}]}}"#;
        sim.ok(&[
            "patch",
            "node",
            "node-0",
            "--subresource=status",
            "-p",
            condition,
            &token,
        ])?;
        let refused = sim.kubectl(&[
            "patch",
            "node",
            "node-1",
            "--subresource=status",
            "-p",
            condition,
            &token,
        ])?;
        let stderr = String::from_utf8_lossy(&refused.stderr);
        let refusal = if chart == "graceful-shutdown-agent" {
            format!(
                "{chart} may write only the Node its pod runs on and that node's pods, not node node-1"
            )
        } else {
            format!("{chart} may write only the Node its pod runs on, not node-1")
        };
        ensure!(
            !refused.status.success() && stderr.contains(&refusal),
            "{chart}: {stderr}"
        );
        if chart == "graceful-shutdown-agent" {
            pods_of_other_nodes_are_refused(&sim, &selector, &token)?;
        }
        let secrets = sim.kubectl(&["get", "secrets", "-A", &token])?;
        let stderr = String::from_utf8_lossy(&secrets.stderr);
        ensure!(
            stderr.contains(&format!(
                r#"User "system:serviceaccount:nodegrace:{chart}" cannot list resource "secrets""#
            )),
            "{chart}: {stderr}"
        );
    }
    Ok(())
}

/// The EvictionRequest API as an operator turns it on and reads it: both flags or neither, and
/// a request kubectl creates becomes an Eviction kubectl lists.
#[test]
fn the_eviction_request_api_behind_its_flags() -> Result<()> {
    if kubectl_missing() {
        return Ok(());
    }
    let half = std::process::Command::new(env!("CARGO_BIN_EXE_kube-sim"))
        .args(["serve", "--kubeconfig-out", "/dev/null"])
        .args(["--feature-gates", "EvictionRequestAPI=true"])
        .output()?;
    let said = String::from_utf8_lossy(&half.stderr);
    ensure!(
        !half.status.success() && said.contains("--runtime-config lifecycle.k8s.io/v1alpha1=true"),
        "{said}"
    );
    let sim = Sim::start_with(
        1,
        &[
            "--feature-gates",
            "EvictionRequestAPI=true",
            "--runtime-config",
            "lifecycle.k8s.io/v1alpha1=true",
        ],
    )?;
    let resources = sim.ok(&["api-resources", "--api-group=lifecycle.k8s.io"])?;
    ensure!(
        resources.contains("evictionrequests") && resources.contains("evictions"),
        "{resources}"
    );
    sim.ok(&["run", "db", "--image=postgres", "--restart=Never"])?;
    let uid = sim.jsonpath(&["pod", "db"], "{.metadata.uid}")?;
    let manifest = sim.dir.path().join("request.yaml");
    std::fs::write(
        &manifest,
        format!(
            "apiVersion: lifecycle.k8s.io/v1alpha1\nkind: EvictionRequest\nmetadata: {{name: {uid}}}\nspec: {{requester: nodegrace.io/termination-controller, intent: Eviction, target: {{pod: {{name: db, uid: {uid}}}}}}}\n"
        ),
    )?;
    sim.ok(&["create", "-f", &manifest.to_string_lossy()])?;
    sim.wait_for(
        "the evictor to finish",
        "evictions.lifecycle.k8s.io",
        Duration::from_secs(20),
        |_| {
            Ok(sim
                .jsonpath(
                    &["evictions.lifecycle.k8s.io", "pod-1-db"],
                    "{.status.conditions[?(@.type==\"TargetEvicted\")].status}",
                )
                .is_ok_and(|status| status == "True"))
        },
    )?;
    let listed = sim.ok(&["get", "evictions.lifecycle.k8s.io"])?;
    ensure!(listed.contains("pod-1-db"), "{listed}");
    Ok(())
}
