//! AWS EC2 as an instance provider. A machine is `aws:///<availability-zone>/<instance-id>`;
//! its region is read from the zone (or `--aws-region` when the id has none). State is
//! DescribeInstances, terminate is TerminateInstances, power is StopInstances with `Force` and
//! StartInstances. Describe and terminate calls of many nodes are batched per region, as
//! Karpenter's batcher does; a batch that fails is retried id by id, so one protected or
//! unknown machine does not fail the others.
//!
//! A region the endpoint does not serve is an error, never "not found": EC2 answers an id of
//! another region as unknown, and an unknown machine is what the controllers release.

mod credentials;
mod query;
mod xml;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};

pub use credentials::{CredentialChain, CredentialsError};
use query::{CallError, Endpoint, QueryClient};

use super::batch::{Answers, Batcher, Window};
use super::http::{HttpClient, Trust};
use super::{InstanceError, InstanceProvider, InstanceState, Power, ProviderId};

const SCHEME: &str = "aws";
/// Karpenter's windows: 100 ms without a new call, 1 s at most.
const TERMINATE_WINDOW: Window = Window {
    idle: Duration::from_millis(100),
    max: Duration::from_secs(1),
    max_items: 500,
};
/// EC2 takes at most 200 values in one filter.
const DESCRIBE_WINDOW: Window = Window {
    idle: Duration::from_millis(100),
    max: Duration::from_secs(1),
    max_items: 200,
};
/// Ids of a failed batch retried alone, this many at once.
const SINGLE_RETRIES_AT_ONCE: usize = 8;

/// The `--aws-*` settings.
#[derive(Debug, Clone, Default)]
pub struct AwsOptions {
    /// One endpoint for every call (a VPC endpoint, another partition, a test server); it
    /// serves `region` only.
    pub endpoint_url: Option<http::Uri>,
    /// `--aws-region` or `AWS_REGION`: the region of machines whose id names no zone, and the
    /// one `endpoint_url` serves.
    pub region: Option<String>,
    /// STS for a web identity; `https://sts.<region>.amazonaws.com` by default.
    pub sts_endpoint_url: Option<http::Uri>,
    pub timeout: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum AwsSetupError {
    #[error(
        "--aws-endpoint-url needs the region it serves: set --aws-region (or AWS_REGION), so a \
         machine of another region is held instead of reported as unknown"
    )]
    EndpointWithoutRegion,
    #[error("AWS credentials")]
    Credentials(#[from] CredentialsError),
    #[error("the HTTPS client")]
    Http(#[from] super::http::HttpError),
}

struct Inner {
    client: QueryClient,
    endpoint: Option<Endpoint>,
    region: Option<String>,
}

pub struct AwsInstances {
    inner: Arc<Inner>,
    credentials: &'static str,
    descriptions: Batcher<InstanceState>,
    terminations: Batcher<()>,
}

impl std::fmt::Debug for AwsInstances {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AwsInstances")
            .field("endpoint", &self.inner.endpoint)
            .field("region", &self.inner.region)
            .field("credentials", &self.credentials)
            .finish_non_exhaustive()
    }
}

/// A machine named by a providerID: its instance id and region.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Machine {
    instance_id: String,
    region: String,
}

