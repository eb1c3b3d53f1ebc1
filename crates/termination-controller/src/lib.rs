//! termination-controller: makes `kubectl delete node` safe. A finalizer holds each managed
//! Node; once it is deleted, the node waits for its NodeDisruptionBudgets to grant the
//! disruption, is cordoned, drained tier by tier through the Eviction API with one queue per
//! PodDisruptionBudget (woken by the budget's status, never polling), waits for its volumes
//! to detach, has its machine terminated, and only then is released. docs/termination-controller.md
//! is the operator's page.

pub mod api;
pub mod app;
pub mod budget;
pub mod cli;
pub mod controller;
pub mod drain;
pub mod drain_rules;
pub mod explain;
pub mod fresh_nodes;
pub mod grants;
pub mod hooks;
pub mod metrics;
pub mod plan;
pub mod queues;
pub mod shared;
pub mod termination;
pub mod tiers;
pub mod turns;
pub mod uninstall;
pub mod webhook;
pub mod windows;
