//! A program's Helm chart, installed and rendered by the real helm.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::manifests::parse_documents;

/// The helm `cargo xtask` installs under `<repo>/target/tools`, else the one on PATH.
pub fn helm_binary(repo: &Path) -> PathBuf {
    let cached = repo.join("target/tools/helm");
    if cached.is_file() {
        cached
    } else {
        PathBuf::from("helm")
    }
}

/// The objects `helm install` of `chart` with the values file `values` creates: what `helm
/// template` renders, less the hooks (run by helm at other moments, e.g. on uninstall).
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
    let objects = parse_documents(&String::from_utf8(output.stdout)?)
        .with_context(|| format!("read what helm rendered for {}", chart.display()))?;
    Ok(objects
        .into_iter()
        .filter(|object| object["metadata"]["annotations"]["helm.sh/hook"].is_null())
        .collect())
}

/// `helm install <release> <chart> -n <namespace> --create-namespace -f <values>` into the
/// cluster of `kubeconfig`, as an operator installs it.
pub fn install(
    helm: &Path,
    kubeconfig: &Path,
    chart: &Path,
    release: &str,
    namespace: &str,
    values: &[&Path],
) -> Result<()> {
    let mut command = Command::new(helm);
    command
        .arg("install")
        .arg(release)
        .arg(chart)
        .args(["--namespace", namespace, "--create-namespace"])
        .arg("--kubeconfig")
        .arg(kubeconfig);
    for file in values {
        command.arg("--values").arg(file);
    }
    let output = command
        .output()
        .with_context(|| format!("run {}", helm.display()))?;
    if !output.status.success() {
        bail!(
            "helm install {release} {} failed: {}",
            chart.display(),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(())
}

/// `helm uninstall <release> -n <namespace> --wait`.
pub fn uninstall(helm: &Path, kubeconfig: &Path, release: &str, namespace: &str) -> Result<()> {
    let output = Command::new(helm)
        .args(["uninstall", release, "--namespace", namespace, "--wait"])
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .output()
        .with_context(|| format!("run {}", helm.display()))?;
    if !output.status.success() {
        bail!(
            "helm uninstall {release} failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(())
}
