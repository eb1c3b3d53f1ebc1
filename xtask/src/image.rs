//! `cargo xtask image [program…]`: one OCI image per program, written without a container
//! engine (as `ko` does for Go): the release binary, the shared libraries it was linked against,
//! CA certificates, `/etc/passwd` for its user, and nothing else — no shell, no package manager.
//!
//! Each image is an OCI image layout in a tar archive (`target/images/<program>.tar`) that also
//! carries Docker's `manifest.json`, as `docker save` writes since Docker 25, so `kind load
//! image-archive`, `skopeo copy oci-archive:…` and `docker load` all read it. Every byte is a
//! function of the binary, the libraries, the CA bundle and the commit: timestamps are the
//! commit's time, owners are 0, entries are sorted, so one commit built with one toolchain on
//! one base system gives one digest.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use clap::Args;
use flate2::{Compression, GzBuilder};
use ring::digest::{SHA256, digest};
use serde_json::{Value, json};

use crate::{cargo, output_of, project_root, run_command, setup, target_dir};

pub const PROGRAMS: [&str; 4] = [
    "graceful-shutdown-agent",
    "shutdown-inhibitor-agent",
    "out-of-service-gc",
    "termination-controller",
];

/// The agents run as root: logind lets only root take inhibitor locks without polkit (which a
/// pod cannot reach), and the graceful-shutdown-agent writes its drop-in into the host's
/// logind.conf.d. The controllers only talk to the API server.
const ROOT_PROGRAMS: [&str; 2] = ["graceful-shutdown-agent", "shutdown-inhibitor-agent"];
const NONROOT: &str = "65532:65532";
/// What the binaries need to be small enough to pull fast on a node that just booted.
pub const MAX_BINARY_BYTES: u64 = 15 * 1024 * 1024;
const CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";
const BINARY_DIR: &str = "usr/local/bin";
/// The Cargo profile the images' binaries are built with (size-optimised, whole-program LTO,
/// no symbols: see the workspace's Cargo.toml). The demo and the e2e run `release`, which
/// builds in a fraction of the time.
pub const IMAGE_PROFILE: &str = "image";

#[derive(Debug, Args)]
pub struct ImageArgs {
    /// Programs to build (default: all four).
    #[arg(value_parser = PROGRAMS)]
    programs: Vec<String>,
    /// Package the binaries of the `image` profile already built instead of building them
    /// first.
    #[arg(long)]
    no_build: bool,
    /// Then check each image: rebuilt byte for byte the same, binary within 15 MiB, read and
    /// verified by skopeo, and `<program> --version` run in a chroot of its unpacked layers.
    /// Needs root (chroot).
    #[arg(long)]
    check: bool,
}

/// One image written to disk.
#[derive(Debug)]
pub struct Built {
    pub program: String,
    pub reference: String,
    pub archive: PathBuf,
    /// The manifest's digest: what `image@sha256:…` pins.
    pub digest: String,
    pub binary_bytes: u64,
    pub layer_bytes: u64,
    pub user: &'static str,
}

pub fn run(args: &ImageArgs) -> Result<()> {
    let programs: Vec<&str> = if args.programs.is_empty() {
        PROGRAMS.to_vec()
    } else {
        args.programs.iter().map(String::as_str).collect()
    };
    if !args.no_build {
        build_binaries(&programs)?;
    }
    let built = build_all(&programs)?;
    if args.check {
        check_all(&built)?;
    }
    Ok(())
}

/// `programs` built with the images' profile.
pub fn build_binaries(programs: &[&str]) -> Result<()> {
    println!(
        "==> {IMAGE_PROFILE}-profile build of {}",
        programs.join(", ")
    );
    run_command(&mut binaries_build(programs))
}

/// The images' build has a target directory of its own: Cargo locks a target directory for
/// each build, and this one may run while other steps build and run the dev binaries.
fn image_target_dir() -> PathBuf {
    target_dir().join("image-build")
}

