//! The HTTPS client the cloud and BMC providers share: rustls with ring, the Mozilla roots
//! compiled in (the images have no CA files) or an operator's CA bundle, and a deadline on
//! every request, since a provider that hangs would hold a node's termination with no word.

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// Which certificates a server's must chain to.
#[derive(Debug, Clone)]
pub enum Trust {
    /// The Mozilla roots (public clouds).
    PublicRoots,
    /// The PEM certificates of a file (a BMC's own CA).
    Bundle(std::path::PathBuf),
    /// Any certificate: an operator's explicit, logged opt-in for a BMC whose certificate
    /// cannot be verified.
    Insecure,
}

#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("cannot read the CA bundle {path}: {reason}")]
    Bundle { path: String, reason: String },
    #[error("{url} cannot be reached: {reason}")]
    Unreachable { url: String, reason: String },
    #[error("{url} did not answer within {timeout:?}")]
    Timeout { url: String, timeout: Duration },
}

/// An answer, read whole (provider answers are small).
#[derive(Debug)]
pub struct Answer {
    pub status: http::StatusCode,
    pub body: Bytes,
}

impl Answer {
    pub fn text(&self) -> std::borrow::Cow<'_, str> {
        String::from_utf8_lossy(&self.body)
    }
}

#[derive(Clone)]
pub struct HttpClient {
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    timeout: Duration,
}

impl std::fmt::Debug for HttpClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpClient")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl HttpClient {
    pub fn new(trust: &Trust, timeout: Duration) -> Result<Self, HttpError> {
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let builder = HttpsConnectorBuilder::new();
        let builder = match trust {
            Trust::PublicRoots => {
                builder
                    .with_provider_and_webpki_roots(provider)
                    .map_err(|error| HttpError::Bundle {
                        path: "(built-in roots)".to_owned(),
                        reason: error.to_string(),
                    })?
            }
            Trust::Bundle(path) => {
                let config = rustls::ClientConfig::builder_with_provider(provider)
                    .with_safe_default_protocol_versions()
                    .map_err(|error| HttpError::Bundle {
                        path: path.display().to_string(),
                        reason: error.to_string(),
                    })?
                    .with_root_certificates(roots_from(path)?)
                    .with_no_client_auth();
                builder.with_tls_config(config)
            }
            Trust::Insecure => {
                let verifier =
                    std::sync::Arc::new(AnyCertificate(std::sync::Arc::clone(&provider)));
                let config = rustls::ClientConfig::builder_with_provider(provider)
                    .with_safe_default_protocol_versions()
                    .map_err(|error| HttpError::Bundle {
                        path: "(none)".to_owned(),
                        reason: error.to_string(),
                    })?
                    .dangerous()
                    .with_custom_certificate_verifier(verifier)
                    .with_no_client_auth();
                builder.with_tls_config(config)
            }
        };
        let connector = builder.https_or_http().enable_http1().build();
        Ok(Self {
            client: Client::builder(TokioExecutor::new()).build(connector),
            timeout,
        })
    }

    /// Sends the request and reads the whole answer, within the client's deadline.
    pub async fn send(&self, request: http::Request<Full<Bytes>>) -> Result<Answer, HttpError> {
        let url = request.uri().to_string();
        let exchange = async {
            let response =
                self.client
                    .request(request)
                    .await
                    .map_err(|error| HttpError::Unreachable {
                        url: url.clone(),
                        reason: nodegrace_core::error_chain::Chain(&error).to_string(),
                    })?;
            let status = response.status();
            let body = response
                .into_body()
                .collect()
                .await
                .map_err(|error| HttpError::Unreachable {
                    url: url.clone(),
                    reason: error.to_string(),
                })?
                .to_bytes();
            Ok(Answer { status, body })
        };
        tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| HttpError::Timeout {
                url: url.clone(),
                timeout: self.timeout,
            })?
    }
}

fn roots_from(path: &Path) -> Result<rustls::RootCertStore, HttpError> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let failed = |reason: String| HttpError::Bundle {
        path: path.display().to_string(),
        reason,
    };
    let certificates: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .map_err(|error| failed(error.to_string()))?
        .collect::<Result<_, _>>()
        .map_err(|error| failed(error.to_string()))?;
    if certificates.is_empty() {
        return Err(failed("it holds no PEM certificate".to_owned()));
    }
    let mut roots = rustls::RootCertStore::empty();
    for certificate in certificates {
        roots
            .add(certificate)
            .map_err(|error| failed(error.to_string()))?;
    }
    Ok(roots)
}

/// Accepts any server certificate, still checking that the handshake is signed by the key the
/// certificate holds: `Trust::Insecure` only.
#[derive(Debug)]
struct AnyCertificate(std::sync::Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
