//! The documents a user reads stand alone: every relative link in the repository's Markdown
//! resolves to a file of the repository, and none reaches outside it.

use std::path::{Component, Path, PathBuf};

fn repo() -> PathBuf {
    std::fs::canonicalize(nodegrace_e2e::REPO).expect("the repository")
}

/// Every Markdown file, leaving out build output and fetched packages.
fn markdown_files(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir)
        .expect("a readable directory")
        .flatten()
    {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if path.is_dir() {
            if !matches!(name.as_str(), "target" | ".git" | "node_modules") {
                markdown_files(&path, found);
            }
        } else if path
            .extension()
            .is_some_and(|extension| extension.eq_ignore_ascii_case("md"))
        {
            found.push(path);
        }
    }
}

/// The targets of `[text](target)` links, without anchors; web links and pure anchors left out.
fn relative_links(text: &str) -> Vec<String> {
    let mut links = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        let Some(end) = rest.find(')') else { break };
        let target = rest[..end].split('#').next().unwrap_or_default().trim();
        let external = target.contains("://") || target.starts_with("mailto:");
        if !target.is_empty() && !external && !target.contains(' ') {
            links.push(target.to_owned());
        }
    }
    links
}

/// `base/relative` with `..` and `.` applied, without touching the filesystem.
fn resolve(base: &Path, relative: &str) -> PathBuf {
    let mut path = base.to_path_buf();
    for component in Path::new(relative).components() {
        match component {
            Component::ParentDir => {
                path.pop();
            }
            Component::Normal(part) => path.push(part),
            _ => {}
        }
    }
    path
}

#[test]
fn every_relative_link_of_the_docs_stays_in_the_repository_and_resolves() {
    let repo = repo();
    let mut files = Vec::new();
    markdown_files(&repo, &mut files);
    assert!(files.len() > 10, "found only {files:?}");
    let mut broken = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).expect("readable Markdown");
        let shown = file
            .strip_prefix(&repo)
            .unwrap_or(file)
            .display()
            .to_string();
        // Mentions of paths outside the repository in text or code spans count as well: a
        // reader cannot follow them either.
        if text.contains("../shared/") {
            broken.push(format!(
                "{shown}: names ../shared/, which is not part of the repository"
            ));
        }
        let dir = file.parent().expect("a file has a directory");
        for link in relative_links(&text) {
            let target = if let Some(from_root) = link.strip_prefix('/') {
                resolve(&repo, from_root)
            } else {
                resolve(dir, &link)
            };
            if !target.starts_with(&repo) {
                broken.push(format!("{shown}: ({link}) leaves the repository"));
            } else if !target.exists() {
                broken.push(format!("{shown}: ({link}) does not exist"));
            }
        }
    }
    assert!(
        broken.is_empty(),
        "links a reader cannot follow:\n{}",
        broken.join("\n")
    );
}

#[test]
fn links_are_found_and_judged_as_a_reader_follows_them() {
    let text = "see [a](docs/a.md#x), [web](https://x.io), [top](#top) and [up](../../out.md)";
    assert_eq!(relative_links(text), ["docs/a.md", "../../out.md"]);
    assert_eq!(
        resolve(Path::new("/r/docs"), "../charts/x.md"),
        Path::new("/r/charts/x.md")
    );
}
