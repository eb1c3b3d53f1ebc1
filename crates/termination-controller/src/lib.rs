//! termination-controller: makes `kubectl delete node` safe. A finalizer holds each managed
//! Node; once it is deleted, the node waits for its NodeDisruptionBudgets to grant the
//! disruption, is cordoned, drained tier by tier through the Eviction API with one queue per
//! PodDisruptionBudget (woken by the budget's status, never polling), waits for its volumes
//! to detach, has its machine terminated, and only then is released. docs/termination-controller.md
//! is the operator's page.
//!
//! # Why is my node waiting?
//! First run `termination-controller plan --node X` ([`plan`]): from the cluster as it is, it
//! prints what the drain would do and what blocks it, and changes nothing. Then the reason of
//! the node's `Terminating` condition (`kubectl describe node X`) is a row of this map, and
//! its row names the function that waits. Reasons are defined once, in [`conditions`].
//!
//! | step (docs' number) | performed by | condition reasons | Events on the node | waits on |
//! |---|---|---|---|---|
//! | 1 finalizer | [`controller`] `Leading::keep_finalizer` | — | — | a managed node seen |
//! | 2 budgets | [`controller`] `Leading::look_at_waiting`, the node waiting without a task in [`waiting_room`]; grants written by [`allocation::refresh_statuses`] (the leader's pass), its verdict kept in [`waits`]; the task starts at [`termination`] `granted` | `AwaitingBudget`; `MaintenancePlanned` `AwaitingBudget` or `MaintenanceWindow`, then `DisruptionGranted` | `AwaitingBudget` on the budget, counted | a grant in every covering NodeDisruptionBudget's `status.disruptedNodes` ([`windows`] for windows) |
//! | 3 pre-drain hooks | [`termination`] `await_hooks` ([`hooks`]) | `AwaitingPreDrainHooks` | `AwaitingPreDrainHooks`, `HookTimeout` | the `pre-drain.nodegrace.io/<name>` annotations removed, or `--hook-timeout` |
//! | 4 cordon | [`termination`] `cordon` | — | `Cordoned` | one update |
//! | 5–7 drain | [`drain`] `Drain::run`: `classify` ([`tiers`], [`drain_rules`]), `Sorted::wait`, `dispatch` ([`queues`]) | `Draining`, `BlockedByDoNotEvict`, `AwaitingPodCompletion`; `DrainInProgress` `NodeDeleted`, then `DrainCompleted` and `Drained` `DrainCompleted` | `DrainingTier`, `EvictionBlocked`, `EvictionMisconfigured`, `PodLeftTerminating`, `Drained` (or `DrainSkipped`) | the node's pods gone; each PodDisruptionBudget's status; do-not-evict pods; `--drain-timeout` |
//! | 8 volumes | [`termination`] `volumes_detached` | `AwaitingVolumeDetachment` | `VolumeDetachTimeout` | the node's VolumeAttachments gone, or `--volume-detach-timeout` |
//! | 9 pre-terminate hooks | [`termination`] `await_hooks` ([`hooks`]) | `AwaitingPreTerminateHooks` | `AwaitingPreTerminateHooks`, `HookTimeout` | the `pre-terminate.nodegrace.io/<name>` annotations removed, or `--hook-timeout` |
//! | 10 machine | [`termination`] `terminate_instance` | `TerminatingInstance` | `InstanceTerminated`, `InstanceNotFound`, `InstanceTerminationFailed`, `TerminationBlocked` | the instance provider's answer (polled, 200 ms to 15 s) |
//! | 11 release | [`termination`] `release` | — | `FinalizerRemoved` | one update |
//!
//! Every step returns a [`step::Step`]: `?` carries a stop, a node gone or a failure to the
//! task's loop, which retries failures only. The leader's loop ([`controller`]) starts one
//! task per deleting node ([`termination::NodeTermination`]); [`shared::Shared`] is what the
//! tasks share (clients, the caches, the budgets, the reporter).

pub mod allocation;
pub mod api;
pub mod app;
pub mod budget;
pub mod budget_index;
pub mod cli;
pub mod conditions;
pub mod controller;
pub mod drain;
pub mod drain_rules;
pub mod explain;
pub mod fresh_nodes;
pub mod grants;
pub mod handover;
pub mod hooks;
pub mod member;
pub mod metrics;
pub mod node_pods;
pub mod nodes_read;
pub mod plan;
pub mod queues;
pub mod shared;
pub mod step;
pub mod termination;
pub mod tiers;
pub mod turns;
pub mod uninstall;
pub mod waiting_room;
pub mod waits;
pub mod webhook;
pub mod windows;