fn binaries_build(programs: &[&str]) -> Command {
    let mut build = cargo();
    build
        .current_dir(project_root())
        .args(["build", "--profile", IMAGE_PROFILE, "--target-dir"])
        .arg(image_target_dir());
    for program in programs {
        build.args(["--package", program]);
    }
    build
}

/// The images' build started in the background at the lowest CPU priority, in a process group
/// of its own: the test command runs it beside everything else, which it must not slow, and
/// which leaves it the cores while it waits (the tests, the e2e and the explorer mostly wait on
/// timers; the compile steps on their last crates).
#[derive(Debug)]
pub struct BackgroundBuild {
    child: std::process::Child,
    log: PathBuf,
    started: std::time::Instant,
}

pub fn start_binaries_build(programs: &[&str]) -> Result<BackgroundBuild> {
    let log = target_dir().join("image-build.log");
    std::fs::create_dir_all(target_dir())?;
    let output = std::fs::File::create(&log)?;
    let build = binaries_build(programs);
    let child = Command::new("nice")
        .args(["-n", "19"])
        .arg(build.get_program())
        .args(build.get_args())
        .current_dir(project_root())
        .process_group(0)
        .stdout(output.try_clone()?)
        .stderr(output)
        .spawn()
        .context("could not start the images' build")?;
    println!(
        "==> {IMAGE_PROFILE}-profile build of {} started in the background (nice 19; log: {})",
        programs.join(", "),
        log.display()
    );
    Ok(BackgroundBuild {
        child,
        log,
        started: std::time::Instant::now(),
    })
}

impl BackgroundBuild {
    /// Waits for the build; its log is shown when it failed.
    pub fn wait(mut self) -> Result<()> {
        let status = self.child.wait()?;
        println!(
            "==> {IMAGE_PROFILE}-profile build finished {:.1} s after it started",
            self.started.elapsed().as_secs_f64()
        );
        if !status.success() {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            bail!("the images' build failed ({status}):\n{log}");
        }
        Ok(())
    }
}

/// A test command that stopped early does not leave the build running: cargo and every
/// compiler of its group.
impl Drop for BackgroundBuild {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let group = format!("-{}", self.child.id());
            let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
            let _ = self.child.wait();
        }
    }
}

/// Writes every image under `target/images/` and prints what it wrote.
pub fn build_all(programs: &[&str]) -> Result<Vec<Built>> {
    let out = target_dir().join("images");
    std::fs::create_dir_all(&out)?;
    let source = Source::of_head()?;
    let built = each_at_once(programs, |program| build(program, &source, &out))?;
    println!(
        "{:<50} {:>8} {:>8}  {:<11}  digest",
        "image", "binary", "layer", "user"
    );
    for image in &built {
        println!(
            "{:<50} {:>7.1}M {:>7.1}M  {:<11}  {}",
            image.reference,
            mebibytes(image.binary_bytes),
            mebibytes(image.layer_bytes),
            image.user,
            image.digest
        );
    }
    println!("written to {}", out.display());
    Ok(built)
}

fn mebibytes(bytes: u64) -> f64 {
    bytes as f64 / 1024.0 / 1024.0
}

/// The commit the images are labelled with; its time is every timestamp in them.
struct Source {
    revision: String,
    epoch: i64,
}

impl Source {
    fn of_head() -> Result<Self> {
        let revision = git(&["rev-parse", "HEAD"])?;
        // SOURCE_DATE_EPOCH is the reproducible-builds convention for "pretend it is then".
        let epoch = match std::env::var("SOURCE_DATE_EPOCH") {
            Ok(value) => value
                .parse()
                .context("SOURCE_DATE_EPOCH must be whole seconds since 1970")?,
            Err(_) => git(&["log", "-1", "--format=%ct", "HEAD"])?.parse()?,
        };
        Ok(Self { revision, epoch })
    }

    fn created(&self) -> Result<String> {
        Ok(jiff::Timestamp::from_second(self.epoch)?.to_string())
    }
}

