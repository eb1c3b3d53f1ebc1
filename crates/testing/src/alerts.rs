//! A chart's PrometheusRule against the program's metrics: rendered by the real helm with
//! `prometheusRule.enabled=true`, every alert's expression must parse as PromQL and select only
//! series the program exports (or the API server's own `apiserver_…` series).

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result, bail};
use promql_parser::parser;
use serde_json::Value;

use super::dashboard::selected_metrics;
use nodegrace_core::telemetry::{ProgramRegistry, RegisteredMetric};

/// The helm `cargo xtask test` installs (target/tools/helm), else the one on PATH.
fn helm() -> PathBuf {
    let cached = super::reference::workspace().join("target/tools/helm");
    if cached.is_file() {
        cached
    } else {
        PathBuf::from("helm")
    }
}

/// Returns the alerts checked.
pub fn check_program_alerts(program: &str, registry: &ProgramRegistry) -> Result<usize> {
    let chart = super::reference::workspace().join("charts").join(program);
    let output = Command::new(helm())
        .args(["template", "alerts"])
        .arg(&chart)
        .args(["--set", "prometheusRule.enabled=true"])
        .output()
        .context("run helm (`cargo xtask test` installs it under target/tools)")?;
    if !output.status.success() {
        bail!(
            "helm template {program}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let rendered = String::from_utf8(output.stdout)?;
    let exported: BTreeSet<String> = registry
        .catalogue()
        .iter()
        .flat_map(RegisteredMetric::series)
        .collect();
    let mut checked = 0;
    for document in serde_yaml_ng::Deserializer::from_str(&rendered) {
        let object: Value = serde::Deserialize::deserialize(document)?;
        if object["kind"] != "PrometheusRule" {
            continue;
        }
        let rules = object["spec"]["groups"].as_array().into_iter().flatten();
        for rule in rules.flat_map(|group| group["rules"].as_array().into_iter().flatten()) {
            let alert = rule["alert"].as_str().unwrap_or("(unnamed)");
            let query = rule["expr"]
                .as_str()
                .with_context(|| format!("{alert} has no expr"))?;
            let expr = parser::parse(query)
                .map_err(|error| anyhow::anyhow!("{alert}: `{query}` is not PromQL: {error}"))?;
            let mut selected = Vec::new();
            selected_metrics(&expr, &mut selected);
            if selected.is_empty() {
                bail!("{alert}: `{query}` selects no metric");
            }
            for name in selected {
                if !exported.contains(&name) && !name.starts_with("apiserver_") {
                    bail!("{alert}: `{query}` selects `{name}`, which {program} does not export");
                }
            }
            checked += 1;
        }
    }
    if checked == 0 {
        bail!("the {program} chart renders no alert with prometheusRule.enabled=true");
    }
    Ok(checked)
}
