//! The integration tests of e2e, one binary: each file of this directory is a module,
//! so the helpers they share and the crates they link are compiled and linked once (nextest
//! still runs every test in a process of its own).

mod charts;
mod demo;
mod docs;
