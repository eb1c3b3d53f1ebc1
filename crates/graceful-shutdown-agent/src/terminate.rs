//! Terminating the node's pods group by group, lowest priority first (KEP-2712).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, Preconditions};
use kube::{Api, Client, ResourceExt};
use nodegrace_core::error_chain::Chain;
use nodegrace_core::k8s::api_errors::{ApiErrorClass, classify_delete};
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
    /// A pod the watch saw go is stopped, whatever its deletion call answered; one still
    /// there failed if its deletion could not be made, else it outlived the period.
    pub fn of(gone: bool, delete_failed: bool) -> Self {
        match (gone, delete_failed) {
            (true, _) => Self::Stopped,
            (false, true) => Self::Failed,
            (false, false) => Self::TimedOut,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stopped => "stopped",
            Self::TimedOut => "timed_out",
            Self::Failed => "failed",
        }
    }
}

/// What happened to one group's pods, by `namespace/name`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GroupReport {
    pub pods: Vec<(String, PodOutcome)>,
}

impl GroupReport {
    /// Pods not confirmed gone when the group ended.
    pub fn still_running(&self) -> usize {
        self.pods
            .iter()
            .filter(|(_, outcome)| *outcome != PodOutcome::Stopped)
            .count()
    }
}

/// The pods to terminate, split by group. Terminal pods are ignored; the agent's own pod is
/// left alone because deleting it would end the agent before the last group is done. Mirror
/// pods are left to the kubelet, as in KEP-2000: deleting one through the API does not stop
/// its static pod (the kubelet only recreates the mirror), so waiting for it would only hold
/// the group to its full period.
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
        if is_own || is_terminal(pod) || is_mirror_pod(pod) {
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
    /// gone or `deadline` passes (the group's period, or less when the shutdown budget ends
    /// first). An empty group returns at once.
    pub async fn run_group(
        &self,
        group: PriorityGroup,
        pods: &[Arc<Pod>],
        deadline: Instant,
    ) -> GroupReport {
        let uids: HashSet<String> = pods.iter().filter_map(|pod| pod.uid()).collect();
        let requests = join_all(pods.iter().map(|pod| async {
            // A hung API call must not outlive the group: its pod counts as failed.
            tokio::time::timeout_at(deadline, self.terminate(pod, group.period, deadline))
                .await
                .unwrap_or_else(|_| pod.uid())
        }));
        // The deletions and the wait run together: a slow API call must not eat the period.
        let (failed, remaining) = tokio::join!(requests, self.pods.wait_gone(&uids, deadline));
        let failed: HashSet<String> = failed.into_iter().flatten().collect();
        let outcomes = pods
            .iter()
            .map(|pod| {
                let uid = pod.uid().unwrap_or_default();
                let outcome = PodOutcome::of(!remaining.contains(&uid), failed.contains(&uid));
                (
                    format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any()),
                    outcome,
                )
            })
            .collect();
        GroupReport { pods: outcomes }
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
        let condition = ConditionSpec::new(
            "DisruptionTarget",
            "True",
            "TerminationByNodeShutdown",
            message,
        );
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
        let deleted = retry_until(deadline, || async {
            let Err(error) = api.delete(&name, &params).await else {
                return Ok(());
            };
            let pod = format!("{namespace}/{name}");
            match classify_delete(&error) {
                // Gone already, or replaced by a pod of the same name: ours is not there.
                ApiErrorClass::Gone => Ok(()),
                ApiErrorClass::Retry => {
                    tracing::warn!(pod, error = %Chain(&error), "cannot delete pod; retrying");
                    Err(Attempt::Retry(error))
                }
                // Forbidden or invalid: retrying to the deadline would change nothing.
                ApiErrorClass::Final => {
                    tracing::error!(pod, error = %Chain(&error), "the API server refuses to delete the pod");
                    Err(Attempt::GiveUp(error))
                }
            }
        })
        .await;
        deleted.err().map(|_| uid)
    }
}

/// The shortest pause between attempts; below it, retrying is not worth the request.
const MIN_RETRY_PAUSE: Duration = Duration::from_millis(10);
const MAX_RETRY_PAUSE: Duration = Duration::from_secs(2);

/// A failed attempt: worth another try, or not.
#[derive(Debug, PartialEq, Eq)]
enum Attempt<E> {
    Retry(E),
    GiveUp(E),
}

