//! `kube-sim run-container SPEC`: the step between the kubelet and a container's program. In a
//! mount namespace of its own it mounts the container's volumes at their mount paths, then
//! becomes the program (exec), so the process sees its ConfigMaps, Secrets, token and
//! hostPaths where its pod spec says, and the host sees none of it.
//!
//! Mount points are never created on the host's filesystem: when a mount path does not exist,
//! its deepest existing ancestor is shadowed by a tmpfs that holds the ancestor's entries bound
//! back in place plus the new mount point.

use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Component, Path, PathBuf};

use nix::mount::{MsFlags, mount};
use nix::sched::{CloneFlags, unshare};

use crate::world::launch::{Launch, Mount};

/// Sets up the container's mounts and execs its program; returns only on failure.
/// `simulator_pid`: the kube-sim process that started this one.
pub fn run(spec: &Path, simulator_pid: Option<u32>) -> String {
    match prepare_and_exec(spec, simulator_pid) {
        Ok(never) => match never {},
        Err(error) => error,
    }
}

fn prepare_and_exec(
    spec: &Path,
    simulator_pid: Option<u32>,
) -> Result<std::convert::Infallible, String> {
    let text = std::fs::read_to_string(spec)
        .map_err(|e| format!("cannot read the container spec {}: {e}", spec.display()))?;
    let launch: Launch =
        serde_json::from_str(&text).map_err(|e| format!("the container spec is invalid: {e}"))?;
    let stash = spec.with_extension("stash");
    // The container dies with the simulator, as with a machine, even when kube-sim is killed.
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
        .map_err(|e| format!("cannot tie the container to kube-sim's life: {e}"))?;
    // The death signal only covers a parent that ends after it was asked for: one that ended
    // between the fork and now left this process to another parent, and nothing would ever
    // stop the program (a run torn down while its pods were starting left them behind).
    if let Some(pid) = simulator_pid
        && std::os::unix::process::parent_id() != pid
    {
        return Err(format!(
            "kube-sim (pid {pid}) ended before the container started; not starting it"
        ));
    }
    if !launch.mounts.is_empty() {
        unshare(CloneFlags::CLONE_NEWNS).map_err(|e| {
            format!(
                "cannot make a mount namespace (kube-sim runs containers with volumes as root): {e}"
            )
        })?;
        mount::<str, str, str, str>(None, "/", None, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None)
            .map_err(|e| format!("cannot make the mounts private: {e}"))?;
        let mut mounts = launch.mounts.clone();
        mounts.sort_by_key(|m| Path::new(&m.target).components().count());
        let mut shadows = Shadows {
            stash,
            count: 0,
            new_root: false,
        };
        for volume in &mounts {
            mount_volume(volume, &mut shadows)?;
        }
    }
    let error = launch.command().exec();
    Err(format!(
        "cannot start {}: {error}",
        launch.program.display()
    ))
}

/// Where shadowed directories' entries are reached from, and what was shadowed so far.
struct Shadows {
    stash: PathBuf,
    count: usize,
    /// Whether `/` is already a tmpfs of our own (chrooted into), where anything may be made.
    new_root: bool,
}

impl Shadows {
    fn next(&mut self) -> PathBuf {
        self.count += 1;
        self.stash.join(self.count.to_string())
    }
}

fn mount_volume(volume: &Mount, shadows: &mut Shadows) -> Result<(), String> {
    let source = &volume.source;
    let target = Path::new(&volume.target);
    if !target.is_absolute() {
        return Err(format!("mountPath {} must be absolute", volume.target));
    }
    let directory = source.is_dir();
    make_mount_point(target, directory, shadows)?;
    bind(source, target).map_err(|e| {
        format!(
            "cannot mount {} at {}: {e}",
            source.display(),
            volume.target
        )
    })?;
    if volume.read_only {
        mount::<str, Path, str, str>(
            None,
            target,
            None,
            MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | MsFlags::MS_REC,
            None,
        )
        .map_err(|e| format!("cannot make {} read-only: {e}", volume.target))?;
    }
    Ok(())
}

