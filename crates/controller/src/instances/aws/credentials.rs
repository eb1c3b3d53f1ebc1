//! AWS credentials as a pod gets them, in the SDKs' order: static keys in the environment, a
//! web identity (IRSA: a projected token file and a role ARN, exchanged at STS), or the
//! container credentials endpoint (EKS Pod Identity). Temporary keys are fetched again five
//! minutes before they expire; the token files are read anew each time, as the kubelet rotates
//! them. The node's instance profile (IMDS) is not used: Karpenter's nodes, like EKS's
//! defaults, keep IMDS out of a pod's reach, and a node role is wider than this program needs.

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http_body_util::Full;
use tokio::sync::Mutex;

use super::super::InstanceError;
use super::super::http::HttpClient;
use super::xml;

/// Temporary keys are renewed this long before they expire.
const RENEW_BEFORE: Duration = Duration::from_secs(300);
const STS_VERSION: &str = "2011-06-15";

#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    #[error(
        "no AWS credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or IRSA's \
         AWS_ROLE_ARN and AWS_WEB_IDENTITY_TOKEN_FILE (the chart's serviceAccount annotation \
         eks.amazonaws.com/role-arn), or EKS Pod Identity's AWS_CONTAINER_CREDENTIALS_FULL_URI"
    )]
    None,
    #[error("{variable} is set but {missing} is not; set both")]
    Half {
        variable: &'static str,
        missing: &'static str,
    },
    #[error("{variable}={path}: cannot read the token: {reason}")]
    TokenFile {
        variable: &'static str,
        path: String,
        reason: String,
    },
    #[error(
        "{variable}={value}: not an address credentials may come from (https, loopback, \
         169.254.170.2, 169.254.170.23 or fd00:ec2::23)"
    )]
    ContainerUri {
        variable: &'static str,
        value: String,
    },
}

/// One set of keys, and when they stop working (never, for static keys).
#[derive(Clone)]
pub struct Keys {
    pub access_key_id: String,
    pub secret_access_key: String,
    pub session_token: Option<String>,
    pub expires: Option<SystemTime>,
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keys")
            .field("access_key_id", &self.access_key_id)
            .field("expires", &self.expires)
            .finish_non_exhaustive()
    }
}

impl Keys {
    /// Temporary keys as STS and the container endpoints both name them, but for the token's
    /// field; `None` without the key pair.
    fn from_fields(field: impl Fn(&str) -> Option<String>, token: &str) -> Option<Self> {
        Some(Self {
            access_key_id: field("AccessKeyId")?,
            secret_access_key: field("SecretAccessKey")?,
            session_token: field(token),
            expires: field("Expiration").and_then(|at| parse_time(&at)),
        })
    }

    fn fresh_at(&self, now: SystemTime) -> bool {
        self.expires
            .is_none_or(|expires| expires > now + RENEW_BEFORE)
    }

    fn valid_at(&self, now: SystemTime) -> bool {
        self.expires.is_none_or(|expires| expires > now)
    }
}

#[derive(Debug, Clone)]
enum Source {
    Static(Keys),
    WebIdentity {
        token_file: PathBuf,
        role_arn: String,
        session_name: String,
        sts: http::Uri,
    },
    Container {
        uri: http::Uri,
        token: Option<ContainerToken>,
    },
}

#[derive(Debug, Clone)]
enum ContainerToken {
    Value(String),
    File(PathBuf),
}

#[derive(Debug)]
pub struct CredentialChain {
    source: Source,
    http: HttpClient,
    cached: Mutex<Option<Keys>>,
}

