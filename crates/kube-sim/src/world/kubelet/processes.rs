//! The kubelet's side of containers run as processes (pkg/kubelet/kuberuntime, the prober's
//! results): preparing and spawning them, restarts with the kubelet's backoff, exits and
//! probe outcomes turned into container statuses.

use nix::sys::signal::Signal;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::{Action, Kubelets, containers, exit_reason, restart_backoff, text};
use crate::conditions::is_finished;
use crate::store::timestamps::now_rfc3339;
use crate::world::runtime::Exit;
use crate::world::{launch, probes};

impl Kubelets {
    /// A probe's result changed: readiness sets the container's ready flag, a failed liveness
    /// probe restarts the container (its process is stopped; the restart policy brings it back).
    pub(super) fn probed(&mut self, outcome: &probes::Outcome) {
        let Some(pod) = self.pod_by_uid(&outcome.uid) else {
            return;
        };
        let pod = &pod;
        if pod["metadata"]["deletionTimestamp"].is_string() {
            return;
        }
        let (namespace, name) = (
            text(&pod["metadata"]["namespace"]),
            text(&pod["metadata"]["name"]),
        );
        if !outcome.healthy {
            self.record(
                pod,
                Some(&outcome.container),
                "Unhealthy",
                &format!("{} probe failed: {}", outcome.kind.name(), outcome.message),
            );
        }
        match outcome.kind {
            probes::Kind::Readiness => {
                self.update_readiness(&namespace, &name, &outcome.uid, |spec| {
                    (spec["name"] == outcome.container.as_str()).then_some(outcome.healthy)
                });
            }
            probes::Kind::Liveness => {
                self.record(
                    pod,
                    Some(&outcome.container),
                    "Killing",
                    &format!(
                        "Container {} failed liveness probe, will be restarted",
                        outcome.container
                    ),
                );
                self.runtime
                    .signal_container(&outcome.uid, &outcome.container, Signal::SIGTERM);
            }
        }
    }

    /// What each container the runtime runs needs to start, or why it cannot yet.
    pub(super) fn prepare_all(&self, pod: &Value) -> Result<Vec<(Value, launch::Launch)>, String> {
        containers(pod)
            .filter(|c| self.runtime.runs(c))
            .map(|container| Ok((container.clone(), self.prepare(pod, container)?)))
            .collect()
    }

    pub(super) fn prepare(&self, pod: &Value, container: &Value) -> Result<launch::Launch, String> {
        let uid = text(&pod["metadata"]["uid"]);
        let (program, args) = self.runtime.command(container)?;
        let node = text(&pod["spec"]["nodeName"]);
        let context = launch::Context {
            store: &self.store,
            in_cluster: &self.in_cluster,
            node_root: self
                .options
                .node_roots
                .as_ref()
                .map(|roots| roots.join(&node)),
            pod_dir: self.runtime.pod_dir(&uid),
        };
        launch::prepare(&context, pod, container, program, args)
    }

    /// Starts one container process, and its probes.
    pub(super) fn spawn(
        &mut self,
        pod: &Value,
        container: &Value,
        prepared: &launch::Launch,
    ) -> Result<(), String> {
        let uid = text(&pod["metadata"]["uid"]);
        let name = text(&container["name"]);
        self.runtime.start(&uid, &name, prepared)?;
        let stop = CancellationToken::new();
        probes::start(
            container,
            &uid,
            text(&pod["status"]["podIP"]).as_str(),
            self.options.probe_period_max,
            &self.probe_outcomes,
            &stop,
        );
        if let Some(previous) = self.probing.insert((uid, name), stop) {
            previous.cancel();
        }
        Ok(())
    }

    pub(super) fn stop_probing(&mut self, uid: &str, container: Option<&str>) {
        self.probing.retain(|(pod, name), stop| {
            let ends = pod == uid && container.is_none_or(|c| c == name);
            if ends {
                stop.cancel();
            }
            !ends
        });
    }

    /// Starts the prepared processes of the pod's containers; one that cannot start ends at
    /// once, as a container whose start failed.
    pub(super) fn start_processes(&mut self, pod: &Value, launches: Vec<(Value, launch::Launch)>) {
        let uid = text(&pod["metadata"]["uid"]);
        for (container, prepared) in launches {
            if let Err(error) = self.spawn(pod, &container, &prepared) {
                let container = text(&container["name"]);
                self.record(pod, Some(&container), "Failed", &format!("Error: {error}"));
                self.container_exited(Exit {
                    uid: uid.clone(),
                    container,
                    code: 128,
                });
            }
        }
    }

