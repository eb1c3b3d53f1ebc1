//! Kubernetes Events, published through kube-runtime's Recorder (events.k8s.io/v1, with
//! deduplication into series), under a reporting controller named per program.

use crate::error_chain::Chain;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, Recorder, Reporter};

pub use kube::runtime::events::EventType;

/// Publishes Events as `nodegrace-<program>`, instance = the node or pod it runs as.
#[derive(Clone)]
pub struct EventPublisher {
    recorder: Recorder,
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
            recorder: Recorder::new(client, reporter),
        }
    }

    /// Publishes an Event about `regarding`. Failures are logged, never returned: an Event is
    /// a courtesy to people, and losing one must not stop the work it describes.
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
        if let Err(error) = self.recorder.publish(&event, regarding).await {
            tracing::warn!(error = %Chain(&error), reason, "cannot publish an Event");
        }
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
