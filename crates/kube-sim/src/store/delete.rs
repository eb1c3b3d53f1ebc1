//! Deletion as the real API server does it: preconditions, finalizers (the object stays with a
//! deletionTimestamp until they are gone), and pods' graceful termination (a bound, running pod
//! is only marked; its kubelet removes it once the containers stopped).

use serde_json::{Value, json};

use super::strategy::finalizers;
use super::timestamps::now_rfc3339;
use crate::error::ApiError;
use crate::resources::ResourceType;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Preconditions {
    pub uid: Option<String>,
    pub resource_version: Option<String>,
}

impl Preconditions {
    /// 409 when the object is not the one the client meant.
    pub fn check(&self, kind: &ResourceType, name: &str, current: &Value) -> Result<(), ApiError> {
        let meta = &current["metadata"];
        if let Some(uid) = &self.uid {
            let actual = meta["uid"].as_str().unwrap_or_default();
            if uid != actual {
                return Err(ApiError::conflict(
                    &kind.group,
                    &kind.plural,
                    name,
                    &format!(
                        "Precondition failed: UID in precondition: {uid}, UID in object meta: {actual}"
                    ),
                ));
            }
        }
        if let Some(version) = &self.resource_version {
            let actual = meta["resourceVersion"].as_str().unwrap_or_default();
            if version != actual {
                return Err(ApiError::conflict(
                    &kind.group,
                    &kind.plural,
                    name,
                    &format!(
                        "Precondition failed: ResourceVersion in precondition: {version}, ResourceVersion in object meta: {actual}"
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// `metav1.DeleteOptions`, from the body or the query.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeleteOptions {
    pub grace_period_seconds: Option<i64>,
    pub preconditions: Preconditions,
    /// `Orphan`, `Background` (the default) or `Foreground`.
    pub propagation_policy: Option<String>,
    /// The deprecated `orphanDependents`; `true` means the `Orphan` policy.
    pub orphan_dependents: Option<bool>,
    pub dry_run: bool,
}

impl DeleteOptions {
    pub fn immediate() -> Self {
        Self {
            grace_period_seconds: Some(0),
            ..Self::default()
        }
    }

    /// Reads a `DeleteOptions` (or `Eviction.deleteOptions`) object.
    pub fn from_json(body: &Value) -> Result<Self, ApiError> {
        if body.is_null() {
            return Ok(Self::default());
        }
        let grace = &body["gracePeriodSeconds"];
        let grace_period_seconds = match grace {
            Value::Null => None,
            value => Some(value.as_i64().ok_or_else(|| {
                ApiError::bad_request("DeleteOptions.gracePeriodSeconds must be an integer")
            })?),
        };
        let orphan_dependents = body["orphanDependents"].as_bool();
        let policy = body["propagationPolicy"]
            .as_str()
            .map(str::to_owned)
            .or_else(|| (orphan_dependents == Some(true)).then(|| "Orphan".to_owned()));
        if let Some(policy) = &policy
            && !matches!(policy.as_str(), "Orphan" | "Background" | "Foreground")
        {
            return Err(ApiError::invalid(
                "",
                "DeleteOptions",
                "",
                &[crate::error::Cause {
                    reason: "FieldValueNotSupported",
                    field: "propagationPolicy".to_owned(),
                    message: format!(
                        "Unsupported value: \"{policy}\": supported values: \"Foreground\", \"Background\", \"Orphan\""
                    ),
                }],
            ));
        }
        Ok(Self {
            grace_period_seconds,
            preconditions: Preconditions {
                uid: body["preconditions"]["uid"].as_str().map(str::to_owned),
                resource_version: body["preconditions"]["resourceVersion"]
                    .as_str()
                    .map(str::to_owned),
            },
            propagation_policy: policy,
            orphan_dependents,
            dry_run: body["dryRun"]
                .as_array()
                .is_some_and(|modes| !modes.is_empty()),
        })
    }
}

pub enum Plan {
    Remove,
    Mark(Value),
}

/// The garbage collector's finalizer that holds an object until its dependents are orphaned.
pub const ORPHAN_FINALIZER: &str = "orphan";
/// The garbage collector's finalizer that holds an object until its blocking dependents are
/// gone (foreground deletion).
pub const FOREGROUND_FINALIZER: &str = "foregroundDeletion";

/// The object's finalizers as this deletion leaves them (store.go's
/// `deletionFinalizersForGarbageCollection`): an explicit policy replaces the garbage
/// collector's finalizer the object carries (`orphan` for Orphan, `foregroundDeletion` for
/// Foreground, neither for Background); without one, the object's own choice stands.
fn finalizers_for_propagation(current: &Value, options: &DeleteOptions) -> Vec<String> {
    let own = finalizers(current);
    let carries = |finalizer: &str| own.iter().any(|f| f == finalizer);
    let (orphan, foreground) = match (
        options.orphan_dependents,
        options.propagation_policy.as_deref(),
    ) {
        (Some(orphan), _) => (orphan, false),
        (None, Some(policy)) => (policy == "Orphan", policy == "Foreground"),
        (None, None) => (carries(ORPHAN_FINALIZER), carries(FOREGROUND_FINALIZER)),
    };
    let mut wanted: Vec<String> = own
        .iter()
        .filter(|f| *f != ORPHAN_FINALIZER && *f != FOREGROUND_FINALIZER)
        .cloned()
        .collect();
    if orphan {
        wanted.push(ORPHAN_FINALIZER.to_owned());
    }
    if foreground {
        wanted.push(FOREGROUND_FINALIZER.to_owned());
    }
    wanted
}

/// Decides between removing the object now and marking it for deletion.
pub fn plan(kind: &ResourceType, current: &Value, options: &DeleteOptions) -> Plan {
    let mut marked = current.clone();
    let wanted = finalizers_for_propagation(current, options);
    let unchanged = {
        let mut before = finalizers(current);
        let mut after = wanted.clone();
        before.sort();
        after.sort();
        before == after
    };
    if !unchanged {
        marked["metadata"]["finalizers"] = json!(wanted);
    }
    let meta = &current["metadata"];
    let already_deleting = meta["deletionTimestamp"].is_string();
    if kind.group.is_empty() && kind.plural == "pods" {
        let grace = pod_grace(current, options);
        if grace > 0 {
            let existing = meta["deletionGracePeriodSeconds"].as_i64();
            if already_deleting && existing.is_some_and(|existing| existing <= grace) {
                // A deletion in progress can only be shortened.
                return Plan::Mark(marked);
            }
            let deadline = jiff::Timestamp::now() + jiff::SignedDuration::from_secs(grace);
            marked["metadata"]["deletionTimestamp"] =
                json!(super::timestamps::format_time(deadline));
            marked["metadata"]["deletionGracePeriodSeconds"] = json!(grace);
            return Plan::Mark(marked);
        }
    }
    if kind.group.is_empty() && kind.plural == "namespaces" {
        let content_finalizers = current["spec"]["finalizers"]
            .as_array()
            .is_some_and(|f| !f.is_empty());
        if content_finalizers || !wanted.is_empty() {
            // The namespace controller empties it, then drops the `kubernetes` finalizer.
            if !already_deleting {
                marked["metadata"]["deletionTimestamp"] = json!(now_rfc3339());
            }
            marked["status"]["phase"] = json!("Terminating");
            return Plan::Mark(marked);
        }
    }
    if wanted.is_empty() {
        return Plan::Remove;
    }
    if !already_deleting {
        marked["metadata"]["deletionTimestamp"] = json!(now_rfc3339());
    }
    marked["metadata"]["deletionGracePeriodSeconds"] = json!(0);
    Plan::Mark(marked)
}

/// The grace a pod's deletion gets: none for pods that are not running anywhere (unbound, or
/// finished), else the request's or the pod's own.
fn pod_grace(pod: &Value, options: &DeleteOptions) -> i64 {
    let bound = pod["spec"]["nodeName"]
        .as_str()
        .is_some_and(|node| !node.is_empty());
    if !bound || crate::conditions::is_finished(pod) {
        return 0;
    }
    options
        .grace_period_seconds
        .or_else(|| pod["spec"]["terminationGracePeriodSeconds"].as_i64())
        .unwrap_or(30)
        .max(0)
}

/// An update that leaves a deleting object without finalizers (and not waiting on a graceful
/// stop) completes its deletion.
pub fn ready_to_remove(object: &Value) -> bool {
    let meta = &object["metadata"];
    meta["deletionTimestamp"].is_string()
        && finalizers(object).is_empty()
        && meta["deletionGracePeriodSeconds"].as_i64().unwrap_or(0) == 0
}
