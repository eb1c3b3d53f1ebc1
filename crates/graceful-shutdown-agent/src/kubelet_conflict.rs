//! Watches for the kubelet's own graceful node shutdown on this machine (its delay lock, its
//! logind drop-in) and reports it: with both on, the kubelet and this agent would each
//! terminate the node's pods at shutdown, with their own periods. Checked at start and every
//! minute, since a kubelet restarted with a new configuration takes (or drops) its lock then.

use std::path::PathBuf;
use std::time::Duration;

use nodegrace_logind::{KubeletShutdownSign, SharedLogind, kubelet_shutdown_signs};
use tokio_util::sync::CancellationToken;

use crate::node_marks::NodeMarks;

const RECHECK: Duration = Duration::from_secs(60);

pub async fn watch(
    logind: SharedLogind,
    drop_in_dir: PathBuf,
    marks: NodeMarks,
    stop: CancellationToken,
) {
    let mut reported: Option<Vec<KubeletShutdownSign>> = None;
    let mut tick = tokio::time::interval(RECHECK);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        // logind away: nothing to conclude; the next tick looks again.
        let Ok(inhibitors) = logind.list_inhibitors().await else {
            continue;
        };
        let signs = kubelet_shutdown_signs(&inhibitors, Some(&drop_in_dir));
        if reported.as_ref() == Some(&signs) {
            continue;
        }
        if signs.is_empty() {
            marks.no_kubelet_conflict();
        } else {
            tracing::warn!(signs = ?signs, "the kubelet's graceful node shutdown is on too");
            marks.kubelet_conflict(&signs);
        }
        reported = Some(signs);
    }
}
