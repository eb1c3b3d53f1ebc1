//! Shared library of the nodegrace components.
//!
//! Every program links this crate: the logind client for the node agents, the Kubernetes
//! helpers, leader election for the controllers, and the admin server and CLI options for all.
