//! Kubernetes helpers shared by the programs: a rate-limited client, toleration and pod
//! semantics exactly as Kubernetes defines them, and safe writes to nodes and pods.

pub mod api_errors;
pub mod cached_node;
pub mod client;
pub mod conditions;
pub mod events;
pub mod node_identity;
pub mod node_shutdown;
pub mod node_timers;
pub mod nodes;
pub mod partition;
pub mod pods;
pub mod reporter;
pub mod selectors;
pub mod taints;
pub mod tolerations;
pub mod volumes;
pub mod watched;
