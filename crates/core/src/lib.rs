//! Shared library of the nodegrace components.
//!
//! Every program links this crate: the logind client for the node agents, the Kubernetes
//! helpers, leader election for the controllers, and the admin server and CLI options for all.

pub mod admin;
pub mod cli;
pub mod clock;
pub mod config_file;
pub mod controller;
pub mod duration;
pub mod error_chain;
pub mod instances;
pub mod k8s;
pub mod leader;
pub mod logind;
pub mod program;
pub mod signals;
pub mod telemetry;
#[cfg(feature = "testing")]
pub mod testing;
