//! A program's Helm chart, installed and rendered by the real helm.

use std::fmt::Write as _;
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

/// The objects `helm install` of `chart` with the values file `values` and the `--set` values
/// `set` creates: what `helm template` renders, less the hooks (run by helm at other moments,
/// e.g. on uninstall).
pub fn render(
    helm: &Path,
    chart: &Path,
    release: &str,
    namespace: &str,
    values: &Path,
    set: &[String],
) -> Result<Vec<Value>> {
    let mut command = Command::new(helm);
    command
        .arg("template")
        // A chart's CRDs (crds/) are installed like its other objects.
        .arg("--include-crds")
        .arg(release)
        .arg(chart)
        .args(["--namespace", namespace])
        .arg("--values")
        .arg(values);
    for value in set {
        command.args(["--set", value]);
    }
    let output = command.output().with_context(|| {
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

/// ` --set a=1 --set b=2` for `set`, as the helm commands the timeline tells take them.
pub fn set_flags(set: &[String]) -> String {
    set.iter().fold(String::new(), |mut flags, value| {
        let _ = write!(flags, " --set {value}");
        flags
    })
}

/// A release of a chart in the cluster of `kubeconfig`, as the real helm manages it.
#[derive(Debug, Clone, Copy)]
pub struct Release<'a> {
    pub helm: &'a Path,
    pub kubeconfig: &'a Path,
    pub chart: &'a Path,
    pub name: &'a str,
    pub namespace: &'a str,
}

impl Release<'_> {
    /// `helm install <name> <chart> -n <namespace> --create-namespace -f <values> --set <set>…`,
    /// as an operator installs it.
    pub fn install(&self, values: &[&Path], set: &[String]) -> Result<()> {
        self.run(&["install", "--create-namespace"], values, set)
    }

    /// `helm upgrade <name> <chart> -n <namespace> -f <values> --set <set>…`: what an operator
    /// types to change one value of a release.
    pub fn upgrade(&self, values: &[&Path], set: &[String]) -> Result<()> {
        self.run(&["upgrade"], values, set)
    }

    fn run(&self, verb: &[&str], values: &[&Path], set: &[String]) -> Result<()> {
        let mut command = Command::new(self.helm);
        command
            .args(verb)
            .arg(self.name)
            .arg(self.chart)
            .args(["--namespace", self.namespace]);
        for file in values {
            command.arg("--values").arg(file);
        }
        for value in set {
            command.args(["--set", value]);
        }
        let what = format!("helm {} {}{}", verb[0], self.name, set_flags(set));
        run(command, self.kubeconfig, &what)
    }
}

/// `helm uninstall <release> -n <namespace> --wait`.
pub fn uninstall(helm: &Path, kubeconfig: &Path, release: &str, namespace: &str) -> Result<()> {
    let mut command = Command::new(helm);
    command.args(["uninstall", release, "--namespace", namespace, "--wait"]);
    run(command, kubeconfig, &format!("helm uninstall {release}"))
}

/// Runs a helm command against the cluster of `kubeconfig`; its stderr is the error.
fn run(mut command: Command, kubeconfig: &Path, what: &str) -> Result<()> {
    let output = command
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .output()
        .with_context(|| format!("run {what}"))?;
    if !output.status.success() {
        bail!(
            "{what} failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(())
}
