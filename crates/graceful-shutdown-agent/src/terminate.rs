//! Terminating the node's pods group by group, lowest priority first (KEP-2712).

use nodegrace_core::error_chain::Chain;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, Preconditions};
use kube::{Api, Client, ResourceExt};
use nodegrace_core::k8s::conditions::{ConditionSpec, set_pod_condition};
use nodegrace_core::k8s::pods::{effective_priority, is_mirror_pod, is_terminal};
use tokio::time::Instant;

use crate::node_pods::NodePods;
use crate::plan::{PriorityGroup, ShutdownPlan, grace_period_seconds};

/// How one pod's termination ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PodOutcome {
    /// Gone before its group's period ran out.
    Stopped,
    /// Still there when the period ran out; the kubelet kills it at its grace period.
    TimedOut,
    /// The API refused or could not be reached; the pod may still be running.
    Failed,
}

impl PodOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stopped => "stopped",
            Self::TimedOut => "timed_out",
            Self::Failed => "failed",
        }
    }
}

/// What happened to one group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupReport {
    pub group: PriorityGroup,
    pub pods: Vec<(String, PodOutcome)>,
    pub elapsed: Duration,
}

/// The pods to terminate, split by group. Terminal pods are ignored; the agent's own pod is
/// left alone because deleting it would end the agent before the last group is done.
pub fn group_pods(
    plan: &ShutdownPlan,
    pods: &[Arc<Pod>],
    own_pod: Option<(&str, &str)>,
) -> Vec<Vec<Arc<Pod>>> {
    let mut groups = vec![Vec::new(); plan.groups().len()];
    if groups.is_empty() {
        return groups;
    }
    for pod in pods {
        let is_own = own_pod.is_some_and(|(namespace, name)| {
            pod.namespace().as_deref() == Some(namespace) && pod.name_any() == name
        });
        if is_own || is_terminal(pod) {
            continue;
        }
        groups[plan.group_index(effective_priority(pod))].push(Arc::clone(pod));
    }
    groups
}

/// Talks to the API server for the pods of one node.
#[derive(Clone)]
pub struct Terminator {
    client: Client,
    pods: NodePods,
    node: String,
}

impl std::fmt::Debug for Terminator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Terminator")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

impl Terminator {
    pub fn new(client: Client, pods: NodePods, node: String) -> Self {
        Self { client, pods, node }
    }

    /// Terminates one group: every pod at once, then waits (on the pod watch) until all are
    /// gone or the group's period expires. An empty group returns at once.
    pub async fn run_group(&self, group: PriorityGroup, pods: &[Arc<Pod>]) -> GroupReport {
        let started = Instant::now();
        let deadline = started + group.period;
        let uids: HashSet<String> = pods.iter().filter_map(|pod| pod.uid()).collect();
        let requests = join_all(
            pods.iter()
                .filter(|pod| !is_mirror_pod(pod))
                .map(|pod| self.terminate(pod, group.period, deadline)),
        );
        // The deletions and the wait run together: a slow API call must not eat the period.
        let (failed, remaining) = tokio::join!(requests, self.pods.wait_gone(&uids, deadline));
        let failed: HashSet<String> = failed.into_iter().flatten().collect();
        let outcomes = pods
            .iter()
            .map(|pod| {
                let uid = pod.uid().unwrap_or_default();
                let outcome = if !remaining.contains(&uid) {
                    PodOutcome::Stopped
                } else if failed.contains(&uid) {
                    PodOutcome::Failed
                } else {
                    PodOutcome::TimedOut
                };
                (
                    format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any()),
                    outcome,
                )
            })
            .collect();
        GroupReport {
            group,
            pods: outcomes,
            elapsed: started.elapsed(),
        }
    }

    /// Marks the pod as disrupted and deletes it with its capped grace period. Returns the
    /// pod's UID if the deletion could not be made before `deadline`.
    async fn terminate(
        &self,
        pod: &Pod,
        group_period: Duration,
        deadline: Instant,
    ) -> Option<String> {
        let namespace = pod.namespace().unwrap_or_default();
        let name = pod.name_any();
        let uid = pod.uid()?;
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &namespace);
        let message = format!(
            "Node {} is shutting down; the pod is being terminated.",
            self.node
        );
        let condition = ConditionSpec {
            type_: "DisruptionTarget",
            status: "True",
            reason: "TerminationByNodeShutdown",
            message: &message,
        };
        if let Err(error) = set_pod_condition(&api, &name, &condition).await {
            // The condition explains the deletion; the deletion itself matters more.
            tracing::warn!(pod = %format!("{namespace}/{name}"), error = %Chain(&error), "cannot set DisruptionTarget");
        }
        let params = DeleteParams {
            grace_period_seconds: Some(
                u32::try_from(grace_period_seconds(
                    pod.spec
                        .as_ref()
                        .and_then(|spec| spec.termination_grace_period_seconds),
                    group_period,
                ))
                .unwrap_or(u32::MAX),
            ),
            preconditions: Some(Preconditions {
                uid: Some(uid.clone()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        let mut pause = Duration::from_millis(100);
        loop {
            match api.delete(&name, &params).await {
                Ok(_) => return None,
                // Gone already, or replaced by a pod of the same name: ours is not there.
                Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => {
                    return None;
                }
                Err(error) => {
                    tracing::warn!(pod = %format!("{namespace}/{name}"), error = %Chain(&error), "cannot delete pod; retrying");
                    if Instant::now() + pause >= deadline {
                        return Some(uid);
                    }
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(2));
                }
            }
        }
    }
}
