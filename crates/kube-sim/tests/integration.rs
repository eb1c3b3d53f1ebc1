//! The integration tests of kube-sim, one binary: each file of this directory is a module,
//! so the helpers they share and the crates they link are compiled and linked once (nextest
//! still runs every test in a process of its own).

// A test tells one history top to bottom; it is split where that reads better, not by count.
#![allow(clippy::too_many_lines)]

mod common;

mod admission;
mod api;
mod apply;
mod eviction;
mod eviction_request;
mod kubectl;
mod pod_gc;
mod semantics;
mod serve;
mod volumes;
mod world;
