//! Kubernetes Events (events.k8s.io/v1) under a reporting controller named per program. Each
//! call writes an Event of its own: kube-runtime's Recorder folds repeats of a reason into one
//! series and keeps only the first note, which would hide e.g. every priority group but the
//! first. Where that folding is wanted (the same failure tried again and again), a report
//! names its series ([`EventReport::in_series`]): a repeat counts up the first Event's
//! `series.count` instead of writing another. Programs write Events through
//! [`Reporter`](super::reporter::Reporter), which retries.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client, Resource};

/// Publishes Events as `nodegrace-<program>`, instance = the node or pod it runs as.
#[derive(Clone)]
pub struct EventPublisher {
    client: Client,
    controller: String,
    instance: String,
    /// The Event each series began with (namespace, name) and its count so far.
    series: Arc<Mutex<HashMap<String, Series>>>,
}

#[derive(Debug, Clone)]
struct Series {
    namespace: String,
    name: String,
    count: i32,
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
    /// Repeats of the same key are one Event whose `series.count` grows; `None` for an Event
    /// of its own.
    pub series: Option<String>,
    /// How many times it happened: repeats of a series queued together are one write, as
    /// client-go's event correlator folds them (1 for an Event of its own).
    pub occurrences: u32,
    /// A series whose repeats come by the thousand (a rollout's nodes waiting on one budget):
    /// the reporter writes its count at most once per pace ([`super::reporter::SERIES_PACE`]).
    pub paced: bool,
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
            series: None,
            occurrences: 1,
            paced: false,
        }
    }

    /// This report and its repeats under `key` are one Event with a count: the note is the
    /// first one's (an Event's note cannot change), the count and last time are the latest.
    #[must_use]
    pub fn in_series(self, key: impl Into<String>) -> Self {
        Self {
            series: Some(key.into()),
            ..self
        }
    }

    /// [`Self::in_series`], its count written at most once per
    /// [`SERIES_PACE`](super::reporter::SERIES_PACE): for repeats that come by the thousand.
    #[must_use]
    pub fn in_paced_series(self, key: impl Into<String>) -> Self {
        Self {
            paced: true,
            ..self.in_series(key)
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
            series: Arc::default(),
        }
    }

    /// Writes `event` as a new Event object, or as one more of its series.
    pub async fn publish(&self, event: &EventReport) -> Result<(), kube::Error> {
        let now = jiff::Timestamp::now();
        if let Some(key) = &event.series {
            let known = self
                .series
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get(key)
                .cloned();
            let occurrences = i32::try_from(event.occurrences).unwrap_or(i32::MAX);
            if let Some(known) = known {
                let count = known.count.saturating_add(occurrences);
                match self.count_up(&known, count, now).await {
                    Ok(()) => {
                        self.remember(key, Series { count, ..known });
                        return Ok(());
                    }
                    // Expired (Events live an hour) or deleted: the series starts again.
                    Err(kube::Error::Api(status)) if status.is_not_found() => {}
                    Err(error) => return Err(error),
                }
            }
        }
        let regarding = &event.regarding;
        let name = regarding.name.as_deref().unwrap_or(&self.controller);
        let count = i32::try_from(event.occurrences).unwrap_or(i32::MAX);
        // Repeats that came before the first write are counted in it.
        let series = (count > 1).then_some(events::v1::EventSeries {
            count,
            last_observed_time: MicroTime(now),
        });
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
            series,
            ..events::v1::Event::default()
        };
        // Cluster-scoped objects' Events live in `default`, as the kubelet's Node Events do.
        let namespace = regarding.namespace.as_deref().unwrap_or("default");
        let api: Api<events::v1::Event> = Api::namespaced(self.client.clone(), namespace);
        api.create(&PostParams::default(), &object).await?;
        if let (Some(key), Some(name)) = (&event.series, object.metadata.name) {
            let first = Series {
                namespace: namespace.to_owned(),
                name,
                count: count.max(1),
            };
            self.remember(key, first);
        }
        Ok(())
    }

    /// More of a series: `series.count` (now `count`) and `series.lastObservedTime`, the only
    /// fields of an events.k8s.io Event that change after its creation.
    async fn count_up(
        &self,
        series: &Series,
        count: i32,
        now: jiff::Timestamp,
    ) -> Result<(), kube::Error> {
        let api: Api<events::v1::Event> = Api::namespaced(self.client.clone(), &series.namespace);
        let patch = serde_json::json!({"series": {
            "count": count,
            "lastObservedTime": MicroTime(now),
        }});
        api.patch(&series.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(drop)
    }

    fn remember(&self, key: &str, series: Series) {
        self.series
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key.to_owned(), series);
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