impl CredentialChain {
    /// The first source the environment configures. `sts` is the STS endpoint for a web
    /// identity (regional by default).
    pub fn from_env(
        env: impl Fn(&str) -> Option<String>,
        sts: http::Uri,
        http: HttpClient,
    ) -> Result<Self, CredentialsError> {
        let var = |name: &str| env(name).filter(|value| !value.trim().is_empty());
        let source = if let Some(access_key_id) = var("AWS_ACCESS_KEY_ID") {
            let secret_access_key = var("AWS_SECRET_ACCESS_KEY").ok_or(CredentialsError::Half {
                variable: "AWS_ACCESS_KEY_ID",
                missing: "AWS_SECRET_ACCESS_KEY",
            })?;
            Source::Static(Keys {
                access_key_id,
                secret_access_key,
                session_token: var("AWS_SESSION_TOKEN"),
                expires: None,
            })
        } else if let Some(token_file) = var("AWS_WEB_IDENTITY_TOKEN_FILE") {
            let role_arn = var("AWS_ROLE_ARN").ok_or(CredentialsError::Half {
                variable: "AWS_WEB_IDENTITY_TOKEN_FILE",
                missing: "AWS_ROLE_ARN",
            })?;
            let token_file = PathBuf::from(token_file);
            read_token("AWS_WEB_IDENTITY_TOKEN_FILE", &token_file)?;
            Source::WebIdentity {
                token_file,
                role_arn,
                session_name: var("AWS_ROLE_SESSION_NAME")
                    .unwrap_or_else(|| "nodegrace".to_owned()),
                sts,
            }
        } else if let Some(full) = var("AWS_CONTAINER_CREDENTIALS_FULL_URI") {
            let uri = container_uri("AWS_CONTAINER_CREDENTIALS_FULL_URI", &full)?;
            let token = if let Some(file) = var("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE") {
                let file = PathBuf::from(file);
                read_token("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", &file)?;
                Some(ContainerToken::File(file))
            } else {
                var("AWS_CONTAINER_AUTHORIZATION_TOKEN").map(ContainerToken::Value)
            };
            Source::Container { uri, token }
        } else if let Some(relative) = var("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI") {
            let full = format!("http://169.254.170.2{relative}");
            let uri = container_uri("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", &full)?;
            Source::Container { uri, token: None }
        } else {
            return Err(CredentialsError::None);
        };
        Ok(Self {
            source,
            http,
            cached: Mutex::new(None),
        })
    }

