//! What every nodegrace program shares: the program frame (`main`, the admin server, a
//! supervisor), telemetry, the common command-line options, and the Kubernetes helpers (a
//! retrying writer for conditions, taints and Events; API error classes; node, pod and
//! selector semantics; one Node object's identity), with the backoff, timers and dirty sets of
//! the control loops.
//!
//! The layers above it: `nodegrace-logind` (the node agents) and `nodegrace-controller` (the
//! controllers: instance providers, leader election, the controller frame). ARCHITECTURE.md
//! draws the map; docs/core.md says what each piece decides for every program.

pub mod admin;
pub mod backoff;
pub mod cli;
pub mod clock;
pub mod config_file;
pub mod dirty;
pub mod duration;
pub mod error_chain;
pub mod fresh;
pub mod k8s;
pub mod program;
pub mod reasons;
pub mod signals;
pub mod telemetry;
pub mod timers;
