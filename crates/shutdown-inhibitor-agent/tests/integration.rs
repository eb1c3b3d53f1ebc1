//! The integration tests of shutdown-inhibitor-agent, one binary: each file of this directory is a module,
//! so the helpers they share and the crates they link are compiled and linked once (nextest
//! still runs every test in a process of its own).

mod binary;
mod block_semantics;
mod inhibitor;
