//! `cargo xtask plugin …`: the kubectl plugin's release archives and its krew manifest. The
//! release workflow runs `package` on each platform and `manifest` over the archives; the
//! manifest's format is krew's (krew.sigs.k8s.io/docs/developer-guide/plugin-manifest).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::Subcommand;
use flate2::Compression;
use flate2::write::GzEncoder;
use ring::digest::{SHA256, digest};

use crate::{cargo, project_root, run_command, target_dir};

const BINARY: &str = "kubectl-nodegrace";
/// Where the archives of a release are put, and the manifest is read from.
const ARCHIVES: &str = "plugin";

#[derive(Debug, Subcommand)]
pub enum Action {
    /// Builds the plugin (release profile) for `--target` and archives it with the LICENSE as
    /// target/plugin/kubectl-nodegrace-v<version>-<os>-<arch>.tar.gz.
    Package {
        /// A Rust target triple: x86_64/aarch64, -unknown-linux-gnu or -apple-darwin.
        #[arg(long)]
        target: String,
    },
    /// Writes the krew manifest (plugins/nodegrace.yaml) for the archives in target/plugin,
    /// with each one's sha256.
    Manifest {
        /// Where the release's assets are downloaded from.
        #[arg(long, default_value = "https://github.com/nodegrace/nodegrace")]
        repository: String,
        #[arg(long, default_value = "plugins/nodegrace.yaml")]
        out: PathBuf,
    },
}

pub fn run(action: &Action) -> Result<()> {
    let version = env!("CARGO_PKG_VERSION");
    let dir = target_dir().join(ARCHIVES);
    match action {
        Action::Package { target } => {
            let (os, arch) = platform(target)?;
            run_command(cargo().args([
                "build",
                "--release",
                "--package",
                BINARY,
                "--target",
                target,
            ]))?;
            let binary = target_dir().join(target).join("release").join(BINARY);
            std::fs::create_dir_all(&dir)?;
            let archive = dir.join(archive_name(version, os, arch));
            std::fs::write(
                &archive,
                archive_bytes(
                    &std::fs::read(&binary)?,
                    &std::fs::read(project_root().join("LICENSE"))?,
                )?,
            )?;
            println!("{}", archive.display());
            Ok(())
        }
        Action::Manifest { repository, out } => {
            let manifest = manifest(&dir, version, repository)?;
            let out = project_root().join(out);
            if let Some(parent) = out.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::write(&out, manifest)?;
            println!("{}", out.display());
            Ok(())
        }
    }
}

/// krew's `os` and `arch` of a Rust target.
fn platform(target: &str) -> Result<(&'static str, &'static str)> {
    let arch = match target.split('-').next() {
        Some("x86_64") => "amd64",
        Some("aarch64") => "arm64",
        _ => bail!("--target {target}: the plugin is released for x86_64 and aarch64"),
    };
    let os = if target.ends_with("-linux-gnu") || target.ends_with("-linux-musl") {
        "linux"
    } else if target.ends_with("-apple-darwin") {
        "darwin"
    } else {
        bail!("--target {target}: the plugin is released for linux and darwin");
    };
    Ok((os, arch))
}

fn archive_name(version: &str, os: &str, arch: &str) -> String {
    format!("{BINARY}-v{version}-{os}-{arch}.tar.gz")
}

/// A gzipped tar of the binary (mode 755) and the LICENSE, at its root as krew expects.
fn archive_bytes(binary: &[u8], license: &[u8]) -> Result<Vec<u8>> {
    let mut builder = tar::Builder::new(GzEncoder::new(Vec::new(), Compression::best()));
    for (name, bytes, mode) in [(BINARY, binary, 0o755), ("LICENSE", license, 0o644)] {
        let mut header = tar::Header::new_gnu();
        header.set_size(bytes.len() as u64);
        header.set_mode(mode);
        header.set_mtime(0);
        header.set_cksum();
        builder.append_data(&mut header, name, bytes)?;
    }
    Ok(builder.into_inner()?.finish()?)
}

fn sha256_hex(bytes: &[u8]) -> String {
    let mut hex = String::with_capacity(64);
    for byte in digest(&SHA256, bytes).as_ref() {
        let _ = write!(hex, "{byte:02x}");
    }
    hex
}

