//! out-of-service-gc: lets stateful workloads fail over from a node that is really down
//! (KEP-2268). On a node with the `node.kubernetes.io/out-of-service` taint whose Ready
//! condition is False or Unknown, it force-deletes the pods that do not tolerate the taint and
//! deletes the node's VolumeAttachments, behind a live re-read of the node before every force
//! action and a guard on the node's heartbeat; optionally it taints confirmed powered-off nodes
//! and removes the taint when a node is back. With `--fence-after` it is the fencing agent as
//! well: it powers a dead node's machine off behind its guards, taints it, and with
//! `--recover-after-cleanup` powers it on again once clean. docs/out-of-service-gc.md is the
//! operator's page.
//!
//! # Why was this pod force-deleted? Why is my node not fenced?
//! Read the node's conditions `OutOfServiceCleanup` and `OutOfServiceFence` (`kubectl describe
//! node X`) or the Events: each reason is a row of this map, which names the function that
//! gives it and what it waits on. Reasons are defined once, in [`conditions`]; the names
//! written on objects (taint, labels, annotations) in [`api`].
//!
//! | state | decided by | reasons an operator sees (condition / Event) | waits on |
//! |---|---|---|---|
//! | tainted, node Ready | [`cleanup`] `NodeCleanup::ready_again` | `Pending` | the node seen down, or leftovers from before gone |
//! | liveness guard refuses | [`cleanup`] `NodeCleanup::refuse` ([`guard`]) | `Refused` / `OutOfServiceCleanupRefused` | the kubelet's Lease silent for the window |
//! | cleaning | [`cleanup`] `NodeCleanup::clean` (`sort`, `force_delete_all`, `detach_unused`; rules in [`qualify`]) | `Cleaning` / `OutOfServiceCleanupStarted`, `OutOfServiceTaintEffect`; pods: `ForceDeleted`, `ForceDeletedHeldByFinalizers`, `DisruptionTarget` `DeletionByOutOfServiceGC`; `VolumeForceDetached` | each pod's `tolerationSeconds`; its pods and attachments gone |
//! | clean | [`cleanup`] `NodeCleanup::done` | `Done` / `OutOfServiceCleanupDone` | the node Ready (`--auto-untaint`) |
//! | back | [`cleanup`] `NodeCleanup::ready_again` | `TaintRemoved` / `OutOfServiceTaintRemoved` | — |
//! | auto-taint | [`tainting`] `AutoTaint::attempt` | `OutOfServiceTaintAdded`, `OutOfServiceNotConfirmed` | NotReady for `--auto-taint-after`; the provider's word that the machine is off |
//! | NotReady seen | [`fencing`] `Fencer::seen_not_ready` | `NotReadySeen` | `--fence-after` |
//! | fence held | `fencing::guards` (`Fencer::guards`, `max_fenced`, `hold`) | `FenceHeldDoNotFence`, `FenceHeldHeartbeat`, `FenceHeldPartition`, `FenceHeldMaxFenced`, `FenceHeldMachineNotFound`, `FenceHeldProvider` | the annotation gone; the kubelet silent; the partition healed; a place under `--max-fenced`; the machine's backoff |
//! | fencing | [`fencing`] `Fencer::attempt` → `stamp` → `power_off_stamped` | `Fencing` | the provider accepting the power-off |
//! | fenced | `fencing::power` `confirm` (`await_off`, `mark_fenced`) | `Fenced`, `OutOfServiceTaintAdded` | the provider reporting the machine off, within `--fence-timeout` |
//! | fence failed | `fencing::power` `fail` | `FenceFailed` (one Event, counted) | the machine's backoff (10 s doubling to 5 min) |
//! | back during the fence | `fencing::power` `came_back`, `resume` | `FencedAfterBack`, `FenceCancelled` | — |
//! | powering on | `fencing::recovery` `Fencer::recover` | `PoweringOn`, `PowerOnFailed`, `LeftOffForDeletion` | the node Ready within `--recover-timeout`; the machine's backoff |
//! | recovered, left off | `fencing::recovery` `recovered`, `give_up` | `Recovered`, `RecoveryFailed` | — (left off: an operator removes the label) |
//!
//! The leader's loop ([`controller`]) keeps a field per kind of work (cleanup tasks, the
//! auto-taint's timers, the fence's timers) and a method per event; [`shared::Shared`] is what
//! the tasks share.

pub mod api;
pub mod app;
pub mod cleanup;
pub mod cli;
pub mod conditions;
pub mod controller;
pub mod fence_mark;
pub mod fencing;
pub mod guard;
pub mod metrics;
pub mod qualify;
pub mod shared;
pub mod status;
pub mod tainting;
