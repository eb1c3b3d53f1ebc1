//! Kubernetes Events, published through kube-runtime's Recorder (events.k8s.io/v1, with
//! deduplication into series), under a reporting controller named per program.

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::PostParams;
use kube::runtime::events::{Event, Recorder, Reporter};
use kube::{Api, Client};

use crate::error_chain::Chain;

pub use kube::runtime::events::EventType;

/// Publishes Events as `nodegrace-<program>`, instance = the node or pod it runs as.
#[derive(Clone)]
pub struct EventPublisher {
    recorder: Recorder,
    client: Client,
    reporter: Reporter,
}

impl std::fmt::Debug for EventPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventPublisher").finish_non_exhaustive()
    }
}

/// The reporting controller name for a program, e.g. `nodegrace-out-of-service-gc`.
pub fn reporting_controller(program: &str) -> String {
    format!("nodegrace-{program}")
}

impl EventPublisher {
    pub fn new(client: Client, program: &str, instance: &str) -> Self {
        let reporter = Reporter {
            controller: reporting_controller(program),
            instance: Some(instance.to_owned()),
        };
        Self {
            recorder: Recorder::new(client.clone(), reporter.clone()),
            client,
            reporter,
        }
    }

    /// Publishes an Event about `regarding`; a repeat of one published earlier (same object,
    /// type, reason and action) is counted in that Event's series, and its note is not kept.
    /// Failures are logged, never returned: an Event is a courtesy to people, and losing one
    /// must not stop the work it describes.
    pub async fn publish(
        &self,
        regarding: &ObjectReference,
        type_: EventType,
        reason: &str,
        action: &str,
        note: Option<String>,
    ) {
        let event = Event {
            type_,
            reason: reason.to_owned(),
            note,
            action: action.to_owned(),
            secondary: None,
        };
        log_failure(self.recorder.publish(&event, regarding).await, reason);
    }

    /// Publishes an Event that is never folded into the series of an earlier one with the same
    /// reason, for notes that differ each time and must all be read (one per priority group).
    /// Failures are logged, as with [`publish`](Self::publish).
    pub async fn publish_distinct(
        &self,
        regarding: &ObjectReference,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let published = self
            .try_publish_distinct(regarding, type_, reason, action, note)
            .await;
        log_failure(published, reason);
    }

    /// [`publish_distinct`](Self::publish_distinct) for a caller that retries.
    pub async fn try_publish_distinct(
        &self,
        regarding: &ObjectReference,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) -> Result<(), kube::Error> {
        let now = jiff::Timestamp::now();
        let name = regarding
            .name
            .as_deref()
            .unwrap_or(&self.reporter.controller);
        let event = events::v1::Event {
            metadata: ObjectMeta {
                name: Some(format!("{name}.{:x}", now.as_nanosecond())),
                namespace: regarding.namespace.clone(),
                ..ObjectMeta::default()
            },
            event_time: Some(MicroTime(now)),
            type_: Some(
                match type_ {
                    EventType::Normal => "Normal",
                    EventType::Warning => "Warning",
                }
                .to_owned(),
            ),
            reason: Some(reason.to_owned()),
            action: Some(action.to_owned()),
            note: Some(note),
            regarding: Some(regarding.clone()),
            reporting_controller: Some(self.reporter.controller.clone()),
            reporting_instance: self.reporter.instance.clone(),
            ..events::v1::Event::default()
        };
        // Cluster-scoped objects' Events live in `default`, as the kubelet's Node Events do.
        let namespace = regarding.namespace.as_deref().unwrap_or("default");
        let api: Api<events::v1::Event> = Api::namespaced(self.client.clone(), namespace);
        api.create(&PostParams::default(), &event).await.map(drop)
    }
}

fn log_failure(published: Result<(), kube::Error>, reason: &str) {
    if let Err(error) = published {
        tracing::warn!(error = %Chain(&error), reason, "cannot publish an Event");
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
