//! Kubernetes Events (events.k8s.io/v1) under a reporting controller named per program. Each
//! call writes an Event of its own: kube-runtime's Recorder folds repeats of a reason into one
//! series and keeps only the first note, which would hide e.g. every priority group but the
//! first. Programs write Events through [`Reporter`](super::reporter::Reporter), which retries.

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::PostParams;
use kube::{Api, Client, Resource};

/// Publishes Events as `nodegrace-<program>`, instance = the node or pod it runs as.
#[derive(Clone)]
pub struct EventPublisher {
    client: Client,
    controller: String,
    instance: String,
}

impl std::fmt::Debug for EventPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventPublisher")
            .field("controller", &self.controller)
            .field("instance", &self.instance)
            .finish_non_exhaustive()
    }
}

/// The reporting controller name for a program, e.g. `nodegrace-out-of-service-gc`.
pub fn reporting_controller(program: &str) -> String {
    format!("nodegrace-{program}")
}

/// The reference an Event about `object` carries: its UID names this object, not a later
/// namesake, and no resourceVersion ties the Event to one state of it.
pub fn object_reference<K: Resource<DynamicType = ()>>(object: &K) -> ObjectReference {
    ObjectReference {
        resource_version: None,
        ..object.object_ref(&())
    }
}

/// One Event to write.
#[derive(Debug, Clone, PartialEq)]
pub struct EventReport {
    pub regarding: ObjectReference,
    pub warning: bool,
    /// CamelCase, machine-readable (`ShutdownBlocked`).
    pub reason: String,
    /// What was done or tried (`Shutdown`, `Inhibit`).
    pub action: String,
    /// For people.
    pub note: String,
}

impl EventReport {
    pub fn normal(
        regarding: ObjectReference,
        reason: &str,
        action: &str,
        note: impl Into<String>,
    ) -> Self {
        Self {
            regarding,
            warning: false,
            reason: reason.to_owned(),
            action: action.to_owned(),
            note: note.into(),
        }
    }

    pub fn warning(
        regarding: ObjectReference,
        reason: &str,
        action: &str,
        note: impl Into<String>,
    ) -> Self {
        Self {
            warning: true,
            ..Self::normal(regarding, reason, action, note)
        }
    }
}

impl EventPublisher {
    pub fn new(client: Client, program: &str, instance: &str) -> Self {
        Self {
            client,
            controller: reporting_controller(program),
            instance: instance.to_owned(),
        }
    }

    /// Writes `event` as a new Event object.
    pub async fn publish(&self, event: &EventReport) -> Result<(), kube::Error> {
        let now = jiff::Timestamp::now();
        let regarding = &event.regarding;
        let name = regarding.name.as_deref().unwrap_or(&self.controller);
        let object = events::v1::Event {
            metadata: ObjectMeta {
                name: Some(format!("{name}.{:x}", now.as_nanosecond())),
                namespace: regarding.namespace.clone(),
                ..ObjectMeta::default()
            },
            event_time: Some(MicroTime(now)),
            type_: Some(if event.warning { "Warning" } else { "Normal" }.to_owned()),
            reason: Some(event.reason.clone()),
            action: Some(event.action.clone()),
            note: Some(event.note.clone()),
            regarding: Some(regarding.clone()),
            reporting_controller: Some(self.controller.clone()),
            reporting_instance: Some(self.instance.clone()),
            ..events::v1::Event::default()
        };
        // Cluster-scoped objects' Events live in `default`, as the kubelet's Node Events do.
        let namespace = regarding.namespace.as_deref().unwrap_or("default");
        let api: Api<events::v1::Event> = Api::namespaced(self.client.clone(), namespace);
        api.create(&PostParams::default(), &object).await.map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controller_names_carry_the_project() {
        assert_eq!(
            reporting_controller("graceful-shutdown-agent"),
            "nodegrace-graceful-shutdown-agent"
        );
    }
}
