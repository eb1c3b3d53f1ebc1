//! kube-sim: an in-memory Kubernetes API server with a simulated kubelet and the control-plane
//! controllers nodegrace's components interact with. Test infrastructure held to production
//! standards; see README.md for what it does and how it differs from a real API server.

pub mod error;
pub mod patch;
pub mod resources;
pub mod selector;
pub mod store;
