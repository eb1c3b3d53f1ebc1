//! Pod classification as the kubelet and the eviction logic see pods.

use k8s_openapi::api::core::v1::Pod;

/// Priority at and above which a pod counts as system-critical (`scheduling.SystemCriticalPriority`).
pub const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;
/// Annotation the kubelet puts on the API mirror of a static pod.
pub const MIRROR_POD_ANNOTATION: &str = "kubernetes.io/config.mirror";
/// Annotation the kubelet puts on static pods (file, http) it runs without the API.
pub const CONFIG_SOURCE_ANNOTATION: &str = "kubernetes.io/config.source";

fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|annotations| annotations.get(key))
        .map(String::as_str)
}

/// The API object of a static pod: the kubelet owns it; deleting it through the API does not
/// stop the pod.
pub fn is_mirror_pod(pod: &Pod) -> bool {
    annotation(pod, MIRROR_POD_ANNOTATION).is_some()
}

/// A static pod (from a file or URL rather than the API server), as the kubelet's
/// `IsStaticPod`.
pub fn is_static_pod(pod: &Pod) -> bool {
    annotation(pod, CONFIG_SOURCE_ANNOTATION).is_some_and(|source| source != "api")
}

/// Controlled by a DaemonSet: evicting it is pointless, the controller puts it right back.
pub fn is_daemonset_pod(pod: &Pod) -> bool {
    pod.metadata
        .owner_references
        .as_ref()
        .is_some_and(|owners| {
            owners
                .iter()
                .any(|owner| owner.controller == Some(true) && owner.kind == "DaemonSet")
        })
}

/// Succeeded or Failed: its containers have stopped for good.
pub fn is_terminal(pod: &Pod) -> bool {
    matches!(
        pod.status
            .as_ref()
            .and_then(|status| status.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// The pod's priority; pods admitted without one count as 0, as the scheduler treats them.
pub fn effective_priority(pod: &Pod) -> i32 {
    pod.spec
        .as_ref()
        .and_then(|spec| spec.priority)
        .unwrap_or(0)
}

/// The kubelet's `IsCriticalPod`: static and mirror pods, and pods of system-critical priority
/// (the system-cluster-critical and system-node-critical classes resolve to it).
pub fn is_critical(pod: &Pod) -> bool {
    if is_static_pod(pod) || is_mirror_pod(pod) {
        return true;
    }
    let class = pod
        .spec
        .as_ref()
        .and_then(|spec| spec.priority_class_name.as_deref());
    matches!(
        class,
        Some("system-cluster-critical" | "system-node-critical")
    ) || effective_priority(pod) >= SYSTEM_CRITICAL_PRIORITY
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodSpec, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    fn pod() -> Pod {
        Pod {
            spec: Some(PodSpec::default()),
            ..Pod::default()
        }
    }

    fn annotated(key: &str, value: &str) -> Pod {
        let mut pod = pod();
        pod.metadata.annotations = Some([(key.to_owned(), value.to_owned())].into());
        pod
    }

    fn owned_by(kind: &str, controller: bool) -> Pod {
        let mut pod = pod();
        pod.metadata.owner_references = Some(vec![OwnerReference {
            kind: kind.to_owned(),
            controller: Some(controller),
            name: "owner".to_owned(),
            uid: "u".to_owned(),
            api_version: "apps/v1".to_owned(),
            block_owner_deletion: None,
        }]);
        pod
    }

    fn with_priority(priority: Option<i32>, class: Option<&str>) -> Pod {
        let mut pod = pod();
        let spec = pod.spec.as_mut().unwrap();
        spec.priority = priority;
        spec.priority_class_name = class.map(str::to_owned);
        pod
    }

    fn in_phase(phase: &str) -> Pod {
        Pod {
            status: Some(PodStatus {
                phase: Some(phase.to_owned()),
                ..PodStatus::default()
            }),
            ..pod()
        }
    }

    #[test]
    fn mirror_and_static_pods() {
        assert!(is_mirror_pod(&annotated(MIRROR_POD_ANNOTATION, "hash")));
        assert!(!is_mirror_pod(&pod()));
        assert!(is_static_pod(&annotated(CONFIG_SOURCE_ANNOTATION, "file")));
        assert!(!is_static_pod(&annotated(CONFIG_SOURCE_ANNOTATION, "api")));
    }

    #[test]
    fn daemonset_pods_need_the_controller_reference() {
        assert!(is_daemonset_pod(&owned_by("DaemonSet", true)));
        assert!(!is_daemonset_pod(&owned_by("DaemonSet", false)));
        assert!(!is_daemonset_pod(&owned_by("ReplicaSet", true)));
        assert!(!is_daemonset_pod(&pod()));
    }

    #[test]
    fn terminal_phases() {
        assert!(is_terminal(&in_phase("Succeeded")));
        assert!(is_terminal(&in_phase("Failed")));
        assert!(!is_terminal(&in_phase("Running")));
        assert!(!is_terminal(&pod()));
    }

    #[test]
    fn critical_by_class_priority_or_static() {
        assert!(is_critical(&with_priority(
            None,
            Some("system-node-critical")
        )));
        assert!(is_critical(&with_priority(
            None,
            Some("system-cluster-critical")
        )));
        assert!(is_critical(&with_priority(
            Some(SYSTEM_CRITICAL_PRIORITY),
            None
        )));
        assert!(!is_critical(&with_priority(
            Some(SYSTEM_CRITICAL_PRIORITY - 1),
            Some("high")
        )));
        assert!(is_critical(&annotated(MIRROR_POD_ANNOTATION, "x")));
        assert!(!is_critical(&pod()));
    }

    #[test]
    fn missing_priority_is_zero() {
        assert_eq!(effective_priority(&pod()), 0);
        assert_eq!(effective_priority(&Pod::default()), 0);
        assert_eq!(effective_priority(&with_priority(Some(-7), None)), -7);
    }
}