fn bind(source: &Path, target: &Path) -> nix::Result<()> {
    mount::<Path, Path, str, str>(
        Some(source),
        target,
        None,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        None,
    )
}

/// Makes `target` exist (a directory, or a file for a file or socket volume) without writing
/// to the host's filesystem.
fn make_mount_point(target: &Path, directory: bool, shadows: &mut Shadows) -> Result<(), String> {
    if let Ok(metadata) = std::fs::metadata(target) {
        return if metadata.is_dir() == directory {
            Ok(())
        } else {
            Err(format!(
                "mountPath {} exists as a {} but the volume is a {}",
                target.display(),
                kind(metadata.is_dir()),
                kind(directory)
            ))
        };
    }
    let (existing, missing) = split_existing(target);
    let room = |e: std::io::Error| {
        format!(
            "cannot make room for {} in {}: {e}",
            target.display(),
            existing.display()
        )
    };
    if existing == Path::new("/") {
        if !shadows.new_root {
            let stash = shadows.next();
            new_root(&stash).map_err(room)?;
            shadows.new_root = true;
        }
    } else {
        let stash = shadows.next();
        shadow(&existing, &stash).map_err(room)?;
    }
    let full = missing
        .iter()
        .fold(existing.clone(), |path, part| path.join(part));
    let parent = full.parent().unwrap_or(Path::new("/"));
    std::fs::create_dir_all(parent)
        .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
    if directory {
        std::fs::create_dir(&full)
    } else {
        std::fs::File::create(&full).map(drop)
    }
    .map_err(|e| format!("cannot create {}: {e}", full.display()))
}

fn kind(directory: bool) -> &'static str {
    if directory { "directory" } else { "file" }
}

/// The deepest existing ancestor of `path` (symlinks resolved) and the components below it.
fn split_existing(path: &Path) -> (PathBuf, Vec<std::ffi::OsString>) {
    let mut missing = Vec::new();
    let mut current = path.to_path_buf();
    loop {
        if let Ok(real) = std::fs::canonicalize(&current) {
            missing.reverse();
            return (real, missing);
        }
        match current.components().next_back() {
            Some(Component::Normal(name)) => missing.push(name.to_owned()),
            _ => return (PathBuf::from("/"), Vec::new()),
        }
        current.pop();
    }
}

/// Covers `dir` with a tmpfs holding what `dir` held: each entry bound back (directories with
/// their submounts), symlinks recreated. The stash may lie below `dir`, so its entries are
/// reached through a descriptor opened before the tmpfs covers it.
fn shadow(dir: &Path, stash: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(stash)?;
    bind(dir, stash)?;
    let handle = std::fs::File::open(stash)?;
    let held = PathBuf::from(format!("/proc/self/fd/{}", handle.as_raw_fd()));
    mount::<str, Path, str, str>(
        Some("tmpfs"),
        dir,
        Some("tmpfs"),
        MsFlags::empty(),
        Some("mode=755"),
    )?;
    bind_entries(&held, dir)
}

/// A tmpfs root holding every entry of `/` bound in, chrooted into: a mount point may then
/// be made at the top level.
fn new_root(stash: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(stash)?;
    mount::<str, Path, str, str>(
        Some("tmpfs"),
        stash,
        Some("tmpfs"),
        MsFlags::empty(),
        Some("mode=755"),
    )?;
    bind_entries(Path::new("/"), stash)?;
    nix::unistd::chroot(stash)?;
    std::env::set_current_dir("/")
}

fn bind_entries(from: &Path, to: &Path) -> std::io::Result<()> {
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let original = from.join(entry.file_name());
        let placeholder = to.join(entry.file_name());
        let file_type = entry.file_type()?;
        if file_type.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(&original)?, &placeholder)?;
            continue;
        }
        if file_type.is_dir() {
            std::fs::create_dir(&placeholder)?;
        } else {
            std::fs::File::create(&placeholder)?;
        }
        bind(&original, &placeholder)?;
    }
    Ok(())
}