    /// A container process ended: a deleting pod finishes once all have; otherwise the
    /// container restarts after a back-off when the pod's restartPolicy says so, and a pod
    /// whose containers have all ended for good turns Succeeded or Failed.
    pub(super) fn container_exited(&mut self, exit: Exit) {
        self.runtime.exited(&exit);
        self.stop_probing(&exit.uid, Some(&exit.container));
        let Some(pod) = self.pod_by_uid(&exit.uid) else {
            return;
        };
        let pod = &pod;
        let (namespace, name) = (
            text(&pod["metadata"]["namespace"]),
            text(&pod["metadata"]["name"]),
        );
        self.exit_codes
            .insert((exit.uid.clone(), exit.container.clone()), exit.code);
        if !self.kubelet_running(text(&pod["spec"]["nodeName"]).as_str()) {
            // The machine is off: nobody reports, nothing restarts until it is back.
            return;
        }
        if pod["metadata"]["deletionTimestamp"].is_string() {
            if !self.runtime.any_running(&exit.uid)
                && let Some((key, _)) = self.stops.remove(&exit.uid)
            {
                self.timers.remove(&key);
                self.act(Action::Stopped {
                    namespace,
                    name,
                    uid: exit.uid,
                    killed: false,
                });
            }
            return;
        }
        if is_finished(pod) {
            return;
        }
        let restart = match pod["spec"]["restartPolicy"].as_str() {
            Some("Never") => false,
            Some("OnFailure") => exit.code != 0,
            _ => true,
        };
        let restarts = pod["status"]["containerStatuses"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|s| s["name"] == exit.container.as_str())
            .and_then(|s| s["restartCount"].as_u64())
            .unwrap_or(0);
        let backoff = restart_backoff(u32::try_from(restarts).unwrap_or(u32::MAX));
        let container = exit.container.clone();
        let code = exit.code;
        self.update_pod(&namespace, &name, &exit.uid, |pod| {
            let now = now_rfc3339();
            let mut all_ended = true;
            let mut all_succeeded = true;
            if let Some(statuses) = pod["status"]["containerStatuses"].as_array_mut() {
                for status in statuses {
                    if status["name"] == container.as_str() {
                        let started = status["state"]["running"]["startedAt"].clone();
                        let terminated = json!({"terminated": {"exitCode": code, "reason": exit_reason(code), "startedAt": started, "finishedAt": now}});
                        status["ready"] = json!(false);
                        status["started"] = json!(false);
                        if restart {
                            status["lastState"] = terminated;
                            status["state"] = json!({"waiting": {"reason": "CrashLoopBackOff", "message": format!("back-off {}s restarting failed container={container}", backoff.as_secs())}});
                        } else {
                            status["state"] = terminated;
                        }
                    }
                    let code = status["state"]["terminated"]["exitCode"].as_i64();
                    all_ended &= code.is_some();
                    all_succeeded &= code == Some(0);
                }
            }
            if let Some(conditions) = pod["status"]["conditions"].as_array_mut() {
                for condition in conditions
                    .iter_mut()
                    .filter(|c| c["type"] == "Ready" || c["type"] == "ContainersReady")
                {
                    if condition["status"] != "False" {
                        condition["status"] = json!("False");
                        condition["reason"] = json!(if all_ended { "PodCompleted" } else { "ContainersNotReady" });
                        condition["lastTransitionTime"] = json!(now);
                    }
                }
            }
            if all_ended {
                pod["status"]["phase"] = json!(if all_succeeded { "Succeeded" } else { "Failed" });
            }
        });
        if restart {
            self.record(
                pod,
                Some(&exit.container),
                "BackOff",
                &format!("Back-off restarting failed container {}", exit.container),
            );
            self.timers.insert(
                Action::Restart {
                    namespace,
                    name,
                    uid: exit.uid,
                    container: exit.container,
                },
                backoff,
            );
        } else if let Ok(pod) =
            self.store
                .get(&self.store.kind("", "pods"), Some(&namespace), &name)
        {
            self.sync_volumes_in_use(text(&pod["spec"]["nodeName"]).as_str(), &pod);
        }
    }

    pub(super) fn restart(&mut self, namespace: &str, name: &str, uid: &str, container: &str) {
        let pods = self.store.kind("", "pods");
        let Ok(pod) = self.store.get(&pods, Some(namespace), name) else {
            return;
        };
        if pod["metadata"]["uid"] != uid
            || pod["metadata"]["deletionTimestamp"].is_string()
            || self.runtime.is_running(uid, container)
            || !self.kubelet_running(text(&pod["spec"]["nodeName"]).as_str())
        {
            return;
        }
        let Some(spec) = containers(&pod).find(|c| c["name"] == container).cloned() else {
            return;
        };
        let started = self
            .prepare(&pod, &spec)
            .and_then(|prepared| self.spawn(&pod, &spec, &prepared));
        if let Err(error) = started {
            self.record(&pod, Some(container), "Failed", &format!("Error: {error}"));
            self.container_exited(Exit {
                uid: uid.to_owned(),
                container: container.to_owned(),
                code: 128,
            });
            return;
        }
        self.record(
            &pod,
            Some(container),
            "Started",
            &format!("Started container {container}"),
        );
        self.update_pod(namespace, name, uid, |pod| {
            let now = now_rfc3339();
            if let Some(status) = pod["status"]["containerStatuses"]
                .as_array_mut()
                .into_iter()
                .flatten()
                .find(|s| s["name"] == container)
            {
                let restarts = status["restartCount"].as_u64().unwrap_or(0);
                status["restartCount"] = json!(restarts + 1);
                status["started"] = json!(true);
                status["state"] = json!({"running": {"startedAt": now}});
            }
        });
        // A restarted container with a readiness probe is unready until the probe passes again.
        self.update_readiness(namespace, name, uid, |spec| {
            (spec["name"] == container).then(|| self.ready_at_start(spec))
        });
    }
}
