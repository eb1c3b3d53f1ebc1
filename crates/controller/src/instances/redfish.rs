//! Bare metal through its BMC's Redfish API. A map (`--redfish-config`) says which BMC and
//! system each node is; power state is the system's `PowerState`, and every power change is
//! `ComputerSystem.Reset` (`ForceOff`, `On`), as the fence agents send it. A bare-metal machine
//! is not destroyed: "terminated" means powered off and left off, so its state after a
//! termination reads `stopped`, which is what this provider's terminations end in.
//!
//! A system the BMC does not have is a mistake in the map, never a machine that is gone: it is
//! refused, so no node is released on it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use futures::FutureExt;
use futures::future::BoxFuture;
use http_body_util::Full;
use serde::Deserialize;

use super::http::{HttpClient, Trust};
use super::{InstanceError, InstanceProvider, InstanceState, Power, ProviderId};
use nodegrace_core::config_file::{self, ConfigFileError};

/// `--redfish-config`: one entry per machine.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RedfishConfig {
    #[serde(default)]
    pub machines: Vec<MachineConfig>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct MachineConfig {
    /// The Node's name.
    #[serde(default)]
    pub node: Option<String>,
    /// The Node's `spec.providerID`; a trailing `*` matches any rest.
    #[serde(default, rename = "providerID")]
    pub provider_id: Option<String>,
    /// The BMC, e.g. `https://bmc-7.example.com`.
    pub endpoint: String,
    /// The system's path, e.g. `/redfish/v1/Systems/1`.
    pub system: String,
    /// A directory holding the files `username` and `password` (a mounted Secret); read at
    /// every call, so a rotated Secret is used as soon as the kubelet updates it.
    pub credentials: PathBuf,
    /// PEM certificates the BMC's must chain to; default: the public roots.
    #[serde(default)]
    pub ca_bundle: Option<PathBuf>,
    /// Accept any certificate from this BMC. An explicit opt-in, logged at start: a BMC's
    /// self-signed certificate is better given as `caBundle`.
    #[serde(default)]
    pub insecure_skip_verify: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum RedfishSetupError {
    #[error(transparent)]
    File(#[from] ConfigFileError),
    #[error("--redfish-config {path}: machines[{index}].{field}: {problem}")]
    Invalid {
        path: String,
        index: usize,
        field: &'static str,
        problem: String,
    },
}

#[derive(Debug)]
struct Machine {
    config: MachineConfig,
    /// Scheme and authority, no trailing slash: paths are appended as the BMC gives them.
    endpoint: String,
    client: HttpClient,
}

#[derive(Debug)]
pub struct RedfishInstances {
    machines: Vec<Machine>,
}

impl RedfishInstances {
    /// Reads and checks the map: every entry matches something, names a URL, a system path,
    /// and credentials that can be read now.
    pub fn from_file(path: &Path, timeout: Duration) -> Result<Self, RedfishSetupError> {
        let config: RedfishConfig = config_file::read_yaml(path)?;
        Self::new(config, &path.display().to_string(), timeout)
    }

    pub fn new(
        config: RedfishConfig,
        shown: &str,
        timeout: Duration,
    ) -> Result<Self, RedfishSetupError> {
        let mut clients: HashMap<(Option<PathBuf>, bool), HttpClient> = HashMap::new();
        let mut machines = Vec::new();
        for (index, entry) in config.machines.into_iter().enumerate() {
            let invalid = |field: &'static str, problem: String| RedfishSetupError::Invalid {
                path: shown.to_owned(),
                index,
                field,
                problem,
            };
            if entry.node.is_none() && entry.provider_id.is_none() {
                return Err(invalid(
                    "node",
                    "set node (the Node's name) or providerID (its spec.providerID)".to_owned(),
                ));
            }
            let endpoint = entry
                .endpoint
                .parse::<http::Uri>()
                .ok()
                .filter(|uri| {
                    matches!(uri.scheme_str(), Some("http" | "https"))
                        && uri.host().is_some()
                        && uri.path() == "/"
                })
                .map(|_| entry.endpoint.trim_end_matches('/').to_owned())
                .ok_or_else(|| {
                    invalid(
                        "endpoint",
                        format!(
                            "{:?} is not an http(s) URL, e.g. https://bmc-7.example.com",
                            entry.endpoint
                        ),
                    )
                })?;
            if !entry.system.starts_with("/redfish/v1/Systems/") {
                return Err(invalid(
                    "system",
                    format!(
                        "{:?} is not a system's path, e.g. /redfish/v1/Systems/1",
                        entry.system
                    ),
                ));
            }
            read_credentials(&entry.credentials)
                .map_err(|problem| invalid("credentials", problem))?;
            if entry.insecure_skip_verify {
                if entry.ca_bundle.is_some() {
                    return Err(invalid(
                        "insecureSkipVerify",
                        "set caBundle or insecureSkipVerify, not both".to_owned(),
                    ));
                }
                tracing::warn!(endpoint = %entry.endpoint, "redfish: the BMC's certificate is not verified (insecureSkipVerify)");
            }
            let trust_key = (entry.ca_bundle.clone(), entry.insecure_skip_verify);
            let client = if let Some(client) = clients.get(&trust_key) {
                client.clone()
            } else {
                let trust = match (&entry.ca_bundle, entry.insecure_skip_verify) {
                    (_, true) => Trust::Insecure,
                    (Some(bundle), false) => Trust::Bundle(bundle.clone()),
                    (None, false) => Trust::PublicRoots,
                };
                let client = HttpClient::new(&trust, timeout)
                    .map_err(|error| invalid("caBundle", error.to_string()))?;
                clients.insert(trust_key, client.clone());
                client
            };
            machines.push(Machine {
                config: entry,
                endpoint,
                client,
            });
        }
        Ok(Self { machines })
    }

    fn machine(&self, id: &ProviderId) -> Result<&Machine, InstanceError> {
        self.machines
            .iter()
            .find(|machine| {
                machine
                    .config
                    .node
                    .as_deref()
                    .is_some_and(|node| id.node() == Some(node))
                    || machine
                        .config
                        .provider_id
                        .as_deref()
                        .is_some_and(|pattern| matches_pattern(pattern, id.as_str()))
            })
            .ok_or_else(|| {
                InstanceError::Refused(format!(
                    "node {} (spec.providerID {id}) matches no machine in --redfish-config; add it \
                 there (node or providerID)",
                    id.node().unwrap_or("(none)")
                ))
            })
    }
}

fn matches_pattern(pattern: &str, provider_id: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => provider_id.starts_with(prefix),
        None => pattern == provider_id,
    }
}

