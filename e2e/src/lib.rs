//! nodegrace end to end: the demo (`cargo xtask demo`) runs the built binaries as an operator
//! would — kube-sim as the cluster, each chart installed with helm and its pods run by kube-sim
//! as processes under their ServiceAccount's RBAC, each machine with a real elogind — and plays
//! a story whose acts check their own outcome.

// The demo's acts and the explorer's scripts are stories read top to bottom; the programs'
// own code stays under the lint's default (issue 61).
#![allow(clippy::too_many_lines)]

pub mod acts;
pub mod chart;
pub mod cluster;
pub mod demo;
pub mod explore;
pub mod images;
pub mod least_privilege;
pub mod manifests;
pub mod node_host;
pub mod observe;
pub mod processes;
pub mod rbac;
pub mod stage;
pub mod timeline;
pub mod wait;

/// The repository this crate was built from: its charts, demo values and the explorer's CRD
/// are read from there.
pub const REPO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
