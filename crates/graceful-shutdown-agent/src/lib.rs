//! graceful-shutdown-agent: gives a node's pods a graceful, priority-ordered termination when
//! the machine shuts down (KEP-2000 + KEP-2712), holding a logind delay inhibitor meanwhile.

pub mod config;
pub mod plan;
pub mod state;
