//! The demo's story, one act per module. An act plays something an operator cares about and
//! checks its outcome from the API and logind (never from logs); it fails with a message that
//! says what did not happen. Adding an act is one module and one line in [`ALL`].

mod eviction_request;
mod leader_failover;
mod lease_blocks_shutdown;
pub(crate) mod node_termination;
pub(crate) mod out_of_service;
mod priority_shutdown;
mod uninstall;

use anyhow::Result;
use futures::future::LocalBoxFuture;

use crate::stage::Stage;

#[derive(Debug, Clone, Copy)]
pub struct Act {
    /// For `--act`.
    pub slug: &'static str,
    pub title: &'static str,
    pub play: for<'a> fn(&'a mut Stage) -> LocalBoxFuture<'a, Result<()>>,
}

/// The story, in playing order: later acts may build on what earlier ones left (node-1 is off
/// after the shutdown act).
pub const ALL: &[Act] = &[
    lease_blocks_shutdown::ACT,
    priority_shutdown::ACT,
    out_of_service::ACT,
    node_termination::ACT,
    leader_failover::ACT,
    eviction_request::ACT,
];

/// Played only when asked for (`--act`): they end what the story leaves to explore.
pub const EXTRA: &[Act] = &[uninstall::ACT];

pub fn find(slug: &str) -> Option<&'static Act> {
    ALL.iter().chain(EXTRA).find(|act| act.slug == slug)
}

/// The act's number (1-based; the extra acts after the story), also when only some are played.
pub fn number(act: &Act) -> usize {
    ALL.iter()
        .chain(EXTRA)
        .position(|a| a.slug == act.slug)
        .map_or(0, |i| i + 1)
}
