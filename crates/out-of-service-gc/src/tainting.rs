//! `--auto-taint-after`: a node NotReady that long AND confirmed powered off gets the taint. The
//! confirmation is the operator's in the KEP; here it comes from a fencing agent (the
//! `nodegrace.io/fenced` annotation) or from the cloud (`InstanceProvider`). Never without.
//!
//! A fence belongs to one outage: its annotation carries the time the machine was fenced, and
//! counts only when that is later than the node's turn to NotReady (the Ready condition's
//! `lastTransitionTime`). A fence from an earlier outage — or a bare `true` — confirms nothing;
//! removing the taint (`--auto-untaint`) removes the annotation too.

use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use nodegrace_controller::instances::{InstanceProvider, InstanceState, NodeMachine};
use nodegrace_core::k8s::events::EventReport;
use nodegrace_core::k8s::node_identity::{NodeIdentity, Updated};
use nodegrace_core::k8s::nodes::{node_reference, taint_with_key};
use nodegrace_core::k8s::taints::put_taint;

use crate::api::{
    AUTO_TAINT_VALUE, EXPECTED_EFFECT, FENCED_ANNOTATION, OUT_OF_SERVICE_TAINT, auto_taint,
};
use crate::conditions::Reason;
use crate::qualify::{not_ready_for, not_ready_since};
use crate::shared::{PassError, Shared};

#[derive(Debug, Clone)]
pub struct AutoTaint {
    pub after: Duration,
    pub provider: Option<Arc<dyn InstanceProvider>>,
}

/// Why a node may (or may not) be tainted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Confirmation {
    /// Fenced at this time, during the current NotReady period.
    Fenced(Timestamp),
    Instance(InstanceState),
    Unconfirmed(String),
}

/// What an attempt did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempt {
    Tainted,
    /// Not (or no longer) a candidate: Ready, tainted already, or not NotReady long enough.
    NotDue,
    Unconfirmed(String),
}

/// When `node` becomes a candidate: NotReady since its Ready transition, plus `after`. `None`
/// when it is Ready, already tainted, or does not say since when it is NotReady.
pub fn due_at(node: &Node, after: Duration, now: Timestamp) -> Option<Timestamp> {
    if taint_with_key(node, OUT_OF_SERVICE_TAINT).is_some() {
        return None;
    }
    let down_for = not_ready_for(node, now)?;
    let since = now.checked_sub(down_for).ok()?;
    since.checked_add(after).ok()
}

/// What the fencing annotation says about the current outage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fence {
    /// No annotation.
    Absent,
    /// Fenced at this time, after the node turned NotReady.
    Current(Timestamp),
    /// Present, but it does not confirm this outage: why.
    Stale(String),
}

/// Reads `nodegrace.io/fenced`: an RFC 3339 time later than the Ready condition's
/// `lastTransitionTime` of a node that is not Ready.
pub fn fence(node: &Node) -> Fence {
    let Some(value) = node
        .metadata
        .annotations
        .as_ref()
        .and_then(|annotations| annotations.get(FENCED_ANNOTATION))
    else {
        return Fence::Absent;
    };
    let Ok(fenced) = value.parse::<Timestamp>() else {
        return Fence::Stale(format!(
            "{FENCED_ANNOTATION}={value:?} is not the time of the fence: a fencing agent writes \
             when it powered the machine off, in RFC 3339 (e.g. 2026-01-01T12:00:00Z), after the \
             node turned NotReady"
        ));
    };
    // The transition time has whole seconds: a fence within its second could be from before
    // it, so only a later second counts.
    let fenced_second = fenced
        .round(
            jiff::TimestampRound::new()
                .smallest(jiff::Unit::Second)
                .mode(jiff::RoundMode::Trunc),
        )
        .unwrap_or(fenced);
    match not_ready_since(node) {
        Some(since) if fenced_second > since => Fence::Current(fenced),
        Some(since) => Fence::Stale(format!(
            "{FENCED_ANNOTATION}={value} is not from a later second than the node's turn to \
             NotReady at {since}: it may confirm an earlier outage, not this one"
        )),
        None => Fence::Stale(format!(
            "{FENCED_ANNOTATION}={value}, but the node is Ready or does not say since when it \
             is NotReady"
        )),
    }
}