/// The krew manifest for every archive of `version` in `dir`; all four platforms must be
/// there.
fn manifest(dir: &Path, version: &str, repository: &str) -> Result<String> {
    let mut platforms = String::new();
    for (os, arch) in [
        ("linux", "amd64"),
        ("linux", "arm64"),
        ("darwin", "amd64"),
        ("darwin", "arm64"),
    ] {
        let name = archive_name(version, os, arch);
        let bytes = std::fs::read(dir.join(&name))
            .with_context(|| format!("the {os}/{arch} archive {name} in {}", dir.display()))?;
        let _ = write!(
            platforms,
            "  - selector:\n      matchLabels:\n        os: {os}\n        arch: {arch}\n    \
             uri: {repository}/releases/download/v{version}/{name}\n    sha256: {}\n    \
             bin: {BINARY}\n    files:\n      - from: {BINARY}\n        to: .\n      \
             - from: LICENSE\n        to: .\n",
            sha256_hex(&bytes)
        );
    }
    Ok(format!(
        "apiVersion: krew.googlecontainertools.github.com/v1alpha2\nkind: Plugin\nmetadata:\n  \
         name: nodegrace\nspec:\n  version: v{version}\n  homepage: {repository}\n  \
         shortDescription: Why a node still waits, and what would move it\n  description: |\n    \
         Shows every node's lifecycle under the nodegrace programs (graceful shutdown, shutdown\n    \
         inhibitors, out-of-service cleanup and fencing, termination): where it stands, what\n    \
         blocks it, and the command that would unblock it. Read-only.\n  platforms:\n{platforms}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn archives_hold_the_binary_and_license_and_the_manifest_pins_each_by_sha256() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let mut expected = Vec::new();
        for (os, arch) in [
            ("linux", "amd64"),
            ("linux", "arm64"),
            ("darwin", "amd64"),
            ("darwin", "arm64"),
        ] {
            let bytes = archive_bytes(format!("{os}-{arch}").as_bytes(), b"license")?;
            std::fs::write(dir.path().join(archive_name("1.2.3", os, arch)), &bytes)?;
            expected.push(sha256_hex(&bytes));
        }
        let one = archive_bytes(b"binary", b"license")?;
        let mut names = Vec::new();
        let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(one.as_slice()));
        for entry in archive.entries()? {
            let entry = entry?;
            names.push((entry.path()?.display().to_string(), entry.header().mode()?));
        }
        assert_eq!(
            names,
            [(BINARY.to_owned(), 0o755), ("LICENSE".to_owned(), 0o644)]
        );

        let text = manifest(dir.path(), "1.2.3", "https://example.com/nodegrace")?;
        let parsed: serde_json::Value = serde_yaml_ng::from_str(&text)?;
        assert_eq!(parsed["kind"], "Plugin");
        assert_eq!(parsed["metadata"]["name"], "nodegrace");
        assert_eq!(parsed["spec"]["version"], "v1.2.3");
        let platforms = parsed["spec"]["platforms"].as_array().expect("platforms");
        assert_eq!(platforms.len(), 4);
        for (platform, sha) in platforms.iter().zip(&expected) {
            assert_eq!(platform["sha256"], sha.as_str());
            assert_eq!(platform["bin"], BINARY);
            let (os, arch) = (
                &platform["selector"]["matchLabels"]["os"],
                &platform["selector"]["matchLabels"]["arch"],
            );
            assert_eq!(
                platform["uri"],
                format!(
                    "https://example.com/nodegrace/releases/download/v1.2.3/kubectl-nodegrace-v1.2.3-{}-{}.tar.gz",
                    os.as_str().unwrap(),
                    arch.as_str().unwrap()
                )
            );
        }
        std::fs::remove_file(dir.path().join(archive_name("1.2.3", "darwin", "arm64")))?;
        let missing = manifest(dir.path(), "1.2.3", "x").unwrap_err();
        assert!(
            format!("{missing:#}").contains("darwin/arm64"),
            "{missing:#}"
        );
        assert!(platform("riscv64gc-unknown-linux-gnu").is_err());
        assert_eq!(platform("aarch64-apple-darwin")?, ("darwin", "arm64"));
        Ok(())
    }
}
