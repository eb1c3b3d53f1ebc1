//! The simulated world around the API server: kubelets, and the control-plane controllers our
//! components interact with. Each runs in-process on the store (its writes skip admission) and
//! can be switched off. Annotations under `sim.nodegrace.io/` steer it (see WORLD.md).

mod attach_detach;
mod cloud;
mod controller;
mod deployments;
mod disruption;
mod ephemeral;
mod events;
mod eviction_requests;
mod gc;
mod imperative_evictor;
mod jobs;
mod kubelet;
pub(crate) mod launch;
mod node_affinity;
mod node_lifecycle;
mod pod_gc;
mod probes;
mod provisioner;
mod root_ca;
mod runtime;
mod service_accounts;
mod statefulsets;
mod workloads;

use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::routing::get;
use tokio_util::sync::CancellationToken;

pub use attach_detach::{DRIVER as CSI_DRIVER, attachment_name, unique_volume_name};
pub use cloud::{Call, Cloud, Instance, machine_id};
pub use imperative_evictor::EVICTOR_USER;
pub use launch::InCluster;
pub use runtime::{ImageRule, Logs};

pub use crate::annotations::{
    BOOTS_ANNOTATION, CLOCK_SKEW_ANNOTATION, KUBELET_ANNOTATION, READY_AFTER_ANNOTATION,
    STOP_SECONDS_ANNOTATION,
};
use crate::audit::Audit;
use crate::store::Store;

/// Which simulated controllers run, and their timings.
#[derive(Debug, Clone)]
pub struct WorldOptions {
    pub kubelet: bool,
    /// How often a running kubelet renews its node's Lease in kube-node-lease.
    pub lease_renew_interval: Duration,
    pub node_lifecycle: bool,
    /// How long without a lease renewal before a node turns Ready=Unknown (real default 40 s).
    pub node_monitor_grace: Duration,
    pub disruption: bool,
    /// How long an evicted pod may stay undeleted before its budget counts it again (the
    /// disruption controller's `DeletionTimeout`, 2 minutes).
    pub disruption_deletion_timeout: Duration,
    /// The scheduler, the ReplicaSet and the DaemonSet controllers.
    pub workloads: bool,
    pub attach_detach: bool,
    /// How long the simulated external attacher takes to detach a volume.
    pub detach_delay: Duration,
    /// How long the attach/detach controller waits for a NotReady node to unmount a volume
    /// before detaching it anyway (kube-controller-manager's 6 minutes).
    pub max_wait_for_unmount: Duration,
    pub garbage_collector: bool,
    /// kube-controller-manager's pod GC (see pod_gc.rs), which sweeps every `pod_gc_period`
    /// (20 s upstream).
    pub pod_gc: bool,
    pub pod_gc_period: Duration,
    /// How long the pod GC waits before it takes a missing node for deleted (40 s upstream).
    pub pod_gc_quarantine: Duration,
    /// Finished pods kept before the pod GC deletes the oldest (kube-controller-manager's
    /// `--terminated-pod-gc-threshold`, 12,500); 0 keeps them all.
    pub terminated_pod_gc_threshold: usize,
    /// The `tolerationSeconds` the DefaultTolerationSeconds admission gives pods for the
    /// not-ready and unreachable NoExecute taints (the real 300 s unless a test shortens it).
    pub default_toleration_seconds: i64,
    /// Images whose containers the kubelet runs as local processes (see runtime.rs).
    pub run_images: Vec<ImageRule>,
    /// The `kube-sim` binary, whose `run-container` mounts a container's volumes in a mount
    /// namespace of its own (`kube-sim serve` names itself); without it container processes
    /// run without their volumes.
    pub container_init: Option<std::path::PathBuf>,
    /// Each node's own filesystem for hostPath volumes: `<dir>/<node>/…` (the host's own paths
    /// when `None`).
    pub node_roots: Option<std::path::PathBuf>,
    /// How long a machine stays `stopping` after a power-off request before it is `stopped` and
    /// its kubelet stops (real clouds take seconds to a minute); 0 turns it off at once.
    pub power_off_delay: Duration,
    /// Probes run at least this often (their `periodSeconds` shortened), as the other timings
    /// here are, so that demos need not wait 10 s per readiness check.
    pub probe_period_max: Option<Duration>,
    /// The evictionrequest-controller and the imperative eviction responder; they run only
    /// while the EvictionRequest API is served (`SimOptions::eviction_request_api`).
    pub eviction_requests: bool,
    /// How long an Active eviction responder may go without a heartbeat before the next takes
    /// over (20 minutes, a constant upstream).
    pub responder_heartbeat_deadline: Duration,
}

