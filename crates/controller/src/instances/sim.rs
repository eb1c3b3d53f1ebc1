//! kube-sim's cloud as an instance provider: `sim:///<node>` machines behind
//! `/sim/v1/instances` on the simulator's own address, reached through the Kubernetes client.

use futures::FutureExt;
use futures::future::BoxFuture;

use super::{InstanceError, InstanceProvider, InstanceState, Power, ProviderId};

const SCHEME: &str = "sim";

#[derive(Clone)]
pub struct SimInstances {
    client: kube::Client,
}

impl std::fmt::Debug for SimInstances {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimInstances").finish_non_exhaustive()
    }
}

impl SimInstances {
    pub fn new(client: kube::Client) -> Self {
        Self { client }
    }

    fn path(id: &ProviderId) -> Result<String, InstanceError> {
        id.machine(SCHEME)
            .map(|machine| format!("/sim/v1/instances/{machine}"))
            .ok_or_else(|| InstanceError::UnknownScheme(id.clone()))
    }

    async fn call(
        &self,
        method: http::Method,
        path: &str,
    ) -> Result<Option<String>, InstanceError> {
        let request = http::Request::builder()
            .method(method)
            .uri(path)
            .body(Vec::new())
            .map_err(|error| InstanceError::Refused(error.to_string()))?;
        match self.client.request_text(request).await {
            Ok(body) => Ok(Some(body)),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(None),
            Err(kube::Error::Api(status)) if (400..500).contains(&status.code) => {
                Err(InstanceError::Refused(format!("{path}: {}", status.code)))
            }
            Err(error) => Err(InstanceError::Transient(format!("{path}: {error}"))),
        }
    }
}

impl InstanceProvider for SimInstances {
    fn name(&self) -> &'static str {
        "sim"
    }

    fn state<'a>(
        &'a self,
        id: &'a ProviderId,
    ) -> BoxFuture<'a, Result<InstanceState, InstanceError>> {
        async move {
            let path = Self::path(id)?;
            let Some(body) = self.call(http::Method::GET, &path).await? else {
                return Ok(InstanceState::NotFound);
            };
            let instance: serde_json::Value = serde_json::from_str(&body)
                .map_err(|error| InstanceError::Transient(format!("{path}: {error}")))?;
            let word = instance["state"].as_str().unwrap_or_default();
            InstanceState::parse(word).ok_or_else(|| {
                InstanceError::Refused(format!("{path}: unknown instance state {word:?}"))
            })
        }
        .boxed()
    }

    fn terminate<'a>(&'a self, id: &'a ProviderId) -> BoxFuture<'a, Result<(), InstanceError>> {
        async move {
            let path = Self::path(id)?;
            // Gone already is what was asked for.
            self.call(http::Method::DELETE, &path).await.map(drop)
        }
        .boxed()
    }

    fn power_unsupported(&self) -> Option<&'static str> {
        None
    }

    fn power<'a>(
        &'a self,
        id: &'a ProviderId,
        power: Power,
    ) -> BoxFuture<'a, Result<(), InstanceError>> {
        async move {
            let path = format!("{}/{}", Self::path(id)?, power.as_str());
            match self.call(http::Method::POST, &path).await? {
                Some(_) => Ok(()),
                None => Err(InstanceError::Refused(format!("{path}: no such machine"))),
            }
        }
        .boxed()
    }
}
