//! `kubectl nodegrace` as an operator runs it: the real kubectl finds the plugin on PATH and
//! runs it against kube-sim, in states the real programs made. Each scenario checks the state,
//! the blocker and the suggested command, then runs that command and checks the node moves on.
//! One test binary, so the workspace links it once.

mod binary;
mod out_of_service;
mod plugin;
mod shutdown;
mod termination;