impl AwsInstances {
    /// The provider, with credentials from the environment (`env`, so tests pass their own).
    /// Must run inside a Tokio runtime: the batchers start their tasks here.
    pub fn new(
        options: &AwsOptions,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, AwsSetupError> {
        let region = options.region.clone().filter(|r| !r.trim().is_empty());
        let endpoint = match (&options.endpoint_url, &region) {
            (Some(url), Some(region)) => Some(Endpoint {
                url: url.clone(),
                region: region.clone(),
            }),
            (Some(_), None) => return Err(AwsSetupError::EndpointWithoutRegion),
            (None, _) => None,
        };
        let http = HttpClient::new(&Trust::PublicRoots, options.timeout)?;
        let sts = options.sts_endpoint_url.clone().unwrap_or_else(|| {
            let host = region.as_deref().map_or_else(
                || "sts.amazonaws.com".to_owned(),
                |region| format!("sts.{region}.{}", dns_suffix(region)),
            );
            format!("https://{host}/").parse().expect("a valid STS URL")
        });
        let chain = Arc::new(CredentialChain::from_env(env, sts, http.clone())?);
        let credentials = chain.describe();
        let inner = Arc::new(Inner {
            client: QueryClient::new(http, chain),
            endpoint,
            region,
        });
        let describing = Arc::clone(&inner);
        let terminating = Arc::clone(&inner);
        Ok(Self {
            descriptions: Batcher::start(
                DESCRIBE_WINDOW,
                Arc::new(move |region, ids| {
                    let inner = Arc::clone(&describing);
                    async move { inner.describe(&region, ids).await }.boxed()
                }),
            ),
            terminations: Batcher::start(
                TERMINATE_WINDOW,
                Arc::new(move |region, ids| {
                    let inner = Arc::clone(&terminating);
                    async move { inner.terminate(&region, ids).await }.boxed()
                }),
            ),
            inner,
            credentials,
        })
    }

    /// Where the credentials come from, for the start-up log.
    pub fn credentials(&self) -> &'static str {
        self.credentials
    }

    fn machine(&self, id: &ProviderId) -> Result<Machine, InstanceError> {
        let node = id.node().unwrap_or("(none)").to_owned();
        let bad = |reason: String| InstanceError::BadProviderId {
            node: node.clone(),
            reason,
        };
        let rest = id.machine(SCHEME).ok_or_else(|| {
            bad(format!(
                "spec.providerID {id} is not an EC2 machine (aws:///<availability-zone>/<instance-id>); \
                 check --instance-provider"
            ))
        })?;
        let (zone, instance_id) = match rest.rsplit_once('/') {
            Some((zone, instance_id)) => (Some(zone), instance_id),
            None => (None, rest),
        };
        if !is_instance_id(instance_id) {
            return Err(bad(format!(
                "spec.providerID {id}: {instance_id:?} is not an EC2 instance id (i-<hex>)"
            )));
        }
        let region = match zone {
            Some(zone) => region_of_zone(zone).ok_or_else(|| {
                bad(format!(
                    "spec.providerID {id}: {zone:?} is not an availability zone (e.g. eu-west-1a)"
                ))
            })?,
            None => self.inner.region.clone().ok_or_else(|| {
                bad(format!(
                    "spec.providerID {id} names no availability zone; set --aws-region (or \
                     AWS_REGION) to the machines' region"
                ))
            })?,
        };
        self.inner.endpoint(&region)?;
        Ok(Machine {
            instance_id: instance_id.to_owned(),
            region,
        })
    }
}

impl Inner {
    /// The endpoint for a region's machines: the configured one only for its own region.
    fn endpoint(&self, region: &str) -> Result<Endpoint, InstanceError> {
        match &self.endpoint {
            Some(endpoint) if endpoint.region == region => Ok(endpoint.clone()),
            Some(endpoint) => Err(InstanceError::Refused(format!(
                "the machine is in region {region}, but --aws-endpoint-url {} serves region {} \
                 (--aws-region); it is held rather than asked where it does not exist",
                endpoint.url, endpoint.region
            ))),
            None => Ok(Endpoint {
                url: format!("https://ec2.{region}.{}/", dns_suffix(region))
                    .parse()
                    .map_err(|_| {
                        InstanceError::Refused(format!("{region:?} is not a region name"))
                    })?,
                region: region.to_owned(),
            }),
        }
    }