fn read_credentials(dir: &Path) -> Result<(String, String), String> {
    let read = |name: &str| {
        let path = dir.join(name);
        std::fs::read_to_string(&path)
            .map(|text| text.trim_end_matches(['\r', '\n']).to_owned())
            .map_err(|error| format!("cannot read {}: {error}", path.display()))
    };
    Ok((read("username")?, read("password")?))
}

/// What the BMC said, or why it said nothing.
struct Answer {
    status: http::StatusCode,
    body: serde_json::Value,
}

impl Machine {
    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.endpoint)
    }

    fn describe(&self) -> String {
        format!("BMC {} system {}", self.endpoint, self.config.system)
    }

    async fn call(
        &self,
        method: http::Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> Result<Answer, InstanceError> {
        let (username, password) = read_credentials(&self.config.credentials)
            .map_err(|problem| InstanceError::Refused(format!("{}: {problem}", self.describe())))?;
        let basic =
            base64::engine::general_purpose::STANDARD.encode(format!("{username}:{password}"));
        let mut request = http::Request::builder()
            .method(method)
            .uri(self.url(path))
            .header(http::header::AUTHORIZATION, format!("Basic {basic}"))
            .header(http::header::ACCEPT, "application/json");
        let payload = match body {
            Some(body) => {
                request = request.header(http::header::CONTENT_TYPE, "application/json");
                Bytes::from(body.to_string())
            }
            None => Bytes::new(),
        };
        let request = request
            .body(Full::new(payload))
            .map_err(|error| InstanceError::Refused(format!("{}: {error}", self.describe())))?;
        let answer =
            self.client.send(request).await.map_err(|error| {
                InstanceError::Transient(format!("{}: {error}", self.describe()))
            })?;
        let body = serde_json::from_slice(&answer.body).unwrap_or(serde_json::Value::Null);
        let failure = |what: String| format!("{}: {what}", self.describe());
        match answer.status.as_u16() {
            200..=299 => Ok(Answer {
                status: answer.status,
                body,
            }),
            401 | 403 => Err(InstanceError::Refused(failure(format!(
                "the BMC refused the credentials of {} ({}); check the Secret",
                self.config.credentials.display(),
                answer.status
            )))),
            404 => Err(InstanceError::Refused(failure(
                "the BMC has no such system; check system in --redfish-config".to_owned(),
            ))),
            400..=499 => Err(InstanceError::Refused(failure(format!(
                "{}: {}",
                answer.status,
                message(&body)
            )))),
            _ => Err(InstanceError::Transient(failure(format!(
                "{}: {}",
                answer.status,
                message(&body)
            )))),
        }
    }

    async fn power_state(&self) -> Result<(InstanceState, String), InstanceError> {
        let system = self
            .call(http::Method::GET, &self.config.system, None)
            .await?;
        let word = system.body["PowerState"].as_str().unwrap_or_default();
        let state = match word {
            "On" | "PoweringOn" => InstanceState::Running,
            "PoweringOff" | "Paused" => InstanceState::Stopping,
            "Off" => InstanceState::Stopped,
            _ => {
                return Err(InstanceError::Transient(format!(
                    "{}: PowerState {word:?} is not one of On, Off, PoweringOn, PoweringOff",
                    self.describe()
                )));
            }
        };
        // The Reset action's target as the system advertises it, as the fence agents read it.
        let target = system.body["Actions"]["#ComputerSystem.Reset"]["target"]
            .as_str()
            .map_or_else(
                || format!("{}/Actions/ComputerSystem.Reset", self.config.system),
                str::to_owned,
            );
        Ok((state, target))
    }

    async fn reset(&self, reset_type: &str) -> Result<(), InstanceError> {
        let (_, target) = self.power_state().await?;
        let answer = self
            .call(
                http::Method::POST,
                &target,
                Some(serde_json::json!({ "ResetType": reset_type })),
            )
            .await?;
        tracing::debug!(system = %self.describe(), reset_type, status = %answer.status, "redfish reset accepted");
        Ok(())
    }
}

