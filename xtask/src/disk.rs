//! Room on disk for a run of `cargo xtask test`. A full disk otherwise shows up minutes in as
//! a compiler's "No space left on device" halfway through some crate, which says neither how
//! much is needed nor what to delete.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::{output_of, target_dir};

/// What a run writes under the target directory when it starts from nothing, with margin:
/// measured 9.5 GB on 2026-11-27 (the dev build of the tests and every binary 7.0, kube-rs's
/// peer tests 1.6, the images' build 0.9), plus the cargo registry and the Debian and npm
/// downloads.
const FRESH_RUN_NEEDS: u64 = 11 << 30;

/// Fails before anything is built when the filesystem of the target directory cannot hold
/// what the run still has to write: a fresh run's need, less what is already built there.
pub fn ensure_room_for_a_test_run() -> Result<()> {
    let target = target_dir();
    let built = bytes_under(&target)?;
    let available = available_bytes(&target)?;
    let needed = FRESH_RUN_NEEDS.saturating_sub(built);
    println!(
        "disk: {} free for {} ({} built there)",
        gib(available),
        target.display(),
        gib(built)
    );
    if available < needed {
        bail!(
            "not enough disk for the test run: it needs about {} more under {} (a run from an \
             empty target directory needs {}; {} is there already), but the filesystem has \
             only {} free. Free space (`cargo clean` removes old build output, whose \
             incremental caches grow without bound) or set CARGO_TARGET_DIR to a directory on \
             a larger disk.",
            gib(needed),
            target.display(),
            gib(FRESH_RUN_NEEDS),
            gib(built),
            gib(available)
        );
    }
    Ok(())
}

fn bytes_under(dir: &Path) -> Result<u64> {
    if !dir.exists() {
        return Ok(0);
    }
    let listing = output_of(Command::new("du").arg("-sb").arg(dir))?;
    first_number(&listing)
        .with_context(|| format!("`du -sb {}` printed {listing:?}", dir.display()))
}

fn available_bytes(target: &Path) -> Result<u64> {
    // The target directory may not exist yet; its filesystem is that of its nearest ancestor.
    let existing: PathBuf = target
        .ancestors()
        .find(|dir| dir.exists())
        .unwrap_or_else(|| Path::new("/"))
        .to_path_buf();
    let listing = output_of(
        Command::new("df")
            .args(["--output=avail", "--block-size=1"])
            .arg(&existing),
    )?;
    // The first line is df's header ("Avail").
    let figure = listing.lines().nth(1).unwrap_or_default();
    first_number(figure).with_context(|| {
        format!(
            "`df --output=avail {}` printed {listing:?}",
            existing.display()
        )
    })
}

fn first_number(text: &str) -> Option<u64> {
    text.split_whitespace().next()?.parse().ok()
}

#[allow(clippy::cast_precision_loss)]
fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / f64::from(1u32 << 30))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_are_read_from_du_and_df_output() {
        assert_eq!(
            first_number("6868156416\t/work/main/target\n"),
            Some(6_868_156_416)
        );
        assert_eq!(first_number("  78643200000"), Some(78_643_200_000));
        assert_eq!(first_number("Avail"), None);
        assert_eq!(first_number(""), None);
    }

    #[test]
    fn sizes_are_printed_in_gibibytes() {
        assert_eq!(gib(11 << 30), "11.0 GiB");
        assert_eq!(gib(754 << 20), "0.7 GiB");
    }
}