impl Default for WorldOptions {
    fn default() -> Self {
        Self {
            kubelet: true,
            lease_renew_interval: Duration::from_secs(10),
            node_lifecycle: true,
            node_monitor_grace: Duration::from_secs(40),
            disruption: true,
            disruption_deletion_timeout: disruption::DELETION_TIMEOUT,
            workloads: true,
            attach_detach: true,
            detach_delay: Duration::from_secs(1),
            max_wait_for_unmount: Duration::from_secs(6 * 60),
            garbage_collector: true,
            pod_gc: true,
            pod_gc_period: Duration::from_secs(20),
            pod_gc_quarantine: Duration::from_secs(40),
            terminated_pod_gc_threshold: 12_500,
            default_toleration_seconds: 300,
            run_images: Vec::new(),
            container_init: None,
            node_roots: None,
            probe_period_max: None,
            power_off_delay: Duration::ZERO,
            eviction_requests: true,
            responder_heartbeat_deadline: Duration::from_secs(20 * 60),
        }
    }
}

impl WorldOptions {
    /// Adds the garbage collector (and namespace deletion) to these options.
    #[must_use]
    pub fn with_garbage_collector(mut self) -> Self {
        self.garbage_collector = true;
        self
    }

    /// Nothing simulated: a bare API server.
    pub fn none() -> Self {
        Self {
            kubelet: false,
            node_lifecycle: false,
            disruption: false,
            workloads: false,
            attach_detach: false,
            garbage_collector: false,
            pod_gc: false,
            eviction_requests: false,
            ..Self::default()
        }
    }
}

/// The running world: its cloud, its audit log and its containers' logs.
#[derive(Debug, Clone)]
pub struct World {
    cloud: Cloud,
    audit: Audit,
    logs: Logs,
}

