//! A timeline of an object: its Events (core/v1, as kubectl reads them) and the conditions the
//! programs set on it, in time order, each with who said it.

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Event, NodeCondition};
use kube::api::ListParams;
use kube::{Api, Client};
use serde::Serialize;

use crate::lifecycle::Program;
use crate::read::{Access, Unread, optional_list};

/// One thing that happened.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Moment {
    pub at: Option<Timestamp>,
    /// `Event` or `Condition`.
    pub kind: &'static str,
    /// The nodegrace program that said it, by name; else the Event's reporter (`kubelet`,
    /// `default-scheduler`), or empty.
    pub by: String,
    /// For an Event: `Normal` or `Warning`; for a condition: its type and status
    /// (`Terminating=True`).
    #[serde(rename = "type")]
    pub type_: String,
    pub reason: String,
    pub message: String,
    /// How many times an Event was seen (a series counts its repeats).
    pub count: u32,
    /// The UID of the object the Event is about (a namesake has another).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// The node a kubelet's Event came from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
}

impl Moment {
    pub fn program(&self) -> Option<Program> {
        Program::ALL
            .into_iter()
            .find(|program| program.name() == self.by)
    }
}

/// The Events about `kind` `name` (in `namespace`), oldest first.
pub async fn events(
    client: &Client,
    kind: &str,
    namespace: Option<&str>,
    name: &str,
    unread: &mut Unread,
) -> anyhow::Result<Vec<Moment>> {
    let (api, scope) = match namespace {
        Some(namespace) => (
            Api::<Event>::namespaced(client.clone(), namespace),
            format!("in namespace {namespace}"),
        ),
        None => (
            Api::<Event>::all(client.clone()),
            "in all namespaces".to_owned(),
        ),
    };
    let params = ListParams::default().fields(&format!(
        "involvedObject.kind={kind},involvedObject.name={name}"
    ));
    let found = optional_list(&api, &params, &Access::list::<Event>(scope), "", unread).await?;
    let mut moments: Vec<Moment> = found.into_iter().flatten().map(moment).collect();
    moments.sort_by_key(|moment| moment.at);
    Ok(moments)
}

fn moment(event: Event) -> Moment {
    let at = event
        .series
        .as_ref()
        .and_then(|series| series.last_observed_time.as_ref())
        .map(|time| time.0)
        .or_else(|| event.last_timestamp.as_ref().map(|time| time.0))
        .or_else(|| event.event_time.as_ref().map(|time| time.0))
        .or_else(|| event.first_timestamp.as_ref().map(|time| time.0))
        .or_else(|| {
            event
                .metadata
                .creation_timestamp
                .as_ref()
                .map(|time| time.0)
        });
    let reporter = event
        .reporting_component
        .clone()
        .filter(|reporter| !reporter.is_empty())
        .or_else(|| {
            event
                .source
                .as_ref()
                .and_then(|source| source.component.clone())
        })
        .unwrap_or_default();
    let by = Program::of_reporter(&reporter).map_or(reporter, |program| program.name().to_owned());
    let count = event
        .series
        .as_ref()
        .and_then(|series| series.count)
        .or(event.count)
        .unwrap_or(1);
    Moment {
        at,
        kind: "Event",
        by,
        type_: event.type_.unwrap_or_default(),
        reason: event.reason.unwrap_or_default(),
        message: event.message.unwrap_or_default(),
        count: u32::try_from(count).unwrap_or(1),
        uid: event.involved_object.uid,
        host: event
            .source
            .and_then(|source| source.host)
            .filter(|host| !host.is_empty()),
    }
}

/// The node's conditions of `types` (with who writes each), as moments at their last
/// transition.
pub fn conditions(conditions: &[NodeCondition], types: &[(&str, &str)]) -> Vec<Moment> {
    conditions
        .iter()
        .filter_map(|condition| {
            let (_, by) = types.iter().find(|(type_, _)| *type_ == condition.type_)?;
            Some(Moment {
                at: condition.last_transition_time.as_ref().map(|time| time.0),
                kind: "Condition",
                by: (*by).to_owned(),
                type_: format!("{}={}", condition.type_, condition.status),
                reason: condition.reason.clone().unwrap_or_default(),
                message: condition.message.clone().unwrap_or_default(),
                count: 1,
                uid: None,
                host: None,
            })
        })
        .collect()
}
