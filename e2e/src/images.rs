//! Which binary runs each of our images: kube-sim's `--run-image` rules. An image
//! `<registry>/<owner>/<program>:<tag>` runs `<dir>/<program>`, unless an override names another
//! binary for that program (e.g. a deliberately broken agent).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

/// The registry and owner every chart's image names.
pub const IMAGE_PREFIX: &str = "ghcr.io/nodegrace/";

#[derive(Debug, Clone)]
pub struct ImageBinaries {
    pub dir: PathBuf,
    pub overrides: BTreeMap<String, PathBuf>,
}

impl ImageBinaries {
    /// A binary of this directory, checked to exist.
    pub fn binary(&self, program: &str) -> Result<PathBuf> {
        let binary = self.dir.join(program);
        if !binary.is_file() {
            bail!(
                "{} does not exist (build it with `cargo build -p {program}`)",
                binary.display()
            );
        }
        Ok(binary)
    }

    /// kube-sim's `--run-image` rules: each override first (its binary linked under its
    /// program's name in `links`, as a rule names a directory), then every image of ours.
    pub fn run_image_rules(&self, links: &Path) -> Result<Vec<String>> {
        let mut rules = Vec::new();
        for (program, binary) in &self.overrides {
            let dir = links.join(program);
            std::fs::create_dir_all(&dir)?;
            let link = dir.join(program);
            let _ = std::fs::remove_file(&link);
            let binary = std::fs::canonicalize(binary)
                .with_context(|| format!("the binary for {program}: {}", binary.display()))?;
            std::os::unix::fs::symlink(&binary, &link)?;
            rules.push(format!("{IMAGE_PREFIX}{program}:*={}", dir.display()));
        }
        rules.push(format!("{IMAGE_PREFIX}*={}", self.dir.display()));
        Ok(rules)
    }
}