fn git(args: &[&str]) -> Result<String> {
    let output = output_of(Command::new("git").args(args).current_dir(project_root()))
        .context("images are labelled with their commit: build them from a git checkout")?;
    Ok(output.trim().to_owned())
}

/// What the chart says about the program: where its image lives and which version it expects.
struct ChartFacts {
    repository: String,
    app_version: String,
    description: String,
}

fn chart_facts(program: &str) -> Result<ChartFacts> {
    let chart_dir = project_root().join("charts").join(program);
    let read = |file: &str| -> Result<Value> {
        let path = chart_dir.join(file);
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("could not read {}", path.display()))?;
        serde_yaml_ng::from_str(&text).with_context(|| format!("{} is not YAML", path.display()))
    };
    let chart = read("Chart.yaml")?;
    let values = read("values.yaml")?;
    let text = |value: &Value, what: &str| -> Result<String> {
        value
            .as_str()
            .map(str::to_owned)
            .with_context(|| format!("charts/{program}: {what} must be a string"))
    };
    Ok(ChartFacts {
        repository: text(
            &values["image"]["repository"],
            "values.yaml image.repository",
        )?,
        app_version: text(&chart["appVersion"], "Chart.yaml appVersion")?,
        description: text(&chart["description"], "Chart.yaml description")?,
    })
}

fn build(program: &str, source: &Source, out: &Path) -> Result<Built> {
    let binary = image_target_dir().join(IMAGE_PROFILE).join(program);
    let binary_bytes = std::fs::metadata(&binary)
        .with_context(|| {
            format!(
                "no image-profile binary at {}: run `cargo xtask image` without --no-build",
                binary.display()
            )
        })?
        .len();
    let chart = chart_facts(program)?;
    let reference = format!("{}:{}", chart.repository, chart.app_version);
    let user = if ROOT_PROGRAMS.contains(&program) {
        "0:0"
    } else {
        NONROOT
    };
    let files = root_filesystem(program, &binary)?;
    let layer_tar = tar_of(&files, source.epoch)?;
    let diff_id = sha256(&layer_tar);
    let layer = gzip(&layer_tar)?;
    let layer_bytes = layer.len() as u64;

    let created = source.created()?;
    let labels = json!({
        "org.opencontainers.image.title": program,
        "org.opencontainers.image.description": chart.description,
        "org.opencontainers.image.version": chart.app_version,
        "org.opencontainers.image.revision": source.revision,
        "org.opencontainers.image.created": created,
        "org.opencontainers.image.source": env!("CARGO_PKG_REPOSITORY"),
        "org.opencontainers.image.url": env!("CARGO_PKG_REPOSITORY"),
        "org.opencontainers.image.documentation":
            format!("{}/blob/main/docs/{program}.md", env!("CARGO_PKG_REPOSITORY")),
        "org.opencontainers.image.licenses": env!("CARGO_PKG_LICENSE"),
        "org.opencontainers.image.vendor": "nodegrace",
    });
    let config = serde_json::to_vec(&json!({
        "created": created,
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "User": user,
            "Entrypoint": [format!("/{BINARY_DIR}/{program}")],
            "Env": [
                format!("PATH=/{BINARY_DIR}"),
                format!("SSL_CERT_FILE={CA_BUNDLE}"),
            ],
            "WorkingDir": "/",
            "Labels": labels,
        },
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created": created, "created_by": "cargo xtask image"}],
    }))?;
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": descriptor("application/vnd.oci.image.config.v1+json", &config),
        "layers": [descriptor("application/vnd.oci.image.layer.v1.tar+gzip", &layer)],
        "annotations": labels,
    }))?;
    let digest = sha256(&manifest);
    let mut manifest_descriptor =
        descriptor("application/vnd.oci.image.manifest.v1+json", &manifest);
    // containerd (`kind load`, `ctr import`) names the image from the first annotation, Docker
    // and skopeo from the second; `docker save` writes both the same way.
    manifest_descriptor["annotations"] = json!({
        "io.containerd.image.name": reference,
        "org.opencontainers.image.ref.name": chart.app_version,
    });
    let index = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [manifest_descriptor],
    }))?;
    let docker_manifest = serde_json::to_vec(&json!([{
        "Config": blob_path(&config),
        "RepoTags": [reference],
        "Layers": [blob_path(&layer)],
    }]))?;

    let mut archive_files = vec![
        File::regular("oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#.to_vec()),
        File::regular("index.json", index),
        File::regular("manifest.json", docker_manifest),
    ];
    for blob in [config, manifest, layer] {
        archive_files.push(File::regular(&blob_path(&blob), blob));
    }
    let archive = out.join(format!("{program}.tar"));
    std::fs::write(&archive, tar_of(&archive_files, source.epoch)?)
        .with_context(|| format!("could not write {}", archive.display()))?;
    Ok(Built {
        program: program.to_owned(),
        reference,
        archive,
        digest,
        binary_bytes,
        layer_bytes,
        user,
    })
}

