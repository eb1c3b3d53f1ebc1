//! `kubectl nodegrace`: one place where an operator sees every node's lifecycle under the
//! nodegrace programs, why it waits, and what would move it. It only reads, with the user's
//! own kubeconfig, and stays useful with whichever programs are installed.
//! docs/kubectl-nodegrace.md is the operator's page.
//!
//! | command | module | reads |
//! |---|---|---|
//! | `status [NODE…] [--watch]` | [`status`], rows from [`diagnose`] | nodes; the NodeDisruptionBudgets, shutdown Leases and kubelet Leases the rows name; the programs' workloads |
//! | `explain node X` | [`explain_node`] | the same, the drain plan of a node held by its pods, the node's Events ([`timeline`]) |
//! | `explain pod NS/P` | [`explain_pod`] | the pod's `DisruptionTarget`, its Events |
//! | `plan X` | `termination_controller::plan`, the controller's own | as `termination-controller plan` |
//!
//! The programs' words are theirs: a row's step is the reason of the condition the program
//! writes, read with the program's own names ([`termination_controller::conditions`],
//! [`out_of_service_gc::conditions`], `nodegrace_core::k8s::node_shutdown`). What the plugin
//! adds is the object that holds the node and the command that would move it on. A read the
//! user may not make becomes one line of [`read::Unread`], never a failure of the whole.

pub mod app;
pub mod cli;
pub mod commands;
pub mod connect;
pub mod diagnose;
pub mod explain_node;
pub mod explain_pod;
pub mod lifecycle;
pub mod read;
pub mod render;
pub mod status;
pub mod timeline;
