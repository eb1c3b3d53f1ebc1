//! out-of-service-gc: lets stateful workloads fail over from a node that is really down
//! (KEP-2268). On a node with the `node.kubernetes.io/out-of-service` taint whose Ready
//! condition is False or Unknown, it force-deletes the pods that do not tolerate the taint and
//! deletes the node's VolumeAttachments, behind a live re-read of the node before every force
//! action and a guard on the node's heartbeat; optionally it taints confirmed powered-off nodes
//! and removes the taint when a node is back. With `--fence-after` it is the fencing agent as
//! well: it powers a dead node's machine off behind its guards, taints it, and with
//! `--recover-after-cleanup` powers it on again once clean. docs/out-of-service-gc.md is the
//! operator's page.

pub mod app;
pub mod cleanup;
pub mod cli;
pub mod controller;
pub mod fence_mark;
pub mod fencing;
pub mod fresh;
pub mod guard;
pub mod metrics;
pub mod qualify;
pub mod shared;
pub mod status;
pub mod tainting;
