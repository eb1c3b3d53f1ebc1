//! EC2's Query API: a form POSTed to the region's endpoint, signed with SigV4, answered in
//! XML. Throttling is waited out here, a few times with doubling pauses, so a burst of node
//! deletions slows down instead of failing; every other error is classified for the
//! controllers: transient (retried with their backoff) or refused (a Warning on the node, which
//! stays held).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningSettings, sign};
use aws_sigv4::sign::v4;
use bytes::Bytes;
use http_body_util::Full;

use super::super::InstanceError;
use super::super::http::HttpClient;
use super::credentials::CredentialChain;
use super::xml;

const EC2_VERSION: &str = "2016-11-15";
const CONTENT_TYPE: &str = "application/x-www-form-urlencoded; charset=utf-8";
/// Pauses after a throttled request: 0.25, 0.5, 1 and 2 s, then the call fails as transient.
const THROTTLE_PAUSES: [Duration; 4] = [
    Duration::from_millis(250),
    Duration::from_millis(500),
    Duration::from_secs(1),
    Duration::from_secs(2),
];

/// Where a region's EC2 answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub url: http::Uri,
    pub region: String,
}

/// An error EC2 answered, by its code.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub action: &'static str,
    pub status: http::StatusCode,
    pub code: String,
    pub message: String,
}

impl ApiError {
    pub fn is_not_found(&self) -> bool {
        self.code == "InvalidInstanceID.NotFound"
    }

    fn is_throttling(&self) -> bool {
        matches!(
            self.code.as_str(),
            "RequestLimitExceeded" | "Throttling" | "ThrottlingException" | "RequestThrottled"
        )
    }

    fn is_expired_credentials(&self) -> bool {
        matches!(self.code.as_str(), "ExpiredToken" | "RequestExpired")
    }

    /// What the controllers are told.
    pub fn classify(&self) -> InstanceError {
        let Self {
            action,
            status,
            code,
            message,
        } = self;
        match code.as_str() {
            "UnauthorizedOperation" => InstanceError::Refused(format!(
                "not authorized to call ec2:{action}: add ec2:{action} to the IAM role's policy \
                 (docs/providers/aws.md lists the least policy); EC2 said: {message}"
            )),
            "AuthFailure"
            | "InvalidClientTokenId"
            | "SignatureDoesNotMatch"
            | "ExpiredToken"
            | "RequestExpired"
            | "IncompleteSignature"
            | "MissingAuthenticationToken" => {
                InstanceError::Refused(format!("EC2 rejected the credentials ({code}): {message}"))
            }
            _ if status.is_server_error() || self.is_throttling() => {
                InstanceError::Transient(format!("ec2:{action}: {code} ({status}): {message}"))
            }
            _ => InstanceError::Refused(format!("ec2:{action}: {code}: {message}")),
        }
    }
}

/// How a call failed: EC2's own answer, or no answer.
#[derive(Debug)]
pub enum CallError {
    Api(ApiError),
    Failed(InstanceError),
}

impl CallError {
    pub fn classify(self) -> InstanceError {
        match self {
            Self::Api(error) => error.classify(),
            Self::Failed(error) => error,
        }
    }
}

#[derive(Debug)]
pub struct QueryClient {
    http: HttpClient,
    credentials: Arc<CredentialChain>,
}

impl QueryClient {
    pub fn new(http: HttpClient, credentials: Arc<CredentialChain>) -> Self {
        Self { http, credentials }
    }

    /// Calls `action` with `params` (EC2's `Name.N` form) and returns the answer's XML.
    pub async fn call(
        &self,
        endpoint: &Endpoint,
        action: &'static str,
        params: &[(String, String)],
    ) -> Result<String, CallError> {
        let body = {
            let mut form = form_urlencoded::Serializer::new(String::new());
            form.append_pair("Action", action)
                .append_pair("Version", EC2_VERSION);
            for (name, value) in params {
                form.append_pair(name, value);
            }
            form.finish()
        };
        let mut renewed = false;
        let mut throttled = THROTTLE_PAUSES.iter();
        loop {
            match self.send(endpoint, action, &body).await {
                Err(CallError::Api(error)) if error.is_throttling() => match throttled.next() {
                    Some(pause) => {
                        tracing::debug!(action, code = %error.code, ?pause, "EC2 throttled the request; waiting");
                        tokio::time::sleep(*pause).await;
                    }
                    None => return Err(CallError::Api(error)),
                },
                Err(CallError::Api(error)) if error.is_expired_credentials() && !renewed => {
                    renewed = true;
                    self.credentials.forget().await;
                }
                answer => return answer,
            }
        }
    }

