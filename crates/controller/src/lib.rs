//! The cluster-wide controllers' layer: the machines behind nodes (EC2, Cluster API, Redfish,
//! exec, kube-sim's cloud), leader election, and the frame a controller is assembled in (its
//! clients, reporter, caches and election; [`assembly`]). Only the controllers link it, and
//! with it the cloud and BMC clients.

pub mod assembly;
pub mod cli;
pub mod instances;
pub mod leader;

pub use cli::{ControllerArgs, InstanceArgs, InstanceProviderKind, LeaderArgs};