    /// The states of `ids`, by a filter (an unknown id is left out of the answer, where asking
    /// by id would fail the whole call).
    async fn describe(&self, region: &str, ids: Vec<String>) -> Answers<InstanceState> {
        let failed = |error: InstanceError| all(&ids, &error);
        let endpoint = match self.endpoint(region) {
            Ok(endpoint) => endpoint,
            Err(error) => return failed(error),
        };
        let mut params: Vec<(String, String)> =
            vec![("Filter.1.Name".to_owned(), "instance-id".to_owned())];
        params.extend(
            ids.iter()
                .enumerate()
                .map(|(n, id)| (format!("Filter.1.Value.{}", n + 1), id.clone())),
        );
        let mut found = HashMap::new();
        let mut page: Option<String> = None;
        loop {
            let mut paged = params.clone();
            paged.extend(page.take().map(|token| ("NextToken".to_owned(), token)));
            let text = match self
                .client
                .call(&endpoint, "DescribeInstances", &paged)
                .await
            {
                Ok(text) => text,
                Err(error) => return failed(error.classify()),
            };
            let (listed, next) = match xml::instances(&text, "instanceState") {
                Ok(read) => read,
                Err(error) => {
                    return failed(InstanceError::Transient(format!(
                        "ec2:DescribeInstances: {error}"
                    )));
                }
            };
            for instance in listed {
                found.insert(instance.id, state_of(&instance.state));
            }
            match next {
                Some(token) if !token.is_empty() => page = Some(token),
                _ => break,
            }
        }
        ids.into_iter()
            .map(|id| {
                let state = match found.remove(&id) {
                    Some(Some(state)) => Ok(state),
                    Some(None) => Err(InstanceError::Transient(format!(
                        "ec2:DescribeInstances: {id} is in a state this program does not know"
                    ))),
                    None => Ok(InstanceState::NotFound),
                };
                (id, state)
            })
            .collect()
    }

    /// Terminates `ids` in one call; when it fails, each id alone, so the machine that made
    /// it fail (protected, unknown) fails alone.
    async fn terminate(&self, region: &str, ids: Vec<String>) -> Answers<()> {
        let endpoint = match self.endpoint(region) {
            Ok(endpoint) => endpoint,
            Err(error) => return all(&ids, &error),
        };
        match self.terminate_some(&endpoint, &ids).await {
            Ok(answers) => answers,
            Err(error) if ids.len() == 1 => {
                HashMap::from([(ids[0].clone(), terminate_failure(error))])
            }
            Err(error) => {
                tracing::debug!(error = ?error, count = ids.len(), "a batched TerminateInstances failed; retrying each machine alone");
                futures::stream::iter(ids)
                    .map(|id| {
                        let endpoint = &endpoint;
                        async move {
                            let single = std::slice::from_ref(&id);
                            let answer = match self.terminate_some(endpoint, single).await {
                                Ok(mut answers) => answers.remove(&id).unwrap_or(Ok(())),
                                Err(error) => terminate_failure(error),
                            };
                            (id, answer)
                        }
                    })
                    .buffer_unordered(SINGLE_RETRIES_AT_ONCE)
                    .collect()
                    .await
            }
        }
    }

    async fn terminate_some(
        &self,
        endpoint: &Endpoint,
        ids: &[String],
    ) -> Result<Answers<()>, CallError> {
        let params = numbered("InstanceId", ids);
        let text = self
            .client
            .call(endpoint, "TerminateInstances", &params)
            .await?;
        let (listed, _) = xml::instances(&text, "currentState").map_err(|error| {
            CallError::Failed(InstanceError::Transient(format!(
                "ec2:TerminateInstances: {error}"
            )))
        })?;
        Ok(ids
            .iter()
            .map(|id| {
                let accepted = listed.iter().any(|instance| &instance.id == id);
                let answer = if accepted {
                    Ok(())
                } else {
                    Err(InstanceError::Transient(format!(
                        "ec2:TerminateInstances did not list {id} in its answer"
                    )))
                };
                (id.clone(), answer)
            })
            .collect())
    }

