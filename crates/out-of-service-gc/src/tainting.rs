//! `--auto-taint-after`: a node NotReady that long AND confirmed powered off gets the taint. The
//! confirmation is the operator's in the KEP; here it comes from a fencing agent (the
//! `nodegrace.io/fenced=true` annotation) or from the cloud (`InstanceProvider`). Never without.

use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Api;
use nodegrace_core::instances::{InstanceProvider, InstanceState, ProviderId};
use nodegrace_core::k8s::events::EventReport;
use nodegrace_core::k8s::nodes::{node_reference, taint_with_key};
use nodegrace_core::k8s::taints::change_taints;

use crate::cleanup::{PassError, Shared};
use crate::qualify::{EXPECTED_EFFECT, OUT_OF_SERVICE_TAINT, not_ready_for};
use crate::status::{AUTO_TAINT_VALUE, FENCED_ANNOTATION};

#[derive(Debug, Clone)]
pub struct AutoTaint {
    pub after: Duration,
    pub provider: Option<Arc<dyn InstanceProvider>>,
}

/// Why a node may (or may not) be tainted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Confirmation {
    Fenced,
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

fn fenced(node: &Node) -> bool {
    node.metadata
        .annotations
        .as_ref()
        .and_then(|annotations| annotations.get(FENCED_ANNOTATION))
        .is_some_and(|value| value == "true")
}

impl AutoTaint {
    pub async fn confirm(&self, node: &Node) -> Confirmation {
        if fenced(node) {
            return Confirmation::Fenced;
        }
        let Some(provider) = &self.provider else {
            return Confirmation::Unconfirmed(format!(
                "no {FENCED_ANNOTATION}=true annotation, and no --instance-provider to ask"
            ));
        };
        let id = match ProviderId::of(node) {
            Ok(id) => id,
            Err(error) => return Confirmation::Unconfirmed(error.to_string()),
        };
        match provider.state(&id).await {
            Ok(state) if state.powered_off() => Confirmation::Instance(state),
            Ok(state) => Confirmation::Unconfirmed(format!(
                "no {FENCED_ANNOTATION}=true annotation, and machine {id} is {state:?}"
            )),
            Err(error) => Confirmation::Unconfirmed(format!("cannot ask about {id}: {error}")),
        }
    }

    /// Reads the node live, and taints it when it is due and confirmed; the decision is made
    /// again on the very version of the node that gets written.
    pub async fn attempt(&self, shared: &Shared, name: &str) -> Result<Attempt, PassError> {
        let nodes: Api<Node> = Api::all(shared.client.clone());
        let read_error = |error| PassError::Api {
            what: format!("read node {name}"),
            source: error,
        };
        let Some(node) = nodes.get_opt(name).await.map_err(read_error)? else {
            return Ok(Attempt::NotDue);
        };
        let now = Timestamp::now();
        if due_at(&node, self.after, now).is_none_or(|due| due > now) {
            return Ok(Attempt::NotDue);
        }
        let confirmation = self.confirm(&node).await;
        if let Confirmation::Unconfirmed(why) = confirmation {
            return Ok(Attempt::Unconfirmed(why));
        }
        let after = self.after;
        let taint = Taint {
            key: OUT_OF_SERVICE_TAINT.to_owned(),
            value: Some(AUTO_TAINT_VALUE.to_owned()),
            effect: EXPECTED_EFFECT.to_owned(),
            time_added: Some(Time(now)),
        };
        let added = change_taints(&nodes, name, |current, taints| {
            if due_at(current, after, Timestamp::now()).is_none_or(|due| due > Timestamp::now()) {
                return false;
            }
            taints.push(taint.clone());
            true
        })
        .await
        .map_err(|error| PassError::Api {
            what: format!("taint node {name}"),
            source: error,
        })?;
        if !added {
            return Ok(Attempt::NotDue);
        }
        shared.metrics.taints_added.inc();
        let because = match confirmation {
            Confirmation::Fenced => format!("it is annotated {FENCED_ANNOTATION}=true"),
            Confirmation::Instance(state) => format!("its machine is {state:?}"),
            Confirmation::Unconfirmed(_) => unreachable!("returned above"),
        };
        tracing::info!(node = name, %because, "out-of-service taint added");
        shared.reporter.event(EventReport::normal(
            node_reference(name),
            "OutOfServiceTaintAdded",
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
    use nodegrace_core::instances::InstanceError;
    use serde_json::json;

    fn node(ready: &str, annotations: &serde_json::Value, taints: &serde_json::Value) -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": "n", "annotations": annotations},
            "spec": {"providerID": "sim:///n", "taints": taints},
            "status": {"conditions": [{"type": "Ready", "status": ready, "lastTransitionTime": "2026-01-01T00:00:00Z"}]},
        }))
        .unwrap()
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
        let fenced = node("Unknown", &json!({FENCED_ANNOTATION: "true"}), &json!(null));
        let not_fenced = node(
            "Unknown",
            &json!({FENCED_ANNOTATION: "false"}),
            &json!(null),
        );
        assert_eq!(with(None).confirm(&fenced).await, Confirmation::Fenced);
        assert!(matches!(
            with(None).confirm(&plain).await,
            Confirmation::Unconfirmed(_)
        ));
        assert!(matches!(
            with(None).confirm(&not_fenced).await,
            Confirmation::Unconfirmed(_)
        ));
        for (state, confirmed) in [
            (InstanceState::Stopped, true),
            (InstanceState::Terminated, true),
            (InstanceState::Running, false),
        ] {
            let answer = with(Some(Machine(Ok(state)))).confirm(&plain).await;
            assert_eq!(
                answer == Confirmation::Instance(state),
                confirmed,
                "{state:?}: {answer:?}"
            );
        }
        let failing = with(Some(Machine(Err("timeout".into()))))
            .confirm(&plain)
            .await;
        assert!(
            matches!(&failing, Confirmation::Unconfirmed(why) if why.contains("timeout")),
            "{failing:?}"
        );
    }
}
