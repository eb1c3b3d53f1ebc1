//! What the node agents say about a node's shutdown and others read (`kubectl nodegrace`):
//! the conditions they write, and when a Lease holds the shutdown (KEP "block shutdown under
//! leases"), one rule read the same by the inhibitor agent and by those who show it.

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;

/// graceful-shutdown-agent's condition (KEP-5683's name): True while the node's pods are
/// terminated for a shutdown.
pub const SHUTDOWN_IN_PROGRESS_CONDITION: &str = "GracefulNodeShutdownInProgress";
/// shutdown-inhibitor-agent's condition: True while Leases hold the node's shutdown.
pub const SHUTDOWN_INHIBITED_CONDITION: &str = "ShutdownInhibited";

/// What one Lease says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Activity {
    /// No holder: does not block.
    Free,
    /// A holder but no acquireTime: an incomplete acquisition that does not block (and is
    /// reported, since the holder probably believes it blocks).
    Incomplete {
        holder: String,
    },
    Active {
        holder: String,
        acquired: Timestamp,
    },
}

pub fn activity(lease: &Lease) -> Activity {
    let spec = lease.spec.as_ref();
    let holder = spec
        .and_then(|s| s.holder_identity.clone())
        .unwrap_or_default();
    if holder.is_empty() {
        return Activity::Free;
    }
    match spec.and_then(|s| s.acquire_time.as_ref()) {
        Some(acquired) => Activity::Active {
            holder,
            acquired: acquired.0,
        },
        None => Activity::Incomplete { holder },
    }
}
