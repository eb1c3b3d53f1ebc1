//! shutdown-inhibitor-agent: Leases named after the node (outside kube-node-lease) with a
//! holder become one logind block inhibitor and the `ShutdownInhibited` node condition.

pub mod agent;
pub mod alerts;
pub mod app;
pub mod cli;
pub mod config;
pub mod decide;
pub mod leases;
pub mod metrics;