impl AutoTaint {
    /// Whether `node` (a fresh read of `identity`) is confirmed powered off.
    pub async fn confirm(&self, identity: &NodeIdentity, node: &Node) -> Confirmation {
        let fenced = match fence(node) {
            Fence::Current(at) => return Confirmation::Fenced(at),
            Fence::Absent => format!("no {FENCED_ANNOTATION} annotation"),
            Fence::Stale(why) => why,
        };
        let Some(provider) = &self.provider else {
            return Confirmation::Unconfirmed(format!(
                "{fenced}, and no --instance-provider to ask"
            ));
        };
        let id = match identity.machine(node) {
            Ok(id) => id,
            Err(error) => return Confirmation::Unconfirmed(error.to_string()),
        };
        match provider.state(&id).await {
            Ok(state) if state.powered_off() => Confirmation::Instance(state),
            Ok(state) => {
                Confirmation::Unconfirmed(format!("{fenced}, and machine {id} is {state:?}"))
            }
            Err(error) => {
                Confirmation::Unconfirmed(format!("{fenced}, and cannot ask about {id}: {error}"))
            }
        }
    }

    /// Reads the node live, and taints it when it is due and confirmed; the decision is made
    /// again on the very version of the node that gets written.
    pub async fn attempt(
        &self,
        shared: &Shared,
        identity: &NodeIdentity,
    ) -> Result<Attempt, PassError> {
        let name = identity.name();
        let read_error = |error| PassError::Api {
            what: format!("read node {name}"),
            source: error,
        };
        // Gone, or a namesake (whose own timer decides for it).
        let Some(node) = identity.read(&shared.client).await.map_err(read_error)? else {
            return Ok(Attempt::NotDue);
        };
        let now = Timestamp::now();
        if due_at(&node, self.after, now).is_none_or(|due| due > now) {
            return Ok(Attempt::NotDue);
        }
        let confirmation = self.confirm(identity, &node).await;
        if let Confirmation::Unconfirmed(why) = confirmation {
            return Ok(Attempt::Unconfirmed(why));
        }
        let after = self.after;
        let taint = auto_taint(now);
        let fenced = matches!(confirmation, Confirmation::Fenced(_));
        // Decided again on the version written (which the update makes this very Node):
        // still due, and its fence still stands.
        let added = identity
            .update(&shared.client, |current| {
                let now = Timestamp::now();
                if due_at(current, after, now).is_none_or(|due| due > now)
                    || (fenced && !matches!(fence(current), Fence::Current(_)))
                {
                    return false;
                }
                put_taint(current, &taint)
            })
            .await
            .map_err(|error| PassError::update(format!("taint node {name}"), error))?;
        if !matches!(added, Updated::Written(_)) {
            return Ok(Attempt::NotDue);
        }
        shared.metrics.taints_added.inc();
        let because = match confirmation {
            Confirmation::Fenced(at) => format!("fenced at {at} ({FENCED_ANNOTATION})"),
            Confirmation::Instance(state) => format!("its machine is {state:?}"),
            Confirmation::Unconfirmed(_) => unreachable!("returned above"),
        };
        tracing::info!(node = name, %because, "out-of-service taint added");
        shared.reporter.event(EventReport::normal(
            node_reference(name),
            Reason::OutOfServiceTaintAdded.as_str(),
            "OutOfServiceTaint",
            format!(
                "Added {OUT_OF_SERVICE_TAINT}={AUTO_TAINT_VALUE}:{EXPECTED_EFFECT}: NotReady for \
                 more than {}s and confirmed powered off ({because})",
                self.after.as_secs()
            ),
        ));
        Ok(Attempt::Tainted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;
    use futures::future::BoxFuture;
    use nodegrace_controller::instances::{InstanceError, ProviderId};
    use serde_json::json;

    fn node(ready: &str, annotations: &serde_json::Value, taints: &serde_json::Value) -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": "n", "uid": "u", "annotations": annotations},
            "spec": {"providerID": "sim:///n", "taints": taints},
            "status": {"conditions": [{"type": "Ready", "status": ready, "lastTransitionTime": "2026-01-01T00:00:00Z"}]},
        }))
        .unwrap()
    }

    fn identity(node: &Node) -> NodeIdentity {
        NodeIdentity::of(node).unwrap()
    }

    #[test]
    fn a_node_is_due_after_being_not_ready_that_long() {
        let now: Timestamp = "2026-01-01T00:01:00Z".parse().unwrap();
        let after = Duration::from_secs(300);
        let down = node("Unknown", &json!({}), &json!(null));
        assert_eq!(
            due_at(&down, after, now),
            Some("2026-01-01T00:05:00Z".parse().unwrap())
        );
        assert_eq!(
            due_at(&node("True", &json!({}), &json!(null)), after, now),
            None
        );
        let tainted = node(
            "False",
            &json!({}),
            &json!([{"key": OUT_OF_SERVICE_TAINT, "effect": "NoExecute"}]),
        );
        assert_eq!(due_at(&tainted, after, now), None);
    }

    #[derive(Debug)]
    struct Machine(Result<InstanceState, String>);

    impl InstanceProvider for Machine {
        fn name(&self) -> &'static str {
            "test"
        }

        fn state<'a>(
            &'a self,
            _: &'a ProviderId,
        ) -> BoxFuture<'a, Result<InstanceState, InstanceError>> {
            let answer = self.0.clone().map_err(InstanceError::Transient);
            async move { answer }.boxed()
        }

        fn terminate<'a>(&'a self, _: &'a ProviderId) -> BoxFuture<'a, Result<(), InstanceError>> {
            async { Ok(()) }.boxed()
        }
    }

    #[tokio::test]
    async fn only_a_fence_or_a_powered_off_machine_confirms() {
        let with = |provider: Option<Machine>| AutoTaint {
            after: Duration::ZERO,
            provider: provider.map(|p| Arc::new(p) as Arc<dyn InstanceProvider>),
        };
        let plain = node("Unknown", &json!({}), &json!(null));
        // The node turned NotReady at 2026-01-01T00:00:00Z.
        let fenced = node(
            "Unknown",
            &json!({FENCED_ANNOTATION: "2026-01-01T00:02:00Z"}),
            &json!(null),
        );
        assert_eq!(
            with(None).confirm(&identity(&fenced), &fenced).await,
            Confirmation::Fenced("2026-01-01T00:02:00Z".parse().unwrap())
        );
        assert!(matches!(
            with(None).confirm(&identity(&plain), &plain).await,
            Confirmation::Unconfirmed(_)
        ));
        for (value, why) in [
            ("true", "not the time of the fence"),
            ("false", "not the time of the fence"),
            ("2025-12-31T23:00:00Z", "earlier outage"),
            ("2026-01-01T00:00:00Z", "earlier outage"),
            ("2026-01-01T00:00:00.900Z", "earlier outage"),
        ] {
            let stale = node("Unknown", &json!({FENCED_ANNOTATION: value}), &json!(null));
            let answer = with(None).confirm(&identity(&stale), &stale).await;
            assert!(
                matches!(&answer, Confirmation::Unconfirmed(message) if message.contains(why)),
                "{value}: {answer:?}"
            );
        }
        let ready = node(
            "True",
            &json!({FENCED_ANNOTATION: "2026-01-01T00:02:00Z"}),
            &json!(null),
        );
        assert!(matches!(fence(&ready), Fence::Stale(_)));
        for (state, confirmed) in [
            (InstanceState::Stopped, true),
            (InstanceState::Terminated, true),
            (InstanceState::Running, false),
            (InstanceState::NotFound, false),
        ] {
            let answer = with(Some(Machine(Ok(state))))
                .confirm(&identity(&plain), &plain)
                .await;
            assert_eq!(
                answer == Confirmation::Instance(state),
                confirmed,
                "{state:?}: {answer:?}"
            );
        }
        let failing = with(Some(Machine(Err("timeout".into()))))
            .confirm(&identity(&plain), &plain)
            .await;
        assert!(
            matches!(&failing, Confirmation::Unconfirmed(why) if why.contains("timeout")),
            "{failing:?}"
        );
    }
}
