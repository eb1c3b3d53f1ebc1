//! The integration tests of the controllers' layer, one binary: each file of this directory is
//! a module, so the helpers they share and the crates they link are compiled and linked once
//! (nextest still runs every test in a process of its own).

mod aws_ec2;
mod cluster_api;
mod leader;
mod redfish;
