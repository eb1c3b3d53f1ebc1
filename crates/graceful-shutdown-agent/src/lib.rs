//! graceful-shutdown-agent: gives a node's pods a graceful, priority-ordered termination when
//! the machine shuts down (KEP-2000 + KEP-2712), holding a logind delay inhibitor meanwhile.

pub mod agent;
pub mod app;
pub mod budget;
pub mod cli;
pub mod config;
pub mod kubelet_conflict;
pub mod lifecycle;
pub mod metrics;
pub mod node_marks;
pub mod node_pods;
pub mod plan;
pub mod state;
pub mod summary;
pub mod terminate;
pub mod write_budget;