    async fn power(&self, machine: &Machine, power: Power) -> Result<(), InstanceError> {
        let endpoint = self.endpoint(&machine.region)?;
        let mut params = numbered("InstanceId", std::slice::from_ref(&machine.instance_id));
        let action = match power {
            Power::Off => {
                params.push(("Force".to_owned(), "true".to_owned()));
                "StopInstances"
            }
            Power::On => "StartInstances",
        };
        match self.client.call(&endpoint, action, &params).await {
            Ok(_) => Ok(()),
            Err(CallError::Api(error)) if error.is_not_found() => Err(InstanceError::Refused(
                format!("ec2:{action}: EC2 does not know {}", machine.instance_id),
            )),
            Err(error) => Err(error.classify()),
        }
    }
}

/// Terminating a machine EC2 does not know is done: it is gone (Karpenter's rule).
fn terminate_failure(error: CallError) -> Result<(), InstanceError> {
    match error {
        CallError::Api(error) if error.is_not_found() => Ok(()),
        other => Err(other.classify()),
    }
}

fn all<R>(ids: &[String], error: &InstanceError) -> Answers<R> {
    ids.iter()
        .map(|id| (id.clone(), Err(error.clone())))
        .collect()
}

fn numbered(name: &str, values: &[String]) -> Vec<(String, String)> {
    values
        .iter()
        .enumerate()
        .map(|(n, value)| (format!("{name}.{}", n + 1), value.clone()))
        .collect()
}

/// EC2's instance state names, as the contract has them.
fn state_of(name: &str) -> Option<InstanceState> {
    match name {
        "pending" | "running" => Some(InstanceState::Running),
        "stopping" | "shutting-down" => Some(InstanceState::Stopping),
        "stopped" => Some(InstanceState::Stopped),
        "terminated" => Some(InstanceState::Terminated),
        _ => None,
    }
}

fn is_instance_id(text: &str) -> bool {
    text.strip_prefix("i-").is_some_and(|hex| {
        matches!(hex.len(), 8 | 17) && hex.bytes().all(|byte| byte.is_ascii_hexdigit())
    })
}

/// The region of a zone: everything up to its first `-<digits>` (`eu-west-1a` → `eu-west-1`,
/// `us-gov-west-1b` → `us-gov-west-1`, the Local Zone `us-west-2-lax-1a` → `us-west-2`).
fn region_of_zone(zone: &str) -> Option<String> {
    let bytes = zone.as_bytes();
    let mut at = 0;
    while let Some(dash) = zone[at..].find('-').map(|found| at + found) {
        let digits = bytes[dash + 1..]
            .iter()
            .take_while(|byte| byte.is_ascii_digit())
            .count();
        if digits > 0 && dash > 0 {
            let end = dash + 1 + digits;
            let region = &zone[..end];
            let valid = region
                .bytes()
                .all(|byte| byte.is_ascii_lowercase() || byte.is_ascii_digit() || byte == b'-');
            return valid.then(|| region.to_owned());
        }
        at = dash + 1;
    }
    None
}

fn dns_suffix(region: &str) -> &'static str {
    if region.starts_with("cn-") {
        "amazonaws.com.cn"
    } else {
        "amazonaws.com"
    }
}

