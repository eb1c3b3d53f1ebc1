//! The kubelet's own graceful node shutdown, seen from the machine. With `shutdownGracePeriod`
//! set, the kubelet holds a logind delay inhibitor (who `kubelet`) and writes the drop-in
//! `99-kubelet.conf` to raise `InhibitDelayMaxSec` (pkg/kubelet/nodeshutdown/systemd). An agent
//! that also terminates the node's pods on shutdown would race it: both delete the same pods,
//! each with its own periods, and logind waits for the longer of the two locks.

use std::path::{Path, PathBuf};

use super::Inhibitor;

/// The `who` of the kubelet's inhibitor.
pub const KUBELET_WHO: &str = "kubelet";
/// The drop-in the kubelet writes into logind's configuration directory.
pub const KUBELET_DROP_IN: &str = "99-kubelet.conf";

/// One sign that the kubelet's graceful shutdown is on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KubeletShutdownSign {
    /// The kubelet's delay lock on shutdown, as `ListInhibitors` shows it.
    DelayLock { pid: u32 },
    /// Its drop-in in logind's configuration directory.
    DropIn(PathBuf),
}

impl std::fmt::Display for KubeletShutdownSign {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::DelayLock { pid } => {
                write!(f, "the kubelet holds a delay lock on shutdown (pid {pid})")
            }
            Self::DropIn(path) => {
                write!(f, "the kubelet's logind drop-in {} exists", path.display())
            }
        }
    }
}

/// The signs among logind's `inhibitors` and the files of `drop_in_dir` (when the agent can
/// see logind's configuration directory).
pub fn kubelet_shutdown_signs(
    inhibitors: &[Inhibitor],
    drop_in_dir: Option<&Path>,
) -> Vec<KubeletShutdownSign> {
    let mut signs: Vec<KubeletShutdownSign> = inhibitors
        .iter()
        .filter(|lock| {
            lock.who == KUBELET_WHO
                && lock.mode == "delay"
                && lock.what.split(':').any(|what| what == "shutdown")
        })
        .map(|lock| KubeletShutdownSign::DelayLock { pid: lock.pid })
        .collect();
    if let Some(file) = drop_in_dir
        .map(|dir| dir.join(KUBELET_DROP_IN))
        .filter(|file| file.is_file())
    {
        signs.push(KubeletShutdownSign::DropIn(file));
    }
    signs
}

/// One sentence for a condition or Event: what was seen and what to change.
pub fn describe_conflict(signs: &[KubeletShutdownSign]) -> String {
    let seen: Vec<String> = signs.iter().map(ToString::to_string).collect();
    format!(
        "The kubelet's graceful node shutdown is on ({}): it and this agent would both terminate \
         the node's pods at shutdown. Set shutdownGracePeriod and shutdownGracePeriodCriticalPods \
         to 0 in the kubelet's configuration.",
        seen.join("; ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lock(what: &str, who: &str, mode: &str) -> Inhibitor {
        Inhibitor {
            what: what.to_owned(),
            who: who.to_owned(),
            why: "Kubelet needs time to handle node shutdown".to_owned(),
            mode: mode.to_owned(),
            uid: 0,
            pid: 42,
        }
    }

    #[test]
    fn the_kubelets_delay_lock_on_shutdown_and_its_drop_in_are_signs_and_nothing_else() {
        let locks = [
            lock("shutdown", "kubelet", "delay"),
            lock("shutdown:sleep", "kubelet", "delay"),
            lock("sleep", "kubelet", "delay"),
            lock("shutdown", "kubelet", "block"),
            lock("shutdown", "NetworkManager", "delay"),
        ];
        assert_eq!(
            kubelet_shutdown_signs(&locks, None),
            [
                KubeletShutdownSign::DelayLock { pid: 42 },
                KubeletShutdownSign::DelayLock { pid: 42 }
            ]
        );
        let dir = tempfile::tempdir().unwrap();
        assert!(kubelet_shutdown_signs(&[], Some(dir.path())).is_empty());
        std::fs::write(
            dir.path().join(KUBELET_DROP_IN),
            "[Login]\nInhibitDelayMaxSec=30\n",
        )
        .unwrap();
        let signs = kubelet_shutdown_signs(&[], Some(dir.path()));
        assert_eq!(
            signs,
            [KubeletShutdownSign::DropIn(
                dir.path().join(KUBELET_DROP_IN)
            )]
        );
        assert!(describe_conflict(&signs).contains("99-kubelet.conf exists"));
    }
}