    /// Where the keys come from, for the start-up log and the docs.
    pub fn describe(&self) -> &'static str {
        match self.source {
            Source::Static(_) => "static keys from the environment",
            Source::WebIdentity { .. } => "web identity (IRSA) through STS",
            Source::Container { .. } => "the container credentials endpoint (EKS Pod Identity)",
        }
    }

    /// Keys good for at least the next request: the cached ones unless they expire soon. A
    /// failed renewal falls back on keys that are still valid.
    pub async fn keys(&self) -> Result<Keys, InstanceError> {
        let mut cached = self.cached.lock().await;
        let now = SystemTime::now();
        if let Some(keys) = cached.as_ref().filter(|keys| keys.fresh_at(now)) {
            return Ok(keys.clone());
        }
        match self.fetch().await {
            Ok(keys) => {
                *cached = Some(keys.clone());
                Ok(keys)
            }
            Err(error) => match cached.as_ref().filter(|keys| keys.valid_at(now)) {
                Some(keys) => {
                    tracing::warn!(error = %error, "cannot renew AWS credentials; using the current ones until they expire");
                    Ok(keys.clone())
                }
                None => Err(error),
            },
        }
    }

    /// Drops the cached keys, after AWS said they expired or are unknown.
    pub async fn forget(&self) {
        *self.cached.lock().await = None;
    }

    async fn fetch(&self) -> Result<Keys, InstanceError> {
        match &self.source {
            Source::Static(keys) => Ok(keys.clone()),
            Source::WebIdentity {
                token_file,
                role_arn,
                session_name,
                sts,
            } => {
                let token = read_token("AWS_WEB_IDENTITY_TOKEN_FILE", token_file)
                    .map_err(|error| InstanceError::Refused(error.to_string()))?;
                self.assume_role(sts, role_arn, session_name, &token).await
            }
            Source::Container { uri, token } => self.container(uri, token.as_ref()).await,
        }
    }

    async fn assume_role(
        &self,
        sts: &http::Uri,
        role_arn: &str,
        session_name: &str,
        token: &str,
    ) -> Result<Keys, InstanceError> {
        let body = form_urlencoded::Serializer::new(String::new())
            .append_pair("Action", "AssumeRoleWithWebIdentity")
            .append_pair("Version", STS_VERSION)
            .append_pair("RoleArn", role_arn)
            .append_pair("RoleSessionName", session_name)
            .append_pair("WebIdentityToken", token)
            .finish();
        let request = http::Request::post(sts.clone())
            .header(
                http::header::CONTENT_TYPE,
                "application/x-www-form-urlencoded; charset=utf-8",
            )
            .body(Full::new(Bytes::from(body)))
            .map_err(|error| InstanceError::Refused(format!("STS request: {error}")))?;
        let answer = self
            .http
            .send(request)
            .await
            .map_err(|error| InstanceError::Transient(format!("STS: {error}")))?;
        let text = answer.text();
        if !answer.status.is_success() {
            let (code, message) = xml::error(&text).unwrap_or_default();
            let failure = format!(
                "STS AssumeRoleWithWebIdentity for {role_arn} failed ({}): {code} {message}",
                answer.status
            );
            return Err(if answer.status.is_server_error() || code == "Throttling" {
                InstanceError::Transient(failure)
            } else {
                InstanceError::Refused(failure)
            });
        }
        Keys::from_fields(|name| xml::first_text(&text, name), "SessionToken").ok_or_else(|| {
            InstanceError::Transient(format!("STS answered without credentials: {text}"))
        })
    }

    async fn container(
        &self,
        uri: &http::Uri,
        token: Option<&ContainerToken>,
    ) -> Result<Keys, InstanceError> {
        let mut request = http::Request::get(uri.clone());
        match token {
            Some(ContainerToken::Value(value)) => {
                request = request.header(http::header::AUTHORIZATION, value.trim());
            }
            Some(ContainerToken::File(file)) => {
                let value = read_token("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", file)
                    .map_err(|error| InstanceError::Refused(error.to_string()))?;
                request = request.header(http::header::AUTHORIZATION, value);
            }
            None => {}
        }
        let request = request
            .body(Full::new(Bytes::new()))
            .map_err(|error| InstanceError::Refused(format!("container credentials: {error}")))?;
        let answer =
            self.http.send(request).await.map_err(|error| {
                InstanceError::Transient(format!("container credentials: {error}"))
            })?;
        if !answer.status.is_success() {
            let failure = format!(
                "container credentials {uri}: {} {}",
                answer.status,
                answer.text()
            );
            return Err(if answer.status.is_server_error() {
                InstanceError::Transient(failure)
            } else {
                InstanceError::Refused(failure)
            });
        }
        let document: serde_json::Value =
            serde_json::from_slice(&answer.body).map_err(|error| {
                InstanceError::Transient(format!("container credentials {uri}: {error}"))
            })?;
        let field = |name: &str| document[name].as_str().map(str::to_owned);
        Keys::from_fields(field, "Token").ok_or_else(|| {
            InstanceError::Transient(format!(
                "container credentials {uri} answered without AccessKeyId and SecretAccessKey"
            ))
        })
    }
}

fn read_token(variable: &'static str, path: &std::path::Path) -> Result<String, CredentialsError> {
    let failed = |reason: String| CredentialsError::TokenFile {
        variable,
        path: path.display().to_string(),
        reason,
    };
    let token = std::fs::read_to_string(path).map_err(|error| failed(error.to_string()))?;
    let token = token.trim();
    if token.is_empty() {
        return Err(failed("the file is empty".to_owned()));
    }
    Ok(token.to_owned())
}

