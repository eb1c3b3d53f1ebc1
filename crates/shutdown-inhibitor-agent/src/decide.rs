//! The inhibitor agent's decisions, without I/O: whether a block lock is needed and why, the
//! `ShutdownInhibited` condition for a set of holders, and the Event a change deserves.

use nodegrace_core::k8s::conditions::ConditionSpec;

use crate::leases::{Holder, describe};

pub use nodegrace_core::k8s::node_shutdown::SHUTDOWN_INHIBITED_CONDITION as CONDITION_TYPE;

/// What to do with the block lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LockAction {
    /// Take a lock with this reason (logind shows it in `systemd-inhibit --list`); the new
    /// one is held before an old one goes, so the block never lapses.
    Take { why: String },
    /// The lock held says what it should.
    Keep,
    /// No active Lease: release.
    Release,
    /// Shutdown has begun: Lease changes no longer matter (KEP), nothing changes.
    Frozen,
}

/// `held_why`: the reason of the lock held now, if any.
pub fn lock_action(holders: &[Holder], held_why: Option<&str>, shutting_down: bool) -> LockAction {
    if shutting_down {
        return LockAction::Frozen;
    }
    if holders.is_empty() {
        return match held_why {
            Some(_) => LockAction::Release,
            None => LockAction::Keep,
        };
    }
    let why = format!("Active Leases: {}", describe(holders));
    if held_why == Some(why.as_str()) {
        LockAction::Keep
    } else {
        LockAction::Take { why }
    }
}

/// What the condition adds where root's shutdown requests pass a block lock.
pub const ROOT_PASSES: &str = " (root can still shut down through this block: this node's \
    logind is older than systemd 257; see the BlockBypassableByRoot Event)";

/// The Event that says root's shutdown requests pass a block lock on this node.
pub fn root_passes_note() -> String {
    "This node's logind is older than systemd 257: a shutdown or reboot requested by root \
     (directly over D-Bus, with loginctl, or with systemctl without --check-inhibitors=yes) goes \
     through the block this agent holds. Make reboot tools check inhibitors: `systemctl \
     --check-inhibitors=yes reboot` (kured: --reboot-command=\"/usr/bin/systemctl \
     --check-inhibitors=yes reboot\"); with elogind no flag helps, and only non-root callers \
     are stopped."
        .to_owned()
}

/// The node condition for the active holders; `root_passes` when root's shutdown requests
/// go through the block on this node.
pub fn condition(holders: &[Holder], root_passes: bool) -> ConditionSpec {
    if holders.is_empty() {
        ConditionSpec::new(
            CONDITION_TYPE,
            "False",
            "NoActiveLeases",
            "No active Leases block shutdown.",
        )
    } else {
        let mut message = describe(holders);
        if root_passes {
            message.push_str(ROOT_PASSES);
        }
        ConditionSpec::new(CONDITION_TYPE, "True", "ActiveLeases", message)
    }
}

/// The Event for a change of the block, as `(reason, note)`; none when it did not change.
pub fn transition(
    was_blocked: bool,
    blocked: bool,
    holders: &[Holder],
) -> Option<(&'static str, String)> {
    match (was_blocked, blocked) {
        (false, true) => Some((
            "ShutdownBlocked",
            format!("Shutdown blocked by Leases: {}", describe(holders)),
        )),
        (true, false) => Some((
            "ShutdownUnblocked",
            "No active Lease blocks shutdown any more".to_owned(),
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holder(namespace: &str, name: &str) -> Holder {
        Holder {
            namespace: namespace.to_owned(),
            holder: name.to_owned(),
            acquired: "2026-01-01T00:00:00Z".parse().unwrap(),
        }
    }

    #[test]
    fn the_lock_follows_the_holders_unless_shutdown_began() {
        let backup = [holder("team-a", "backup")];
        let both = [holder("team-b", "etl"), holder("team-a", "backup")];
        let why_backup = "Active Leases: team-a/backup";
        let why_both = "Active Leases: team-a/backup, team-b/etl";
        let take = |why: &str| LockAction::Take {
            why: why.to_owned(),
        };
        let cases: [(&[Holder], Option<&str>, bool, LockAction); 8] = [
            (&[], None, false, LockAction::Keep),
            (&[], Some(why_backup), false, LockAction::Release),
            (&backup, None, false, take(why_backup)),
            (&backup, Some(why_backup), false, LockAction::Keep),
            (&both, Some(why_backup), false, take(why_both)),
            (&backup, Some(why_both), false, take(why_backup)),
            (&[], Some(why_backup), true, LockAction::Frozen),
            (&backup, None, true, LockAction::Frozen),
        ];
        for (holders, held, shutting_down, action) in cases {
            assert_eq!(
                lock_action(holders, held, shutting_down),
                action,
                "{holders:?} held {held:?} shutting down {shutting_down}"
            );
        }
    }

    #[test]
    fn the_condition_names_the_holders() {
        let blocked = condition(
            &[holder("team-b", "etl"), holder("team-a", "backup")],
            false,
        );
        assert_eq!(
            (
                blocked.status.as_str(),
                blocked.reason.as_str(),
                blocked.message.as_str()
            ),
            ("True", "ActiveLeases", "team-a/backup, team-b/etl")
        );
        let free = condition(&[], true);
        assert_eq!(
            (free.status.as_str(), free.reason.as_str()),
            ("False", "NoActiveLeases")
        );
        let passable = condition(&[holder("team-a", "backup")], true);
        assert_eq!(
            passable.message,
            format!("team-a/backup{ROOT_PASSES}"),
            "where root passes, the condition says so"
        );
    }

    #[test]
    fn only_a_change_of_the_block_is_an_event() {
        let holders = [holder("team-a", "backup")];
        assert_eq!(
            transition(false, true, &holders),
            Some((
                "ShutdownBlocked",
                "Shutdown blocked by Leases: team-a/backup".to_owned()
            ))
        );
        assert_eq!(
            transition(true, false, &[]).map(|(reason, _)| reason),
            Some("ShutdownUnblocked")
        );
        assert_eq!(transition(true, true, &holders), None);
        assert_eq!(transition(false, false, &[]), None);
    }
}
