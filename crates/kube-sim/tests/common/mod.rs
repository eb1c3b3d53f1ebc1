//! What several of the test modules share.

pub mod files;
pub mod kubectl_sim;
pub mod store;
