//! The webhook's HTTPS server: `/mutate-node` for CREATE, `/validate-node` for DELETE, a body
//! cap, and the serving certificate swapped in place when it rotates (new handshakes get the
//! new one; open connections finish on the old).

use std::convert::Infallible;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Instant;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::webhook::admit::Admission;
use crate::webhook::review::{self, Answer, Decoded, MAX_BODY_BYTES, NodeOperation};

pub const MUTATE_PATH: &str = "/mutate-node";
pub const VALIDATE_PATH: &str = "/validate-node";

/// The certificate handshakes present; none until the first is loaded.
#[derive(Debug)]
pub struct ServingCertificate {
    current: RwLock<Option<(String, Arc<CertifiedKey>)>>,
    loaded: tokio::sync::watch::Sender<bool>,
}

impl Default for ServingCertificate {
    fn default() -> Self {
        Self {
            current: RwLock::default(),
            loaded: tokio::sync::watch::Sender::new(false),
        }
    }
}

impl ServingCertificate {
    /// Serves `cert_pem` (the chain, leaf first) with `key_pem` from the next handshake on.
    pub fn load(&self, cert_pem: &str, key_pem: &str) -> Result<(), String> {
        let current = self.current.read().unwrap_or_else(PoisonError::into_inner);
        if current
            .as_ref()
            .is_some_and(|(loaded, _)| loaded == cert_pem)
        {
            return Ok(());
        }
        drop(current);
        let chain = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|error| format!("tls.crt: {error}"))?;
        if chain.is_empty() {
            return Err("tls.crt holds no certificate".to_owned());
        }
        let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes())
            .map_err(|error| format!("tls.key: {error}"))?;
        let certified =
            CertifiedKey::from_der(chain, key, &rustls::crypto::ring::default_provider())
                .map_err(|error| format!("tls.crt and tls.key: {error}"))?;
        *self.current.write().unwrap_or_else(PoisonError::into_inner) =
            Some((cert_pem.to_owned(), Arc::new(certified)));
        self.loaded.send_replace(true);
        tracing::info!("webhook serving certificate loaded");
        Ok(())
    }

    /// Returns once a certificate is loaded.
    pub async fn wait_loaded(&self) {
        // The sender lives in `self`, so the wait cannot fail.
        let _ = self.loaded.subscribe().wait_for(|loaded| *loaded).await;
    }
}

impl ResolvesServerCert for ServingCertificate {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map(|(_, key)| Arc::clone(key))
    }
}

/// Serves reviews on `listener` until `stop`.
pub async fn serve(
    listener: TcpListener,
    certificate: Arc<ServingCertificate>,
    admission: Arc<Admission>,
    stop: CancellationToken,
) -> Result<(), rustls::Error> {
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_no_client_auth()
    .with_cert_resolver(certificate);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    loop {
        let (stream, peer) = tokio::select! {
            () = stop.cancelled() => return Ok(()),
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::warn!(%error, "webhook accept failed");
                    continue;
                }
            },
        };
        let acceptor = acceptor.clone();
        let admission = Arc::clone(&admission);
        tokio::spawn(async move {
            let tls = match acceptor.accept(stream).await {
                Ok(tls) => tls,
                Err(error) => {
                    tracing::debug!(%peer, %error, "webhook TLS handshake failed");
                    return;
                }
            };
            let service = hyper::service::service_fn(move |request| {
                let admission = Arc::clone(&admission);
                async move { Ok::<_, Infallible>(handle(&admission, request).await) }
            });
            if let Err(error) = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(tls), service)
                .await
            {
                tracing::debug!(%peer, %error, "webhook connection ended");
            }
        });
    }
}

fn text(status: StatusCode, message: impl Into<String>) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(message.into() + "\n")));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

async fn handle(admission: &Admission, request: Request<Incoming>) -> Response<Full<Bytes>> {
    let started = Instant::now();
    let operation = match request.uri().path() {
        MUTATE_PATH => NodeOperation::Create,
        VALIDATE_PATH => NodeOperation::Delete,
        other => {
            return text(
                StatusCode::NOT_FOUND,
                format!("no such path {other}; reviews go to {MUTATE_PATH} or {VALIDATE_PATH}"),
            );
        }
    };
    if request.method() != Method::POST {
        return text(
            StatusCode::METHOD_NOT_ALLOWED,
            "POST an AdmissionReview to this path",
        );
    }
    let too_large = || {
        text(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the review is larger than {MAX_BODY_BYTES} bytes"),
        )
    };
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|length| length.to_str().ok()?.parse::<usize>().ok());
    if declared.is_some_and(|length| length > MAX_BODY_BYTES) {
        return too_large();
    }
    let body = match Limited::new(request.into_body(), MAX_BODY_BYTES)
        .collect()
        .await
    {
        Ok(body) => body.to_bytes(),
        Err(error) if error.is::<http_body_util::LengthLimitError>() => return too_large(),
        Err(error) => {
            return text(
                StatusCode::BAD_REQUEST,
                format!("reading the body: {error}"),
            );
        }
    };
    let (uid, answer) = match review::decode(&body) {
        Err(error) => return text(StatusCode::BAD_REQUEST, error.to_string()),
        Ok(Decoded::Refused { uid, message }) => {
            admission.metrics.webhook_review("invalid", "denied");
            (uid, Answer::deny(400, "BadRequest", message))
        }
        Ok(Decoded::Unjudged { uid }) => (uid, Answer::allow()),
        // Each path judges its own operation: a validating webhook must not patch.
        Ok(Decoded::Review(review)) if review.operation != operation => {
            (review.uid, Answer::allow())
        }
        Ok(Decoded::Review(review)) => {
            let answer = admission.review(&review).await;
            (review.uid, answer)
        }
    };
    let mut response = Response::new(Full::new(Bytes::from(review::encode(&uid, &answer))));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    admission
        .metrics
        .webhook_duration
        .observe(started.elapsed().as_secs_f64());
    response
}
