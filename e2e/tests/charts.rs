//! The charts as helm renders them, read as an operator and a security reviewer would: what
//! each default renders, and what bad values get.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use serde_json::Value;

const CHARTS: [&str; 4] = [
    "graceful-shutdown-agent",
    "shutdown-inhibitor-agent",
    "out-of-service-gc",
    "termination-controller",
];

fn repo() -> &'static Path {
    Path::new(nodegrace_e2e::REPO)
}

fn helm() -> PathBuf {
    nodegrace_e2e::chart::helm_binary(repo())
}

/// `helm template` of `chart` (a path) with `--set` values; its objects, or helm's error.
fn render(chart: &Path, sets: &[&str]) -> Result<Vec<Value>> {
    let mut command = Command::new(helm());
    command.args(["template", "release"]).arg(chart);
    for set in sets {
        command.args(["--set", set]);
    }
    let output = command.output().context("run helm")?;
    if !output.status.success() {
        bail!("{}", String::from_utf8_lossy(&output.stderr).trim());
    }
    nodegrace_e2e::manifests::parse_documents(&String::from_utf8(output.stdout)?)
}

fn chart(name: &str) -> PathBuf {
    repo().join("charts").join(name)
}

fn of_kind<'a>(objects: &'a [Value], kind: &str) -> Vec<&'a Value> {
    objects.iter().filter(|o| o["kind"] == kind).collect()
}

fn pod_specs(objects: &[Value]) -> Vec<(&str, &Value)> {
    objects
        .iter()
        .filter(|o| matches!(o["kind"].as_str(), Some("Deployment" | "DaemonSet" | "Job")))
        .map(|o| {
            (
                o["metadata"]["name"].as_str().unwrap_or_default(),
                &o["spec"]["template"]["spec"],
            )
        })
        .collect()
}

#[test]
fn every_rendered_argument_stays_one_string_whatever_it_holds() -> Result<()> {
    let objects = render(
        &chart("termination-controller"),
        &[
            "instanceProvider.kind=exec",
            "instanceProvider.command=/bin/cloud: terminate #now",
            "extraArgs[0]=--log-level=info: {x}",
        ],
    )?;
    let deployment = of_kind(&objects, "Deployment")[0];
    let args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .context("no args")?;
    assert!(args.iter().all(Value::is_string), "{args:?}");
    assert!(
        args.contains(&Value::from(
            "--instance-provider-command=/bin/cloud: terminate #now"
        )),
        "{args:?}"
    );
    assert!(
        args.contains(&Value::from("--log-level=info: {x}")),
        "{args:?}"
    );
    Ok(())
}

/// Helm hands every subchart `global`; a schema refusing unknown root keys must allow it.
#[test]
fn the_four_charts_install_as_subcharts_of_one_umbrella_chart_with_globals() -> Result<()> {
    let umbrella = tempfile::tempdir()?;
    let dependencies = CHARTS
        .map(|name| format!("  - name: {name}\n    version: 0.1.0\n"))
        .concat();
    std::fs::write(
        umbrella.path().join("Chart.yaml"),
        format!(
            "apiVersion: v2\nname: platform\nversion: 1.0.0\nkubeVersion: \">=1.33.0-0\"\ndependencies:\n{dependencies}"
        ),
    )?;
    std::fs::create_dir(umbrella.path().join("templates"))?;
    std::fs::write(
        umbrella.path().join("values.yaml"),
        "global:\n  imageRegistry: registry.example\n",
    )?;
    let subcharts = umbrella.path().join("charts");
    for name in CHARTS {
        copy_dir(&chart(name), &subcharts.join(name))?;
    }
    let lint = Command::new(helm())
        .args(["lint", "--strict"])
        .arg(umbrella.path())
        .output()?;
    assert!(
        lint.status.success(),
        "{}",
        String::from_utf8_lossy(&lint.stdout)
    );
    let objects = render(umbrella.path(), &[])?;
    let workloads: Vec<&str> = pod_specs(&objects)
        .into_iter()
        .map(|(name, _)| name)
        .collect();
    for name in CHARTS {
        assert!(
            workloads.iter().any(|w| w.ends_with(name)),
            "{name} renders no workload in the umbrella: {workloads:?}"
        );
    }
    Ok(())
}

fn copy_dir(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), target)?;
        }
    }
    Ok(())
}

#[test]
fn node_registration_never_waits_for_the_webhook_and_both_webhooks_see_only_managed_nodes()
-> Result<()> {
    let objects = render(
        &chart("termination-controller"),
        &["webhook.failurePolicy=Fail"],
    )?;
    let mutating = of_kind(&objects, "MutatingWebhookConfiguration")[0];
    let validating = of_kind(&objects, "ValidatingWebhookConfiguration")[0];
    assert_eq!(mutating["webhooks"][0]["failurePolicy"], "Ignore");
    assert_eq!(validating["webhooks"][0]["failurePolicy"], "Fail");
    let karpenters = serde_json::json!({"matchExpressions": [{"key": "karpenter.sh/nodepool", "operator": "DoesNotExist"}]});
    for webhook in [mutating, validating] {
        assert_eq!(webhook["webhooks"][0]["objectSelector"], karpenters);
    }
    let deployment = of_kind(&objects, "Deployment")[0];
    let args = &deployment["spec"]["template"]["spec"]["containers"][0]["args"];
    assert!(
        args.as_array().is_some_and(
            |args| args.contains(&Value::from("--node-selector=!karpenter.sh/nodepool"))
        ),
        "{args}"
    );
    Ok(())
}