fn sha256(bytes: &[u8]) -> String {
    let mut hex = String::with_capacity(64);
    for byte in digest(&SHA256, bytes).as_ref() {
        write!(hex, "{byte:02x}").expect("writing to a String cannot fail");
    }
    format!("sha256:{hex}")
}

fn blob_path(blob: &[u8]) -> String {
    sha256(blob).replacen("sha256:", "blobs/sha256/", 1)
}

fn descriptor(media_type: &str, blob: &[u8]) -> Value {
    json!({"mediaType": media_type, "digest": sha256(blob), "size": blob.len()})
}

/// A file of the image, by its path inside it (no leading `/`).
struct File {
    path: String,
    mode: u32,
    contents: Vec<u8>,
}

impl File {
    fn regular(path: &str, contents: Vec<u8>) -> Self {
        Self {
            path: path.to_owned(),
            mode: 0o644,
            contents,
        }
    }

    fn executable(path: &str, contents: Vec<u8>) -> Self {
        Self {
            path: path.to_owned(),
            mode: 0o755,
            contents,
        }
    }
}

fn root_filesystem(program: &str, binary: &Path) -> Result<Vec<File>> {
    let read = |path: &Path| {
        std::fs::read(path).with_context(|| format!("could not read {}", path.display()))
    };
    let mut files = vec![
        File::executable(&format!("{BINARY_DIR}/{program}"), read(binary)?),
        File::regular(
            "etc/passwd",
            b"root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"
                .to_vec(),
        ),
        File::regular("etc/group", b"root:x:0:\nnonroot:x:65532:\n".to_vec()),
        // glibc's default without this file asks DNS before /etc/hosts.
        File::regular("etc/nsswitch.conf", b"hosts: files dns\n".to_vec()),
    ];
    let ca_bundle = Path::new(CA_BUNDLE);
    if !ca_bundle.exists() {
        setup::install_packages(&["ca-certificates"])?;
    }
    files.push(File::regular(
        CA_BUNDLE.trim_start_matches('/'),
        read(ca_bundle)?,
    ));
    for library in shared_libraries(binary)? {
        let inside = library.to_string_lossy().trim_start_matches('/').to_owned();
        files.push(File::executable(&inside, read(&library)?));
    }
    Ok(files)
}

/// The libraries the dynamic loader resolves for the binary, the loader itself included, at the
/// paths it resolves them to: copied as they are, they are exactly what the binary was tested
/// with.
fn shared_libraries(binary: &Path) -> Result<Vec<PathBuf>> {
    let listing = output_of(Command::new("ldd").arg(binary))
        .context("ldd (Debian's libc-bin) lists the libraries the image needs")?;
    let mut libraries = Vec::new();
    for line in listing.lines() {
        // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x…)", "/lib64/ld-linux-x86-64.so.2 (0x…)",
        // and the kernel's vDSO, which has no file.
        let resolved = line.split_once("=>").map_or(line, |(_, path)| path);
        let Some(path) = resolved.split_whitespace().next() else {
            continue;
        };
        if path == "not" {
            bail!("{}: a shared library is missing: {line}", binary.display());
        }
        if path.starts_with('/') {
            libraries.push(PathBuf::from(path));
        }
    }
    Ok(libraries)
}

