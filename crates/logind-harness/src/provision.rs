//! Getting elogind onto the machine without installing it: installing the Debian package would
//! remove systemd, so we download the .debs and unpack them under `target/`, once per checkout.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::HarnessError;

/// Packages whose files make up a runnable elogind.
const PACKAGES: &[&str] = &["elogind", "libelogind0"];

/// An unpacked elogind: the daemon and the library path it needs.
#[derive(Debug, Clone)]
pub struct Elogind {
    root: PathBuf,
}

impl Elogind {
    pub fn daemon(&self) -> PathBuf {
        self.root.join("lib/elogind/elogind")
    }

    /// The unpacked libraries are not on the loader's default path.
    pub fn library_path(&self) -> String {
        format!(
            "{}:{}",
            self.root.join("lib/elogind").display(),
            self.root.join("lib/x86_64-linux-gnu").display()
        )
    }
}

/// Returns the unpacked elogind under `cache_dir`, downloading and unpacking it first if needed.
/// Safe to call from many test processes at once: a file lock serialises the unpacking.
pub fn provision(cache_dir: &Path) -> Result<Elogind, HarnessError> {
    let root = cache_dir.join("root");
    let elogind = Elogind { root: root.clone() };
    if elogind.daemon().exists() {
        return Ok(elogind);
    }
    fs::create_dir_all(cache_dir).map_err(HarnessError::io("create the elogind cache"))?;
    let lock = fs::File::create(cache_dir.join(".lock"))
        .map_err(HarnessError::io("create the provisioning lock"))?;
    lock.lock()
        .map_err(HarnessError::io("take the provisioning lock"))?;
    // Another process may have finished while we waited for the lock.
    if elogind.daemon().exists() {
        return Ok(elogind);
    }
    let work = cache_dir.join(format!("partial-{}", std::process::id()));
    let _ = fs::remove_dir_all(&work);
    let downloads = work.join("debs");
    let unpacked = work.join("root");
    fs::create_dir_all(&downloads).map_err(HarnessError::io("create the download directory"))?;
    download(&downloads)?;
    for entry in fs::read_dir(&downloads).map_err(HarnessError::io("list the downloads"))? {
        let deb = entry
            .map_err(HarnessError::io("list the downloads"))?
            .path();
        run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&unpacked))?;
    }
    if !unpacked.join("lib/elogind/elogind").exists() {
        return Err(HarnessError::Provision(format!(
            "the unpacked packages hold no lib/elogind/elogind (looked in {})",
            unpacked.display()
        )));
    }
    fs::rename(&unpacked, &root).map_err(HarnessError::io("move the unpacked elogind in place"))?;
    let _ = fs::remove_dir_all(&work);
    Ok(elogind)
}

fn download(into: &Path) -> Result<(), HarnessError> {
    let fetch = || {
        Command::new("apt-get")
            .arg("download")
            .args(PACKAGES)
            .current_dir(into)
            .output()
    };
    let first = fetch().map_err(HarnessError::io("run apt-get download"))?;
    if first.status.success() {
        return Ok(());
    }
    // A fresh machine has empty package lists; one update makes the download possible.
    run(Command::new("apt-get").args(["update", "-qq"]))?;
    let second = fetch().map_err(HarnessError::io("run apt-get download"))?;
    if second.status.success() {
        Ok(())
    } else {
        Err(HarnessError::Provision(format!(
            "apt-get download {} failed: {}",
            PACKAGES.join(" "),
            String::from_utf8_lossy(&second.stderr).trim()
        )))
    }
}

fn run(command: &mut Command) -> Result<(), HarnessError> {
    let output = command
        .output()
        .map_err(HarnessError::io("run a provisioning command"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(HarnessError::Provision(format!(
            "{command:?} failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        )))
    }
}
