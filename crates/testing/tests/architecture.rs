//! ARCHITECTURE.md stays true: every contract name it lists is still defined in the file it
//! names, and every code path it gives still leads to its item.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail, ensure};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn architecture() -> Result<String> {
    std::fs::read_to_string(root().join("ARCHITECTURE.md")).context("read ARCHITECTURE.md")
}

/// The backticked spans of `text`, in order.
fn quoted(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

/// The rows of the table under `## Contracts between programs`: each row's cells.
fn contract_rows(page: &str) -> Result<Vec<Vec<&str>>> {
    let section = page
        .split("\n## Contracts between programs")
        .nth(1)
        .and_then(|rest| rest.split("\n## ").next())
        .context("ARCHITECTURE.md has a section \"Contracts between programs\"")?;
    Ok(section
        .lines()
        .filter(|line| line.starts_with("| `"))
        .map(|line| line.trim_matches('|').split(" | ").map(str::trim).collect())
        .collect())
}

#[test]
fn every_contract_name_is_defined_where_the_map_says() -> Result<()> {
    let page = architecture()?;
    let rows = contract_rows(&page)?;
    ensure!(rows.len() >= 20, "only {} contracts found", rows.len());
    let mut stale = Vec::new();
    for row in rows {
        let (Some(name), Some(file)) = (
            row.first().and_then(|cell| quoted(cell).first().copied()),
            row.last().and_then(|cell| quoted(cell).first().copied()),
        ) else {
            bail!("a contract row without a name or a file: {row:?}");
        };
        let source = std::fs::read_to_string(root().join(file))
            .with_context(|| format!("{name}: read {file}"))?;
        // Defined as a string literal (a prefix contract ends where the literal goes on).
        if !source.contains(&format!("\"{name}")) {
            stale.push(format!("{name} is not in {file}"));
        }
    }
    ensure!(
        stale.is_empty(),
        "ARCHITECTURE.md is stale:\n{}",
        stale.join("\n")
    );
    Ok(())
}

/// `nodegrace_core::k8s::node_identity::NodeIdentity` → the module's file and the item.
fn item_of(path: &str) -> Option<(PathBuf, &str)> {
    let mut parts: Vec<&str> = path.split("::").collect();
    let crate_dir = match *parts.first()? {
        "nodegrace_core" => "core",
        "nodegrace_controller" => "controller",
        "nodegrace_logind" => "logind",
        _ => return None,
    };
    let item = (parts.len() > 2 && parts.last()?.starts_with(char::is_uppercase))
        .then(|| parts.pop())
        .flatten()
        .unwrap_or("");
    let src = root().join("crates").join(crate_dir).join("src");
    let module: PathBuf = parts[1..].iter().collect();
    let file = [
        src.join(&module).with_extension("rs"),
        src.join(&module).join("mod.rs"),
    ]
    .into_iter()
    .find(|candidate| candidate.is_file())
    .unwrap_or_else(|| src.join(&module).with_extension("rs"));
    Some((file, item))
}

#[test]
fn every_code_path_it_names_leads_to_its_item() -> Result<()> {
    let page = architecture()?;
    let mut stale = Vec::new();
    let mut checked = 0;
    for path in quoted(&page) {
        let Some((file, item)) = item_of(path) else {
            continue;
        };
        checked += 1;
        match std::fs::read_to_string(&file) {
            Ok(source) if source.contains(item) => {}
            Ok(_) => stale.push(format!("{path}: no {item} in {}", file.display())),
            Err(_) => stale.push(format!("{path}: no file {}", file.display())),
        }
    }
    ensure!(checked >= 6, "only {checked} code paths found");
    ensure!(
        stale.is_empty(),
        "ARCHITECTURE.md is stale:\n{}",
        stale.join("\n")
    );
    Ok(())
}