/// A tar stream whose bytes depend only on the files: sorted, parents first, owned by 0:0,
/// every time `epoch`.
fn tar_of(files: &[File], epoch: i64) -> Result<Vec<u8>> {
    let mut directories = std::collections::BTreeSet::new();
    for file in files {
        let mut parent = Path::new(&file.path).parent();
        while let Some(dir) = parent.filter(|dir| !dir.as_os_str().is_empty()) {
            directories.insert(format!("{}/", dir.display()));
            parent = dir.parent();
        }
    }
    let mut entries: BTreeMap<String, Option<&File>> =
        directories.into_iter().map(|dir| (dir, None)).collect();
    for file in files {
        entries.insert(file.path.clone(), Some(file));
    }
    let mut builder = tar::Builder::new(Vec::new());
    for (path, file) in entries {
        let mut header = tar::Header::new_ustar();
        header.set_mtime(u64::try_from(epoch).context("the commit time is before 1970")?);
        header.set_uid(0);
        header.set_gid(0);
        match file {
            None => {
                header.set_entry_type(tar::EntryType::Directory);
                header.set_mode(0o755);
                header.set_size(0);
                builder.append_data(&mut header, &path, std::io::empty())?;
            }
            Some(file) => {
                header.set_entry_type(tar::EntryType::Regular);
                header.set_mode(file.mode);
                header.set_size(file.contents.len() as u64);
                builder.append_data(&mut header, &path, file.contents.as_slice())?;
            }
        }
    }
    Ok(builder.into_inner()?)
}

fn gzip(bytes: &[u8]) -> Result<Vec<u8>> {
    // No name, mtime 0: the compressed bytes depend on the input alone.
    let mut encoder = GzBuilder::new()
        .mtime(0)
        .write(Vec::new(), Compression::best());
    encoder.write_all(bytes)?;
    Ok(encoder.finish()?)
}

/// The checks the issue's "done when" asks for, against the images as an operator gets them.
pub fn check_all(built: &[Built]) -> Result<()> {
    setup::require_root(
        "checking the images runs each binary in a chroot of its unpacked image",
        "sudo -E env PATH=\"$PATH\" cargo xtask image --check",
    )?;
    setup::ensure_system_packages()?;
    let scratch = tempfile::tempdir()?;
    let source = Source::of_head()?;
    let checked = each_at_once(built, |image| check(image, &source, scratch.path()))?;
    for line in checked {
        println!("{line}");
    }
    Ok(())
}

/// `work` on every item at once, a thread each (packing an image is compressing and hashing
/// on one core); the answers in the items' order, or the first error in that order.
fn each_at_once<T: Sync, R: Send>(
    items: &[T],
    work: impl Fn(&T) -> Result<R> + Sync,
) -> Result<Vec<R>> {
    std::thread::scope(|scope| {
        let running: Vec<_> = items
            .iter()
            .map(|item| scope.spawn(|| work(item)))
            .collect();
        running
            .into_iter()
            .map(|thread| {
                thread
                    .join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("an image's thread panicked")))
            })
            .collect()
    })
}

/// One image built again and compared, its size budget, skopeo's reading and its `--version`
/// in a chroot: the line that says so.
fn check(image: &Built, source: &Source, scratch: &Path) -> Result<String> {
    let again = build(&image.program, source, scratch)?;
    if std::fs::read(&again.archive)? != std::fs::read(&image.archive)? {
        bail!(
            "{}: a second build of the image differs from the first: the image is not reproducible",
            image.program
        );
    }
    if image.binary_bytes > MAX_BINARY_BYTES {
        bail!(
            "{}: the binary is {:.1} MiB, over the 15 MiB budget",
            image.program,
            mebibytes(image.binary_bytes)
        );
    }
    check_with_skopeo(image, scratch)?;
    let version = run_in_chroot(image, &scratch.join(&image.program))?;
    Ok(format!(
        "ok {}: rebuilt identically, binary {:.1} MiB, skopeo verified {}, `--version` in a chroot of its layers as {}: {version}",
        image.program,
        mebibytes(image.binary_bytes),
        image.digest,
        image.user
    ))
}