    async fn send(
        &self,
        endpoint: &Endpoint,
        action: &'static str,
        body: &str,
    ) -> Result<String, CallError> {
        let request = self
            .signed(endpoint, body)
            .await
            .map_err(CallError::Failed)?;
        let answer = self.http.send(request).await.map_err(|error| {
            CallError::Failed(InstanceError::Transient(format!("ec2:{action}: {error}")))
        })?;
        let text = answer.text().into_owned();
        if answer.status.is_success() {
            return match xml::not_ec2_answer(&text, action) {
                None => Ok(text),
                Some(why) => Err(CallError::Failed(InstanceError::Refused(format!(
                    "ec2:{action}: the endpoint is not EC2: {why}; check --aws-endpoint-url"
                )))),
            };
        }
        let (code, message) = xml::ec2_error(&text).unwrap_or_else(|| {
            (
                format!("HTTP {}", answer.status.as_u16()),
                format!(
                    "not an EC2 error document (check --aws-endpoint-url): {}",
                    text.chars().take(200).collect::<String>()
                ),
            )
        });
        Err(CallError::Api(ApiError {
            action,
            status: answer.status,
            code,
            message,
        }))
    }

    async fn signed(
        &self,
        endpoint: &Endpoint,
        body: &str,
    ) -> Result<http::Request<Full<Bytes>>, InstanceError> {
        let keys = self.credentials.keys().await?;
        let unsignable = |error: &dyn std::fmt::Display| {
            InstanceError::Refused(format!(
                "cannot sign the request to {}: {error}",
                endpoint.url
            ))
        };
        let identity = aws_credential_types::Credentials::new(
            keys.access_key_id,
            keys.secret_access_key,
            keys.session_token,
            keys.expires,
            "nodegrace",
        )
        .into();
        let params = v4::SigningParams::builder()
            .identity(&identity)
            .region(&endpoint.region)
            .name("ec2")
            .time(SystemTime::now())
            .settings(SigningSettings::default())
            .build()
            .map_err(|error| unsignable(&error))?
            .into();
        let host = endpoint
            .url
            .authority()
            .map(ToString::to_string)
            .ok_or_else(|| unsignable(&"the endpoint has no host"))?;
        let url = endpoint.url.to_string();
        let headers = [("host", host.as_str()), ("content-type", CONTENT_TYPE)];
        let signable = SignableRequest::new(
            "POST",
            url.as_str(),
            headers.into_iter(),
            SignableBody::Bytes(body.as_bytes()),
        )
        .map_err(|error| unsignable(&error))?;
        let (instructions, _signature) = sign(signable, &params)
            .map_err(|error| unsignable(&error))?
            .into_parts();
        let mut request = http::Request::post(endpoint.url.clone())
            .header(http::header::HOST, host.as_str())
            .header(http::header::CONTENT_TYPE, CONTENT_TYPE)
            .body(Full::new(Bytes::from(body.to_owned())))
            .map_err(|error| unsignable(&error))?;
        instructions.apply_to_request_http1x(&mut request);
        Ok(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: &str, status: u16) -> ApiError {
        ApiError {
            action: "TerminateInstances",
            status: http::StatusCode::from_u16(status).unwrap(),
            code: code.to_owned(),
            message: "said".to_owned(),
        }
    }

    #[test]
    fn errors_are_classified_for_the_controllers() {
        let denied = api("UnauthorizedOperation", 403).classify();
        assert!(matches!(denied, InstanceError::Refused(_)));
        assert!(
            denied.to_string().contains("add ec2:TerminateInstances"),
            "{denied}"
        );
        let credentials = api("AuthFailure", 401).classify().to_string();
        assert!(
            credentials.contains("rejected the credentials"),
            "{credentials}"
        );
        assert!(matches!(
            api("InternalError", 500).classify(),
            InstanceError::Transient(_)
        ));
        assert!(matches!(
            api("RequestLimitExceeded", 503).classify(),
            InstanceError::Transient(_)
        ));
        assert!(matches!(
            api("OperationNotPermitted", 400).classify(),
            InstanceError::Refused(_)
        ));
        assert!(api("InvalidInstanceID.NotFound", 400).is_not_found());
    }
}
