//! Kubernetes helpers shared by the programs: a rate-limited client, toleration and pod
//! semantics exactly as Kubernetes defines them, and safe writes to nodes and pods.

pub mod client;
pub mod conditions;
pub mod events;
pub mod pods;
pub mod taints;
pub mod tolerations;
