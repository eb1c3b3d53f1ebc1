//! The integration tests of termination-controller, one binary: each file of this directory is a module,
//! so the helpers they share and the crates they link are compiled and linked once (nextest
//! still runs every test in a process of its own).

// A test tells one history top to bottom; it is split where that reads better, not by count.
#![allow(clippy::too_many_lines)]

mod aws;
mod binary;
mod chaos;
mod cluster_api;
mod common;
mod controller;
mod drain_rules;
mod eviction_requests;
mod fuzz;
mod hooks;
mod node_pods;
mod plan;
mod providers;
mod safety;
mod storms;
mod webhook;
mod windows;
