//! The durable record of the last shutdown: when it started and ended, and in which boot.
//!
//! It survives the agent crashing mid-shutdown (same boot: the shutdown is resumed, never
//! undone) and the reboot itself (new boot: stale node markings are cleared, and the times are
//! published as metrics, as the kubelet does).

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use nodegrace_core::error_chain::Chain;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ShutdownRecord {
    /// The boot this record was written in (`/proc/sys/kernel/random/boot_id`).
    pub boot_id: String,
    pub started_at: Option<Timestamp>,
    pub ended_at: Option<Timestamp>,
    pub cancelled_at: Option<Timestamp>,
}

impl ShutdownRecord {
    /// A shutdown began in `boot_id` and has neither finished nor been cancelled.
    pub fn in_progress_in(&self, boot_id: &str) -> bool {
        self.boot_id == boot_id
            && self.started_at.is_some()
            && self.ended_at.is_none()
            && self.cancelled_at.is_none()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("cannot {action} the shutdown state file {path}: {source} (check --state-dir)")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Where the record lives. Writes go through a temporary file and a rename so a crash never
/// leaves half a record.
#[derive(Debug, Clone)]
pub struct StateFile {
    path: PathBuf,
}

impl StateFile {
    pub fn new(dir: &Path) -> Self {
        Self {
            path: dir.join("graceful-shutdown-agent.json"),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The stored record; a missing or unreadable one counts as empty, since the worst outcome
    /// is not knowing about a previous shutdown.
    pub fn load(&self) -> ShutdownRecord {
        match fs::read(&self.path) {
            Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_else(|error| {
                tracing::warn!(path = %self.path.display(), error = %Chain(&error), "ignoring a corrupt shutdown state file");
                ShutdownRecord::default()
            }),
            Err(_) => ShutdownRecord::default(),
        }
    }

    pub fn store(&self, record: &ShutdownRecord) -> Result<(), StateError> {
        let io = |action| {
            let path = self.path.clone();
            move |source| StateError::Io {
                action,
                path,
                source,
            }
        };
        let dir = self.path.parent().unwrap_or_else(|| Path::new("."));
        fs::create_dir_all(dir).map_err(io("create the directory of"))?;
        let temporary = self.path.with_extension("json.tmp");
        let bytes = serde_json::to_vec_pretty(record).map_err(|e| io("encode")(e.into()))?;
        let mut file = fs::File::create(&temporary).map_err(io("write"))?;
        file.write_all(&bytes).map_err(io("write"))?;
        file.sync_all().map_err(io("sync"))?;
        fs::rename(&temporary, &self.path).map_err(io("replace"))
    }
}

/// The current boot's identity; a missing file (not Linux, or a test) yields an empty id.
pub fn read_boot_id(path: &Path) -> String {
    fs::read_to_string(path)
        .map(|id| id.trim().to_owned())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_never_leaves_a_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateFile::new(dir.path());
        assert_eq!(state.load(), ShutdownRecord::default());
        let record = ShutdownRecord {
            boot_id: "boot-a".to_owned(),
            started_at: Some(Timestamp::from_second(1_700_000_000).unwrap()),
            ..ShutdownRecord::default()
        };
        state.store(&record).unwrap();
        assert_eq!(state.load(), record);
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn in_progress_only_within_the_same_boot_and_unfinished() {
        let started = ShutdownRecord {
            boot_id: "boot-a".to_owned(),
            started_at: Some(Timestamp::UNIX_EPOCH),
            ..ShutdownRecord::default()
        };
        assert!(started.in_progress_in("boot-a"));
        assert!(!started.in_progress_in("boot-b"));
        let ended = ShutdownRecord {
            ended_at: Some(Timestamp::UNIX_EPOCH),
            ..started.clone()
        };
        assert!(!ended.in_progress_in("boot-a"));
        let cancelled = ShutdownRecord {
            cancelled_at: Some(Timestamp::UNIX_EPOCH),
            ..started
        };
        assert!(!cancelled.in_progress_in("boot-a"));
    }

    #[test]
    fn corrupt_file_reads_as_empty() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateFile::new(dir.path());
        fs::write(state.path(), b"{not json").unwrap();
        assert_eq!(state.load(), ShutdownRecord::default());
    }

    #[test]
    fn boot_id_is_trimmed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("boot_id");
        fs::write(&path, "abc-123\n").unwrap();
        assert_eq!(read_boot_id(&path), "abc-123");
        assert_eq!(read_boot_id(&dir.path().join("missing")), "");
    }
}