impl World {
    pub fn start(
        store: Store,
        audit: Audit,
        logs: Logs,
        in_cluster: InCluster,
        options: &WorldOptions,
        stop: &CancellationToken,
    ) -> Self {
        if options.workloads {
            let ca_pem = in_cluster.ca_pem.clone();
            tokio::spawn(controller::run(
                store.clone(),
                stop.clone(),
                Duration::from_secs(1),
                root_ca::concerns,
                move |store: &Store| root_ca::reconcile(store, &ca_pem),
            ));
        }
        if options.kubelet {
            tokio::spawn(kubelet::run(
                store.clone(),
                options.clone(),
                logs.clone(),
                in_cluster,
                stop.clone(),
            ));
        }
        let quick = Duration::from_secs(1);
        if options.workloads {
            tokio::spawn(controller::run(
                store.clone(),
                stop.clone(),
                quick,
                workloads::concerns,
                workloads::reconcile,
            ));
            tokio::spawn(controller::run(
                store.clone(),
                stop.clone(),
                quick,
                jobs::concerns,
                jobs::reconcile,
            ));
        }
        if options.workloads {
            tokio::spawn(controller::run(
                store.clone(),
                stop.clone(),
                quick,
                provisioner::concerns,
                provisioner::reconcile,
            ));
            tokio::spawn(controller::run(
                store.clone(),
                stop.clone(),
                quick,
                ephemeral::concerns,
                ephemeral::reconcile,
            ));
            tokio::spawn(controller::run(
                store.clone(),
                stop.clone(),
                quick,
                service_accounts::concerns,
                service_accounts::reconcile,
            ));
        }
        if options.disruption {
            let deletion_timeout = options.disruption_deletion_timeout;
            tokio::spawn(controller::run(
                store.clone(),
                stop.clone(),
                quick,
                disruption::concerns,
                move |store: &Store| disruption::reconcile(store, deletion_timeout),
            ));
        }
        if options.node_lifecycle {
            let grace = options.node_monitor_grace;
            let period = (grace / 4).clamp(Duration::from_millis(50), Duration::from_secs(5));
            let mut memory = node_lifecycle::Memory::default();
            tokio::spawn(controller::run_timed(
                store.clone(),
                stop.clone(),
                period,
                node_lifecycle::concerns,
                move |store: &Store| node_lifecycle::reconcile(store, grace, &mut memory),
            ));
        }
        if options.attach_detach {
            let timings = attach_detach::Timings {
                detach_delay: options.detach_delay,
                max_wait_for_unmount: options.max_wait_for_unmount,
            };
            let mut memory = attach_detach::Memory::default();
            let shortest = timings.detach_delay.min(timings.max_wait_for_unmount);
            let period = (shortest / 4).clamp(Duration::from_millis(50), Duration::from_secs(1));
            tokio::spawn(controller::run(
                store.clone(),
                stop.clone(),
                period,
                attach_detach::concerns,
                move |store: &Store| attach_detach::reconcile(store, timings, &mut memory),
            ));
        }
        if options.garbage_collector {
            tokio::spawn(controller::run(
                store.clone(),
                stop.clone(),
                quick,
                gc::concerns,
                gc::reconcile,
            ));
        }
        if options.pod_gc {
            let settings = pod_gc::Settings {
                period: options.pod_gc_period,
                quarantine: options.pod_gc_quarantine,
                terminated_threshold: options.terminated_pod_gc_threshold,
            };
            tokio::spawn(pod_gc::run(store.clone(), settings, stop.clone()));
        }
        let served = store
            .registry()
            .find("lifecycle.k8s.io", "v1alpha1", "evictionrequests")
            .is_some();
        if options.eviction_requests && served {
            let deadline = options.responder_heartbeat_deadline;
            let mut memory = eviction_requests::Memory::default();
            tokio::spawn(controller::run_timed(
                store.clone(),
                stop.clone(),
                quick,
                eviction_requests::concerns,
                move |store: &Store| eviction_requests::reconcile(store, deadline, &mut memory),
            ));
            let mut memory = imperative_evictor::Memory::default();
            let evictor_audit = audit.clone();
            tokio::spawn(controller::run_timed(
                store.clone(),
                stop.clone(),
                quick,
                imperative_evictor::concerns,
                move |store: &Store| {
                    imperative_evictor::reconcile(store, &evictor_audit, deadline, &mut memory)
                },
            ));
        }
        let cloud = Cloud::new(store.clone()).with_power_off_delay(options.power_off_delay);
        let registrar = cloud.clone();
        tokio::spawn(controller::run(
            store,
            stop.clone(),
            quick,
            cloud::concerns,
            move |_: &Store| registrar.reconcile(),
        ));
        Self { cloud, audit, logs }
    }

    pub fn logs(&self) -> &Logs {
        &self.logs
    }

    pub fn cloud(&self) -> &Cloud {
        &self.cloud
    }

    pub fn audit(&self) -> &Audit {
        &self.audit
    }

    /// The world's `/sim/v1` endpoints: instances and the audit logs.
    pub fn control_router<S: Clone + Send + Sync + 'static>(&self) -> Router<S> {
        let audit = Router::new()
            .route(
                "/sim/v1/audit/violations",
                get(|State(audit): State<Audit>| async move { axum::Json(audit.violations()) }),
            )
            .route(
                "/sim/v1/audit/deletions",
                get(|State(audit): State<Audit>| async move { axum::Json(audit.deletions()) }),
            )
            .route(
                "/sim/v1/audit/evictions",
                get(|State(audit): State<Audit>| async move { axum::Json(audit.evictions()) }),
            )
            .route(
                "/sim/v1/audit/node-writes",
                get(|State(audit): State<Audit>| async move { axum::Json(audit.node_writes()) }),
            )
            .with_state(self.audit.clone());
        self.cloud.router().merge(audit)
    }
}
