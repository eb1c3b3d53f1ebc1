//! Shared library of the nodegrace components.
//!
//! Every program links this crate: the program frame (`main`, the admin server, a supervisor),
//! the logind client and trait for the node agents, the Kubernetes helpers (a retrying writer
//! for conditions, taints and Events; API error classes; node, pod and selector semantics),
//! leader election and the control loops' dirty sets, backoff and timers for the controllers,
//! and the CLI options for all.
//! docs/core.md says what each piece decides for every program.

pub mod admin;
pub mod assembly;
pub mod backoff;
pub mod cli;
pub mod clock;
pub mod config_file;
pub mod dirty;
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
pub mod timers;
