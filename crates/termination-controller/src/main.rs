//! `termination-controller`: Drains and terminates nodes through a finalizer, honouring PodDisruptionBudgets.
//!
//! The behaviour lands with its component issue; until then the binary accepts its options
//! (the common ones and leader election), so charts and scripts can be written against them,
//! and stops with a clear message.

use std::process::ExitCode;

use nodegrace_core::cli::ports;
use nodegrace_core::program::not_yet_implemented_main;

fn main() -> ExitCode {
    not_yet_implemented_main::<{ ports::TERMINATION_CONTROLLER }>(
        "termination-controller",
        "Drains and terminates nodes through a finalizer, honouring PodDisruptionBudgets",
    )
}