/// Calls `attempt` until it succeeds, gives up, or `deadline` passes, with exponential
/// backoff. A pause never takes more than half of the time left, so the last attempts come
/// shortly before the deadline rather than one full pause early: a pod deleted late still
/// stops before the machine does.
async fn retry_until<T, E, F, Fut>(deadline: Instant, mut attempt: F) -> Result<T, E>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, Attempt<E>>>,
{
    let mut pause = Duration::from_millis(100);
    loop {
        let error = match attempt().await {
            Ok(value) => return Ok(value),
            Err(Attempt::GiveUp(error)) => return Err(error),
            Err(Attempt::Retry(error)) => error,
        };
        let left = deadline.saturating_duration_since(Instant::now());
        let wait = pause.min(left / 2).max(MIN_RETRY_PAUSE);
        if wait >= left {
            return Err(error);
        }
        tokio::time::sleep(wait).await;
        pause = (pause * 2).min(MAX_RETRY_PAUSE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[tokio::test(start_paused = true)]
    async fn retries_use_the_time_left_before_the_deadline() {
        let start = Instant::now();
        let deadline = start + Duration::from_secs(4);
        // The API answers again 3.3 s in: a retry must still come before the 4 s deadline.
        let healed = start + Duration::from_millis(3300);
        let mut attempts = Vec::new();
        let result = retry_until(deadline, || {
            attempts.push(start.elapsed());
            async move {
                if Instant::now() >= healed {
                    Ok(())
                } else {
                    Err(Attempt::Retry("503"))
                }
            }
        })
        .await;
        assert_eq!(result, Ok(()), "attempts at {attempts:?}");
        assert!(*attempts.last().unwrap() < Duration::from_secs(4));
    }

    #[tokio::test(start_paused = true)]
    async fn retries_stop_at_the_deadline() {
        let start = Instant::now();
        let deadline = start + Duration::from_secs(4);
        let mut attempts = 0;
        let result: Result<(), &str> = retry_until(deadline, || {
            attempts += 1;
            async { Err(Attempt::Retry("503")) }
        })
        .await;
        assert_eq!(result, Err("503"));
        let late = start.elapsed();
        assert!(late <= Duration::from_secs(4), "gave up at {late:?}");
        assert!(
            late >= Duration::from_millis(3950),
            "gave up early, at {late:?}"
        );
        assert!(attempts < 20, "{attempts} attempts");
    }

    #[tokio::test(start_paused = true)]
    async fn a_refusal_is_not_retried() {
        let start = Instant::now();
        let mut attempts = 0;
        let result: Result<(), &str> = retry_until(start + Duration::from_secs(4), || {
            attempts += 1;
            async { Err(Attempt::GiveUp("403")) }
        })
        .await;
        assert_eq!((result, attempts), (Err("403"), 1));
        assert_eq!(start.elapsed(), Duration::ZERO);
    }

    #[test]
    fn a_pods_outcome_comes_from_the_watch_first() {
        let cases = [
            (true, false, PodOutcome::Stopped),
            (true, true, PodOutcome::Stopped),
            (false, true, PodOutcome::Failed),
            (false, false, PodOutcome::TimedOut),
        ];
        for (gone, delete_failed, outcome) in cases {
            assert_eq!(PodOutcome::of(gone, delete_failed), outcome);
        }
    }

    fn pod(name: &str, priority: i32, annotations: &serde_json::Value) -> Arc<Pod> {
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "kube-system", "uid": name, "annotations": annotations},
                "spec": {"priority": priority, "containers": []},
                "status": {"phase": "Running"},
            }))
            .unwrap(),
        )
    }

    #[test]
    fn mirror_pods_and_the_agent_itself_are_not_waited_for() {
        let plan = ShutdownPlan::new(vec![
            PriorityGroup {
                priority: 0,
                period: Duration::from_secs(5),
            },
            PriorityGroup {
                priority: 2_000_000_000,
                period: Duration::from_secs(5),
            },
        ]);
        let pods = [
            pod("web", 0, &json!({})),
            pod("agent", 2_000_001_000, &json!({})),
            pod(
                "kube-apiserver-n1",
                2_000_001_000,
                &json!({"kubernetes.io/config.mirror": "abc", "kubernetes.io/config.source": "file"}),
            ),
            pod("dns", 2_000_000_000, &json!({})),
        ];
        let groups = group_pods(&plan, &pods, Some(("kube-system", "agent")));
        let names: Vec<Vec<String>> = groups
            .iter()
            .map(|group| group.iter().map(|pod| pod.name_any()).collect())
            .collect();
        assert_eq!(names, vec![vec!["web"], vec!["dns"]]);
    }
}
