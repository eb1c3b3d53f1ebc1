//! kube-sim: an in-memory Kubernetes API server with a simulated kubelet and the control-plane
//! controllers nodegrace's components interact with. Test infrastructure held to production
//! standards; see README.md for what it does and how it differs from a real API server.

// The simulator's dispatch over the API's resources and its control loops follow upstream's
// long functions where that keeps them comparable; the programs' own code stays under the
// lint's default (issue 61).
#![allow(clippy::too_many_lines)]

pub mod admission;
pub mod admission_policy;
pub mod annotations;
pub mod api;
pub mod audit;
pub mod auth;
pub mod cluster;
pub mod conditions;
pub mod container_init;
pub mod control;
pub mod crd_schema;
pub mod error;
pub mod eviction;
pub mod faults;
pub(crate) mod json;
pub mod managed_fields;
pub mod patch;
pub mod populate;
pub mod requests;
pub mod resources;
pub mod selector;
pub mod server;
pub mod store;
pub mod tls;
pub mod tokens;
pub(crate) mod typed;
pub(crate) mod webhook_configuration;
pub mod world;

pub use server::{KubeSim, SimError, SimOptions};
pub use world::{ImageRule, World, WorldOptions};
