//! A program's Helm chart rendered by the real helm, as `helm install` would render it.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::manifests::parse_documents;

/// The objects `helm template` renders for `chart` with the values file `values`.
pub fn render(
    helm: &Path,
    chart: &Path,
    release: &str,
    namespace: &str,
    values: &Path,
) -> Result<Vec<Value>> {
    let output = Command::new(helm)
        .arg("template")
        // A chart's CRDs (crds/) are installed like its other objects.
        .arg("--include-crds")
        .arg(release)
        .arg(chart)
        .args(["--namespace", namespace])
        .arg("--values")
        .arg(values)
        .output()
        .with_context(|| {
            format!(
                "run {} (`cargo xtask demo` installs helm under target/tools)",
                helm.display()
            )
        })?;
    if !output.status.success() {
        bail!(
            "helm template {} failed: {}",
            chart.display(),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    parse_documents(&String::from_utf8(output.stdout)?)
        .with_context(|| format!("read what helm rendered for {}", chart.display()))
}
