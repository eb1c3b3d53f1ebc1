//! Inhibitor locks: the fd logind hands out, owned so that dropping it releases the lock.

use std::fmt;
use std::os::fd::{AsRawFd, OwnedFd};

/// How an inhibitor acts on the operations it names (see `man systemd-inhibit`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InhibitMode {
    /// Stops the operation until the lock is released (root may override).
    Block,
    /// Delays the operation until the lock is released or `InhibitDelayMaxSec` passes.
    Delay,
}

impl InhibitMode {
    /// The mode as logind spells it on the bus.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Block => "block",
            Self::Delay => "delay",
        }
    }
}

impl fmt::Display for InhibitMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A held inhibitor lock. logind keeps the lock while any process holds the fd open, so
/// dropping this value releases it.
pub struct InhibitorLock {
    fd: OwnedFd,
    what: String,
    mode: InhibitMode,
}

impl InhibitorLock {
    pub fn new(fd: OwnedFd, what: &str, mode: InhibitMode) -> Self {
        Self {
            fd,
            what: what.to_owned(),
            mode,
        }
    }
}

impl fmt::Debug for InhibitorLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InhibitorLock")
            .field("fd", &self.fd.as_raw_fd())
            .field("what", &self.what)
            .field("mode", &self.mode)
            .finish()
    }
}

/// An inhibitor as `ListInhibitors` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inhibitor {
    pub what: String,
    pub who: String,
    pub why: String,
    pub mode: String,
    pub uid: u32,
    pub pid: u32,
}

impl From<super::proxy::InhibitorRow> for Inhibitor {
    fn from((what, who, why, mode, uid, pid): super::proxy::InhibitorRow) -> Self {
        Self {
            what,
            who,
            why,
            mode,
            uid,
            pid,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::unix::net::UnixStream;

    #[test]
    fn modes_are_spelled_as_logind_expects() {
        assert_eq!(InhibitMode::Block.as_str(), "block");
        assert_eq!(InhibitMode::Delay.to_string(), "delay");
    }

    #[test]
    fn dropping_the_lock_closes_its_fd() {
        // logind notices the release through the fd closing; a socket pair shows the same thing:
        // the peer reads EOF once the lock is gone.
        let (ours, mut peer) = UnixStream::pair().unwrap();
        let lock = InhibitorLock::new(OwnedFd::from(ours), "shutdown", InhibitMode::Delay);
        drop(lock);
        let mut buf = Vec::new();
        assert_eq!(peer.read_to_end(&mut buf).unwrap(), 0);
    }

    #[test]
    fn listing_rows_map_field_by_field() {
        let row = (
            "shutdown".to_owned(),
            "who".to_owned(),
            "why".to_owned(),
            "block".to_owned(),
            0,
            42,
        );
        let inhibitor = Inhibitor::from(row);
        assert_eq!(inhibitor.mode, "block");
        assert_eq!(inhibitor.pid, 42);
        assert_eq!(inhibitor.who, "who");
    }
}