impl InstanceProvider for AwsInstances {
    fn name(&self) -> &'static str {
        SCHEME
    }

    fn state<'a>(
        &'a self,
        id: &'a ProviderId,
    ) -> BoxFuture<'a, Result<InstanceState, InstanceError>> {
        async move {
            let machine = self.machine(id)?;
            self.descriptions
                .call(&machine.region, &machine.instance_id)
                .await
        }
        .boxed()
    }

    fn terminate<'a>(&'a self, id: &'a ProviderId) -> BoxFuture<'a, Result<(), InstanceError>> {
        async move {
            let machine = self.machine(id)?;
            self.terminations
                .call(&machine.region, &machine.instance_id)
                .await
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
            let machine = self.machine(id)?;
            self.inner.power(&machine, power).await
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_are_read_from_zones() {
        for (zone, region) in [
            ("eu-west-1a", Some("eu-west-1")),
            ("us-gov-west-1b", Some("us-gov-west-1")),
            ("us-west-2-lax-1a", Some("us-west-2")),
            ("cn-north-1a", Some("cn-north-1")),
            ("us-east-1-wl1-bos-wlz-1", Some("us-east-1")),
            ("nowhere", None),
            ("-1a", None),
            ("EU-WEST-1a", None),
        ] {
            assert_eq!(region_of_zone(zone).as_deref(), region, "{zone}");
        }
        assert_eq!(dns_suffix("cn-north-1"), "amazonaws.com.cn");
    }

    #[test]
    fn instance_ids_and_states_are_checked() {
        assert!(is_instance_id("i-0123456789abcdef0"));
        assert!(is_instance_id("i-0123abcd"));
        assert!(!is_instance_id("i-xyz"));
        assert!(!is_instance_id("vol-0123abcd"));
        assert_eq!(state_of("pending"), Some(InstanceState::Running));
        assert_eq!(state_of("shutting-down"), Some(InstanceState::Stopping));
        assert_eq!(state_of("terminated"), Some(InstanceState::Terminated));
        assert_eq!(state_of("hibernating"), None);
    }

    fn provider(options: &AwsOptions) -> Result<AwsInstances, AwsSetupError> {
        AwsInstances::new(options, |name| {
            match name {
                "AWS_ACCESS_KEY_ID" => Some("AKIDEXAMPLE"),
                "AWS_SECRET_ACCESS_KEY" => Some("secret"),
                _ => None,
            }
            .map(str::to_owned)
        })
    }

    #[tokio::test]
    async fn bad_provider_ids_name_the_node_and_the_field() {
        let aws = provider(&AwsOptions::default()).unwrap();
        let read = |id: &str| aws.machine(&ProviderId::new(id).read_from("n1"));
        assert_eq!(
            read("aws:///eu-west-1a/i-0123456789abcdef0").unwrap(),
            Machine {
                instance_id: "i-0123456789abcdef0".to_owned(),
                region: "eu-west-1".to_owned()
            }
        );
        for (id, says) in [
            ("gce://project/zone/vm", "is not an EC2 machine"),
            ("aws:///eu-west-1a/vm-1", "is not an EC2 instance id"),
            ("aws:///i-0123456789abcdef0", "set --aws-region"),
            (
                "aws:///Zone/i-0123456789abcdef0",
                "is not an availability zone",
            ),
        ] {
            let error = read(id).unwrap_err().to_string();
            assert!(error.starts_with("node n1: "), "{error}");
            assert!(error.contains(says), "{id}: {error}");
        }
    }

    #[tokio::test]
    async fn a_custom_endpoint_serves_its_region_only() {
        let endpoint = AwsOptions {
            endpoint_url: Some("http://127.0.0.1:1/".parse().unwrap()),
            ..AwsOptions::default()
        };
        let error = provider(&endpoint).unwrap_err().to_string();
        assert!(error.contains("set --aws-region"), "{error}");
        let aws = provider(&AwsOptions {
            region: Some("us-east-1".to_owned()),
            ..endpoint
        })
        .unwrap();
        let elsewhere = aws
            .machine(&ProviderId::new("aws:///eu-west-1a/i-0123456789abcdef0"))
            .unwrap_err();
        assert!(
            matches!(elsewhere, InstanceError::Refused(_)),
            "{elsewhere}"
        );
        assert!(elsewhere.to_string().contains("serves region us-east-1"));
        let here = aws.machine(&ProviderId::new("aws:///i-0123456789abcdef0"));
        assert_eq!(here.unwrap().region, "us-east-1");
    }
}