/// What the restricted Pod Security Standard requires of a pod (pod-security-admission's
/// restricted checks that a chart can get wrong).
fn restricted_violations(spec: &Value) -> Vec<String> {
    let mut violations = Vec::new();
    for key in ["hostNetwork", "hostPID", "hostIPC"] {
        if spec[key] == true {
            violations.push(format!("{key}: true"));
        }
    }
    if spec["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|v| v.get("hostPath").is_some())
    {
        violations.push("a hostPath volume".to_owned());
    }
    let pod = &spec["securityContext"];
    for container in spec["containers"].as_array().into_iter().flatten() {
        let context = &container["securityContext"];
        let name = container["name"].as_str().unwrap_or_default();
        if context["allowPrivilegeEscalation"] != false {
            violations.push(format!("{name}: allowPrivilegeEscalation is not false"));
        }
        if context["runAsNonRoot"] != true && pod["runAsNonRoot"] != true {
            violations.push(format!("{name}: runAsNonRoot is not true"));
        }
        if context["runAsUser"] == 0 {
            violations.push(format!("{name}: runAsUser 0"));
        }
        let seccomp = if context["seccompProfile"].is_null() {
            &pod["seccompProfile"]
        } else {
            &context["seccompProfile"]
        };
        if !matches!(
            seccomp["type"].as_str(),
            Some("RuntimeDefault" | "Localhost")
        ) {
            violations.push(format!("{name}: no RuntimeDefault seccomp profile"));
        }
        if context["capabilities"]["drop"] != serde_json::json!(["ALL"]) {
            violations.push(format!("{name}: capabilities not dropped"));
        }
        let added = context["capabilities"]["add"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if added.iter().any(|c| c != "NET_BIND_SERVICE") {
            violations.push(format!("{name}: adds {added:?}"));
        }
    }
    violations
}

#[test]
fn the_controllers_pods_meet_the_restricted_pod_security_level_and_the_agents_say_why_not()
-> Result<()> {
    for name in ["out-of-service-gc", "termination-controller"] {
        let objects = render(&chart(name), &[])?;
        let specs = pod_specs(&objects);
        assert!(!specs.is_empty());
        for (workload, spec) in specs {
            let violations = restricted_violations(spec);
            assert!(violations.is_empty(), "{workload}: {violations:?}");
        }
    }
    // The agents need the host's logind: privileged (hostPath, root), documented as such.
    for name in ["graceful-shutdown-agent", "shutdown-inhibitor-agent"] {
        let objects = render(&chart(name), &[])?;
        let (_, spec) = pod_specs(&objects)[0];
        assert!(!restricted_violations(spec).is_empty());
        let readme = std::fs::read_to_string(chart(name).join("README.md"))?;
        assert!(
            readme.contains("privileged"),
            "{name}'s README does not say it needs a privileged namespace"
        );
    }
    Ok(())
}

#[test]
fn the_agents_run_on_linux_nodes_and_mount_the_bus_directory_not_its_socket() -> Result<()> {
    for name in ["graceful-shutdown-agent", "shutdown-inhibitor-agent"] {
        let objects = render(&chart(name), &["updateStrategy.type=OnDelete"])?;
        let daemonset = of_kind(&objects, "DaemonSet")[0];
        let spec = &daemonset["spec"]["template"]["spec"];
        assert_eq!(spec["nodeSelector"]["kubernetes.io/os"], "linux", "{name}");
        assert_eq!(
            daemonset["spec"]["updateStrategy"]["type"], "OnDelete",
            "{name}"
        );
        let dbus = spec["volumes"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|v| v["name"] == "dbus")
            .context("no dbus volume")?;
        assert_eq!(
            dbus["hostPath"],
            serde_json::json!({"path": "/run/dbus", "type": "Directory"}),
            "{name}"
        );
    }
    Ok(())
}

#[test]
fn both_shutdown_config_styles_at_once_are_refused_naming_the_field() {
    let error = render(
        &chart("graceful-shutdown-agent"),
        &[
            "config.shutdownGracePeriod=30s",
            "config.shutdownGracePeriodByPodPriority[0].priority=0",
            "config.shutdownGracePeriodByPodPriority[0].shutdownGracePeriodSeconds=10",
        ],
    )
    .unwrap_err()
    .to_string();
    assert!(error.contains("/config/shutdownGracePeriod"), "{error}");
}

#[test]
fn the_controllers_spread_over_nodes_and_zones_and_leave_a_dead_node_within_a_minute() -> Result<()>
{
    for name in ["out-of-service-gc", "termination-controller"] {
        let objects = render(&chart(name), &[])?;
        let spec = &of_kind(&objects, "Deployment")[0]["spec"]["template"]["spec"];
        let anti = &spec["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            [0];
        assert_eq!(anti["topologyKey"], "kubernetes.io/hostname", "{name}");
        assert_eq!(
            spec["topologySpreadConstraints"][0]["topologyKey"], "topology.kubernetes.io/zone",
            "{name}"
        );
        for taint in [
            "node.kubernetes.io/unreachable",
            "node.kubernetes.io/not-ready",
        ] {
            let toleration = spec["tolerations"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|t| t["key"] == taint)
                .with_context(|| format!("{name} does not tolerate {taint}"))?;
            assert!(
                toleration["tolerationSeconds"]
                    .as_i64()
                    .is_some_and(|s| s <= 60),
                "{name}: {toleration}"
            );
        }
    }
    Ok(())
}

/// The controller's ClusterRole grants what `eviction.api` makes the drain call, and nothing of
/// the other API (the e2e least-privilege proof shows each rule needed).
#[test]
fn the_controllers_eviction_rbac_follows_eviction_api() -> Result<()> {
    let grants = |api: &str| -> Result<Vec<String>> {
        let objects = render(
            &chart("termination-controller"),
            &[&format!("eviction.api={api}")],
        )?;
        let role = of_kind(&objects, "ClusterRole")
            .into_iter()
            .find(|role| role["metadata"]["annotations"]["helm.sh/hook"].is_null())
            .context("the controller's ClusterRole")?;
        Ok(role["rules"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|rule| rule["resources"].as_array().cloned().unwrap_or_default())
            .filter_map(|resource| resource.as_str().map(str::to_owned))
            .filter(|resource| resource.starts_with("eviction") || resource == "pods/eviction")
            .collect())
    };
    assert_eq!(grants("eviction")?, ["pods/eviction"]);
    assert_eq!(
        grants("auto")?,
        ["pods/eviction", "evictionrequests", "evictions"]
    );
    assert_eq!(
        grants("eviction-request")?,
        ["evictionrequests", "evictions"]
    );
    Ok(())
}

#[test]
fn values_users_expect_render_where_they_belong() -> Result<()> {
    for name in CHARTS {
        let objects = render(
            &chart(name),
            &[
                "fullnameOverride=ng",
                "serviceAccount.create=false",
                "serviceAccount.name=existing",
                "imagePullSecrets[0].name=regcred",
                "podAnnotations.team=nodes",
                "podLabels.tier=infra",
                "extraEnv[0].name=RUST_BACKTRACE",
                "extraEnv[0].value=1",
                "revisionHistoryLimit=3",
                "serviceMonitor.enabled=true",
                "networkPolicy.enabled=true",
            ],
        )?;
        assert!(
            of_kind(&objects, "ServiceAccount")
                .iter()
                .all(|sa| sa["metadata"]["name"] != "ng"),
            "{name}"
        );
        let workload = objects
            .iter()
            .find(|o| matches!(o["kind"].as_str(), Some("Deployment" | "DaemonSet")))
            .context("no workload")?;
        assert_eq!(workload["metadata"]["name"], "ng", "{name}");
        assert_eq!(workload["spec"]["revisionHistoryLimit"], 3, "{name}");
        let template = &workload["spec"]["template"];
        assert_eq!(template["spec"]["serviceAccountName"], "existing", "{name}");
        assert_eq!(
            template["spec"]["imagePullSecrets"][0]["name"], "regcred",
            "{name}"
        );
        assert_eq!(
            template["metadata"]["annotations"]["team"], "nodes",
            "{name}"
        );
        assert_eq!(template["metadata"]["labels"]["tier"], "infra", "{name}");
        assert!(
            template["spec"]["containers"][0]["env"]
                .as_array()
                .is_some_and(|env| env.iter().any(|e| e["name"] == "RUST_BACKTRACE")),
            "{name}"
        );
        for kind in ["ServiceMonitor", "NetworkPolicy"] {
            assert_eq!(of_kind(&objects, kind).len(), 1, "{name}: {kind}");
        }
        // The uninstall hook's binding is its own ServiceAccount's.
        let bindings = of_kind(&objects, "ClusterRoleBinding");
        assert!(
            bindings
                .iter()
                .filter(|b| b["metadata"]["annotations"]["helm.sh/hook"].is_null())
                .all(|b| b["subjects"][0]["name"] == "existing"),
            "{name}"
        );
    }
    Ok(())
}

#[test]
fn a_missing_service_account_name_is_refused_with_the_fix() {
    let error = render(
        &chart("out-of-service-gc"),
        &["serviceAccount.create=false"],
    )
    .unwrap_err()
    .to_string();
    assert!(error.contains("serviceAccount.name"), "{error}");
}