/// The SDKs take container credentials only over https or from the link-local agents and
/// loopback, so a mistyped variable cannot send a token elsewhere in clear.
fn container_uri(variable: &'static str, value: &str) -> Result<http::Uri, CredentialsError> {
    let refused = || CredentialsError::ContainerUri {
        variable,
        value: value.to_owned(),
    };
    let uri: http::Uri = value.parse().map_err(|_| refused())?;
    let host = uri.host().ok_or_else(refused)?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let allowed = uri.scheme_str() == Some("https")
        || host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|address| address.is_loopback())
        || ["169.254.170.2", "169.254.170.23", "fd00:ec2::23"].contains(&host);
    if allowed { Ok(uri) } else { Err(refused()) }
}

fn parse_time(text: &str) -> Option<SystemTime> {
    text.parse::<jiff::Timestamp>().ok().map(SystemTime::from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::instances::http::Trust;

    fn chain(vars: &[(&str, &str)]) -> Result<CredentialChain, CredentialsError> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let http = HttpClient::new(&Trust::PublicRoots, Duration::from_secs(1)).unwrap();
        CredentialChain::from_env(
            move |name| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()),
            "https://sts.amazonaws.com".parse().unwrap(),
            http,
        )
    }

    #[test]
    fn the_environment_picks_the_first_configured_source() {
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        std::fs::write(&token, "eyJ\n").unwrap();
        let token = token.to_str().unwrap();
        let keys = chain(&[("AWS_ACCESS_KEY_ID", "AK"), ("AWS_SECRET_ACCESS_KEY", "s")]).unwrap();
        assert_eq!(keys.describe(), "static keys from the environment");
        let irsa = chain(&[
            ("AWS_WEB_IDENTITY_TOKEN_FILE", token),
            ("AWS_ROLE_ARN", "arn:aws:iam::1:role/r"),
        ])
        .unwrap();
        assert!(irsa.describe().contains("IRSA"));
        let pod_identity = chain(&[
            (
                "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                "http://169.254.170.23/v1/credentials",
            ),
            ("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", token),
        ])
        .unwrap();
        assert!(pod_identity.describe().contains("Pod Identity"));
    }

    #[test]
    fn bad_settings_name_the_variable_and_the_fix() {
        let error = |vars: &[(&str, &str)]| chain(vars).unwrap_err().to_string();
        assert!(error(&[]).contains("eks.amazonaws.com/role-arn"));
        assert!(error(&[("AWS_ACCESS_KEY_ID", "AK")]).contains("AWS_SECRET_ACCESS_KEY is not"));
        let unreadable = error(&[
            ("AWS_WEB_IDENTITY_TOKEN_FILE", "/no/such/token"),
            ("AWS_ROLE_ARN", "arn:aws:iam::1:role/r"),
        ]);
        assert!(
            unreadable.starts_with("AWS_WEB_IDENTITY_TOKEN_FILE=/no/such/token: cannot read"),
            "{unreadable}"
        );
        let elsewhere = error(&[(
            "AWS_CONTAINER_CREDENTIALS_FULL_URI",
            "http://10.0.0.9/credentials",
        )]);
        assert!(
            elsewhere.contains("not an address credentials may come from"),
            "{elsewhere}"
        );
    }

    #[test]
    fn keys_are_renewed_ahead_of_their_expiry() {
        let now = SystemTime::now();
        let keys = |left: u64| Keys {
            access_key_id: "A".to_owned(),
            secret_access_key: "s".to_owned(),
            session_token: None,
            expires: Some(now + Duration::from_secs(left)),
        };
        assert!(keys(3600).fresh_at(now));
        assert!(!keys(120).fresh_at(now));
        assert!(keys(120).valid_at(now));
        assert_eq!(
            parse_time("2026-11-26T15:11:37.476179Z")
                .map(|at| at > now - Duration::from_secs(1e9 as u64)),
            Some(true)
        );
    }
}
