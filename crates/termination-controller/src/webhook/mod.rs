//! The admission webhook, served by every replica (not only the leader) from the same process
//! as the controller: it reads the controller's caches of nodes and NodeDisruptionBudgets and
//! takes grants through the same status record, so a second program would only repeat the
//! caches and the grant code.

pub mod admit;
pub mod certs;
pub mod review;
pub mod server;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Secret;
use kube::runtime::watcher;
use kube::{Api, Client};
use nodegrace_core::backoff::Backoff;
use nodegrace_core::error_chain::Chain;
use nodegrace_core::k8s::watched::{WatchCounters, Watched};
use tokio_util::sync::CancellationToken;

use crate::webhook::certs::{Issuing, SERVING_CERT, SERVING_KEY, Stored};
use crate::webhook::server::ServingCertificate;

/// Where the serving certificate comes from.
#[derive(Debug, Clone)]
pub struct CertificateSource {
    pub secret: String,
    pub namespace: String,
    /// Issue and rotate it here; `None` when something else (cert-manager) writes the Secret.
    pub issuing: Option<Issuing>,
}

const RETRY: Backoff = Backoff {
    first: Duration::from_secs(1),
    longest: Duration::from_secs(30),
};

/// Keeps `serving` loaded from the Secret (and, when issuing, the Secret issued, rotated and
/// its caBundle published) until `stop`.
pub async fn keep_certificate(
    client: Client,
    source: CertificateSource,
    serving: Arc<ServingCertificate>,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &source.namespace);
    let mut cache = Watched::start(
        secrets.clone(),
        watcher::Config::default().fields(&format!("metadata.name={}", source.secret)),
        WatchCounters::default(),
    );
    cache
        .synced()
        .await
        .context("watch the webhook certificate Secret")?;
    let mut failures = 0;
    loop {
        let outcome = match &source.issuing {
            Some(issuing) => certs::reconcile(&client, &secrets, &source.secret, issuing)
                .await
                .map(|(stored, wake)| (stored.serving, Some(wake))),
            None => Ok((
                cache
                    .get(Some(&source.namespace), &source.secret)
                    .and_then(|secret| Stored::read(&secret).serving),
                None,
            )),
        };
        let wake = match outcome {
            Ok((serving_pair, wake)) => {
                failures = 0;
                if let Some(pair) = serving_pair {
                    if let Err(why) = serving.load(&pair.cert_pem, &pair.key_pem) {
                        tracing::warn!(secret = source.secret, why, "cannot serve the certificate");
                    }
                } else {
                    tracing::warn!(
                        secret = source.secret,
                        namespace = source.namespace,
                        "the webhook certificate Secret has no usable {SERVING_CERT} and \
                         {SERVING_KEY} yet"
                    );
                }
                wake.map(|wake| wake.duration_since(Timestamp::now()).unsigned_abs())
            }
            Err(error) => {
                failures += 1;
                tracing::warn!(error = %Chain(error.as_ref()), "webhook certificate");
                Some(RETRY.delay(failures))
            }
        };
        let sleep = tokio::time::sleep(wake.unwrap_or(Duration::from_secs(3600)));
        tokio::select! {
            () = stop.cancelled() => return Ok(()),
            () = sleep => {}
            changed = cache.changed() => changed.context("watch the webhook certificate Secret")?,
        }
    }
}