/// skopeo, an independent reader, copies the archive into a layout of its own: it checks
/// every blob against its digest on the way, and names the manifest we computed.
fn check_with_skopeo(image: &Built, scratch: &Path) -> Result<()> {
    let archive = format!("oci-archive:{}", image.archive.display());
    let output = Command::new("skopeo")
        .args(["inspect", "--raw", &archive])
        .output()
        .context("could not run skopeo")?;
    if !output.status.success() {
        bail!(
            "skopeo cannot read {}: {}",
            image.archive.display(),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    if sha256(&output.stdout) != image.digest {
        bail!(
            "{}: skopeo reads another manifest than we wrote",
            image.program
        );
    }
    let copy = scratch.join(format!("{}-skopeo", image.program));
    run_command(Command::new("skopeo").args([
        "copy",
        "--quiet",
        &archive,
        &format!("oci:{}:copy", copy.display()),
    ]))
}

/// Unpacks the image's layers with GNU tar (not our reader) and runs the binary in a chroot of
/// them as the image's user, with the image's environment only.
fn run_in_chroot(image: &Built, root: &Path) -> Result<String> {
    let unpacked = root.with_extension("archive");
    std::fs::create_dir_all(&unpacked)?;
    std::fs::create_dir_all(root)?;
    run_command(
        Command::new("tar")
            .arg("-xf")
            .arg(&image.archive)
            .arg("-C")
            .arg(&unpacked),
    )?;
    let blob = |digest: &str| unpacked.join(digest.replacen("sha256:", "blobs/sha256/", 1));
    let index: Value = serde_json::from_slice(&std::fs::read(unpacked.join("index.json"))?)?;
    let manifest_digest = index["manifests"][0]["digest"].as_str().unwrap_or_default();
    let manifest: Value = serde_json::from_slice(&std::fs::read(blob(manifest_digest))?)?;
    let config_digest = manifest["config"]["digest"].as_str().unwrap_or_default();
    let config: Value = serde_json::from_slice(&std::fs::read(blob(config_digest))?)?;
    for layer in manifest["layers"].as_array().into_iter().flatten() {
        let digest = layer["digest"].as_str().unwrap_or_default();
        run_command(
            Command::new("tar")
                .arg("-xzf")
                .arg(blob(digest))
                .arg("-C")
                .arg(root),
        )?;
    }
    for shell in ["bin/sh", "usr/bin/sh", "bin/bash"] {
        if root.join(shell).exists() {
            bail!("{}: the image has a shell at /{shell}", image.program);
        }
    }
    let entrypoint = config["config"]["Entrypoint"][0]
        .as_str()
        .unwrap_or_default();
    let user = config["config"]["User"].as_str().unwrap_or_default();
    let env: Vec<&str> = config["config"]["Env"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    // Looked up here: with the environment replaced, the child's PATH would be the image's.
    let chroot = std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|dir| dir.join("chroot"))
        .find(|path| path.is_file())
        .context("chroot (coreutils) is not on PATH")?;
    let output = Command::new(chroot)
        .arg(format!("--userspec={user}"))
        .arg(root)
        .arg(entrypoint)
        .arg("--version")
        .env_clear()
        .envs(env.iter().filter_map(|pair| pair.split_once('=')))
        .output()
        .context("could not run chroot")?;
    let version = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    if !output.status.success() || !version.starts_with(&image.program) {
        bail!(
            "{}: `{entrypoint} --version` in a chroot of the unpacked image failed ({}): {version} {}",
            image.program,
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(version)
}