/// A Redfish error's message (`error.@Message.ExtendedInfo[0].Message`, or `error.message`).
fn message(body: &serde_json::Value) -> String {
    let error = &body["error"];
    error["@Message.ExtendedInfo"][0]["Message"]
        .as_str()
        .or_else(|| error["message"].as_str())
        .unwrap_or("no message")
        .to_owned()
}

impl InstanceProvider for RedfishInstances {
    fn name(&self) -> &'static str {
        "redfish"
    }

    fn state<'a>(
        &'a self,
        id: &'a ProviderId,
    ) -> BoxFuture<'a, Result<InstanceState, InstanceError>> {
        async move { Ok(self.machine(id)?.power_state().await?.0) }.boxed()
    }

    /// Powered off at once and left off.
    fn terminate<'a>(&'a self, id: &'a ProviderId) -> BoxFuture<'a, Result<(), InstanceError>> {
        async move { self.machine(id)?.reset("ForceOff").await }.boxed()
    }

    fn terminated_as(&self) -> InstanceState {
        InstanceState::Stopped
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
            let reset_type = match power {
                Power::Off => "ForceOff",
                Power::On => "On",
            };
            self.machine(id)?.reset(reset_type).await
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn credentials() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("username"), "admin\n").unwrap();
        std::fs::write(dir.path().join("password"), "secret").unwrap();
        dir
    }

    fn entry(credentials: &Path) -> MachineConfig {
        MachineConfig {
            node: Some("bm-1".to_owned()),
            provider_id: None,
            endpoint: "https://bmc-1.example".to_owned(),
            system: "/redfish/v1/Systems/1".to_owned(),
            credentials: credentials.to_owned(),
            ca_bundle: None,
            insecure_skip_verify: false,
        }
    }

    fn setup(machines: Vec<MachineConfig>) -> Result<RedfishInstances, String> {
        RedfishInstances::new(
            RedfishConfig { machines },
            "map.yaml",
            Duration::from_secs(1),
        )
        .map_err(|error| error.to_string())
    }

    type Spoil = fn(&mut MachineConfig);

    #[test]
    fn the_map_is_checked_at_start_naming_the_entry_and_field() {
        let dir = credentials();
        assert!(setup(vec![entry(dir.path())]).is_ok());
        let cases: [(Spoil, &str); 5] = [
            (|m| m.node = None, "machines[0].node: set node"),
            (|m| m.endpoint = "bmc-1".to_owned(), "machines[0].endpoint"),
            (|m| m.system = "/Systems/1".to_owned(), "machines[0].system"),
            (
                |m| m.credentials = PathBuf::from("/no/such"),
                "machines[0].credentials: cannot read /no/such/username",
            ),
            (
                |m| {
                    m.insecure_skip_verify = true;
                    m.ca_bundle = Some(PathBuf::from("/ca.pem"));
                },
                "not both",
            ),
        ];
        for (spoil, says) in cases {
            let mut spoiled = entry(dir.path());
            spoil(&mut spoiled);
            let error = setup(vec![spoiled]).unwrap_err();
            assert!(error.contains(says), "{error}");
        }
    }

    #[test]
    fn nodes_are_found_by_name_or_provider_id_pattern() {
        let dir = credentials();
        let by_id = MachineConfig {
            node: None,
            provider_id: Some("metal3://rack-2/*".to_owned()),
            ..entry(dir.path())
        };
        let redfish = setup(vec![entry(dir.path()), by_id]).unwrap();
        let by_name = ProviderId::new("redfish:///x").read_from("bm-1");
        assert_eq!(
            redfish.machine(&by_name).unwrap().config.node.as_deref(),
            Some("bm-1")
        );
        let by_pattern = ProviderId::new("metal3://rack-2/host-9").read_from("other");
        assert!(redfish.machine(&by_pattern).unwrap().config.node.is_none());
        let unknown = redfish
            .machine(&ProviderId::new("metal3://rack-3/h").read_from("lost"))
            .unwrap_err()
            .to_string();
        assert!(
            unknown.contains("node lost") && unknown.contains("matches no machine"),
            "{unknown}"
        );
    }
}
