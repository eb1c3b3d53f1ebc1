//! Every provider call counted by provider, call and result, the same for every provider, so
//! a dashboard shows a failing cloud or BMC whichever it is.

use std::sync::Arc;

use futures::FutureExt;
use futures::future::BoxFuture;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

use super::{InstanceError, InstanceProvider, InstanceState, Power, ProviderId};
use nodegrace_core::telemetry::ProgramRegistry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CallLabels {
    /// `aws`, `cluster-api`, `redfish`, `exec`, `sim`.
    pub provider: &'static str,
    /// `state`, `terminate`, `power-off`, `power-on`.
    pub call: &'static str,
    /// The state answered (`running`, `not-found`, …), `accepted`, or the error's kind
    /// (`transient`, `refused`, `bad-provider-id`, …).
    pub result: &'static str,
}

#[derive(Debug, Clone, Default)]
pub struct ProviderMetrics {
    pub calls: Family<CallLabels, Counter>,
}

impl ProviderMetrics {
    pub fn register(&self, registry: &mut ProgramRegistry) {
        nodegrace_core::register_metrics!(registry, self, {
            calls as "instance_provider_calls":
                "Calls to the instance provider, by provider, call and result (the state answered, accepted, or the kind of failure)",
        });
    }

    fn count(&self, provider: &'static str, call: &'static str, result: &'static str) {
        self.calls
            .get_or_create(&CallLabels {
                provider,
                call,
                result,
            })
            .inc();
    }
}

/// A provider whose calls are counted.
#[derive(Debug)]
pub struct Metered {
    inner: Arc<dyn InstanceProvider>,
    metrics: ProviderMetrics,
}

impl Metered {
    pub fn wrap(
        inner: Arc<dyn InstanceProvider>,
        metrics: ProviderMetrics,
    ) -> Arc<dyn InstanceProvider> {
        Arc::new(Self { inner, metrics })
    }

    fn done<T>(&self, call: &'static str, result: &Result<T, InstanceError>, ok: &'static str) {
        let result = match result {
            Ok(_) => ok,
            Err(error) => error.kind(),
        };
        self.metrics.count(self.inner.name(), call, result);
    }
}

impl InstanceProvider for Metered {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn state<'a>(
        &'a self,
        id: &'a ProviderId,
    ) -> BoxFuture<'a, Result<InstanceState, InstanceError>> {
        async move {
            let state = self.inner.state(id).await;
            let answered = state.as_ref().map_or("", |state| state.as_str());
            self.done("state", &state, answered);
            state
        }
        .boxed()
    }

    fn terminate<'a>(&'a self, id: &'a ProviderId) -> BoxFuture<'a, Result<(), InstanceError>> {
        async move {
            let accepted = self.inner.terminate(id).await;
            self.done("terminate", &accepted, "accepted");
            accepted
        }
        .boxed()
    }

    fn terminated_as(&self) -> InstanceState {
        self.inner.terminated_as()
    }

    fn power_unsupported(&self) -> Option<&'static str> {
        self.inner.power_unsupported()
    }

    fn power<'a>(
        &'a self,
        id: &'a ProviderId,
        power: Power,
    ) -> BoxFuture<'a, Result<(), InstanceError>> {
        async move {
            let accepted = self.inner.power(id, power).await;
            self.done(power.as_str(), &accepted, "accepted");
            accepted
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Cloud;

    impl InstanceProvider for Cloud {
        fn name(&self) -> &'static str {
            "test"
        }

        fn state<'a>(
            &'a self,
            id: &'a ProviderId,
        ) -> BoxFuture<'a, Result<InstanceState, InstanceError>> {
            let answer = if id.as_str() == "test:///gone" {
                Ok(InstanceState::NotFound)
            } else {
                Err(InstanceError::Transient("timeout".to_owned()))
            };
            async move { answer }.boxed()
        }

        fn terminate<'a>(&'a self, _: &'a ProviderId) -> BoxFuture<'a, Result<(), InstanceError>> {
            async { Ok(()) }.boxed()
        }
    }

    #[tokio::test]
    async fn calls_are_counted_by_provider_call_and_result() {
        let metrics = ProviderMetrics::default();
        let metered = Metered::wrap(Arc::new(Cloud), metrics.clone());
        metered
            .state(&ProviderId::new("test:///gone"))
            .await
            .unwrap();
        metered
            .state(&ProviderId::new("test:///x"))
            .await
            .unwrap_err();
        metered
            .terminate(&ProviderId::new("test:///x"))
            .await
            .unwrap();
        metered
            .power(&ProviderId::new("test:///x"), Power::Off)
            .await
            .unwrap_err();
        let count = |call, result| {
            metrics
                .calls
                .get_or_create(&CallLabels {
                    provider: "test",
                    call,
                    result,
                })
                .get()
        };
        assert_eq!(count("state", "not-found"), 1);
        assert_eq!(count("state", "transient"), 1);
        assert_eq!(count("terminate", "accepted"), 1);
        assert_eq!(count("power-off", "unsupported"), 1);
    }
}
