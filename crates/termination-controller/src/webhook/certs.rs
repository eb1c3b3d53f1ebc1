//! The webhook's serving certificate, kept in a Secret every replica reads.
//!
//! Issued here (`--webhook-issue-certificates`): each certificate comes with a CA of its own,
//! made for it and never kept (no CA key is stored). A third of the way before the serving
//! certificate expires, the next one is issued and its CA added to `ca.crt` and to the
//! caBundle of the webhook configurations; only after that has reached the API server is the
//! next certificate served. The old CA stays in the bundle until it expires, so a replica that
//! still serves the old certificate is trusted all along.
//!
//! Issued elsewhere (cert-manager): the Secret is only read, and served as it changes.
//!
//! Every write carries the resourceVersion it was computed from, so replicas reconciling at
//! once agree: one wins, the others re-read.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use nodegrace_core::k8s::api_errors::status_code;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

pub const SERVING_CERT: &str = "tls.crt";
pub const SERVING_KEY: &str = "tls.key";
pub const CA_BUNDLE: &str = "ca.crt";
const NEXT_CERT: &str = "next.crt";
const NEXT_KEY: &str = "next.key";
/// The names the serving certificate was issued for; another set means a new certificate.
const DNS_NAMES_ANNOTATION: &str = "nodegrace.io/dns-names";
/// Shortest `--webhook-cert-validity`: rotation must not run into the time the API server
/// takes to see a new caBundle.
pub const MIN_VALIDITY: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("cannot issue a certificate: {0}")]
    Issue(#[from] rcgen::Error),
    #[error("{key}: {why}")]
    Unreadable { key: &'static str, why: String },
}

/// A certificate and its key, as PEM, with what rotation needs to know of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pair {
    pub cert_pem: String,
    pub key_pem: String,
    pub not_before: Timestamp,
    pub not_after: Timestamp,
    issuer: Vec<u8>,
}

/// A CA certificate in the bundle.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Authority {
    pem: String,
    subject: Vec<u8>,
    not_after: Timestamp,
}

/// What the Secret holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stored {
    pub serving: Option<Pair>,
    next: Option<Pair>,
    authorities: Vec<Authority>,
    dns_names: String,
}

fn parse_pem(pem: &str) -> Result<Vec<rustls::pki_types::CertificateDer<'static>>, String> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| error.to_string())
}

fn timestamp(time: x509_parser::time::ASN1Time) -> Timestamp {
    Timestamp::from_second(time.timestamp()).unwrap_or(Timestamp::MIN)
}

impl Pair {
    fn read(cert_pem: String, key_pem: String) -> Result<Self, String> {
        let ders = parse_pem(&cert_pem)?;
        let der = ders.first().ok_or("no certificate")?;
        let (_, cert) =
            x509_parser::parse_x509_certificate(der).map_err(|error| error.to_string())?;
        KeyPair::from_pem(&key_pem).map_err(|error| format!("the key: {error}"))?;
        Ok(Self {
            not_before: timestamp(cert.validity().not_before),
            not_after: timestamp(cert.validity().not_after),
            issuer: cert.issuer().as_raw().to_vec(),
            cert_pem,
            key_pem,
        })
    }
}

impl Stored {
    /// Reads the Secret's data; a serving pair that cannot be read counts as missing.
    pub fn read(secret: &Secret) -> Self {
        let text = |key: &str| {
            secret
                .data
                .as_ref()
                .and_then(|data| data.get(key))
                .and_then(|bytes| String::from_utf8(bytes.0.clone()).ok())
        };
        let pair = |cert: &str, key: &str| {
            let pair = Pair::read(text(cert)?, text(key)?);
            if let Err(why) = &pair {
                tracing::warn!(
                    secret = secret.metadata.name,
                    key = cert,
                    why,
                    "unreadable certificate"
                );
            }
            pair.ok()
        };
        let authorities = text(CA_BUNDLE)
            .and_then(|pem| parse_pem(&pem).ok())
            .unwrap_or_default()
            .into_iter()
            .filter_map(|der| {
                let (_, cert) = x509_parser::parse_x509_certificate(&der).ok()?;
                Some(Authority {
                    pem: pem_of(&der),
                    subject: cert.subject().as_raw().to_vec(),
                    not_after: timestamp(cert.validity().not_after),
                })
            })
            .collect();
        Self {
            serving: pair(SERVING_CERT, SERVING_KEY),
            next: pair(NEXT_CERT, NEXT_KEY),
            authorities,
            dns_names: secret
                .metadata
                .annotations
                .as_ref()
                .and_then(|annotations| annotations.get(DNS_NAMES_ANNOTATION))
                .cloned()
                .unwrap_or_default(),
        }
    }

    /// The caBundle: every CA still valid, PEM, newest last.
    pub fn ca_bundle(&self) -> String {
        self.authorities.iter().map(|ca| ca.pem.as_str()).collect()
    }

    fn data(&self) -> std::collections::BTreeMap<String, ByteString> {
        let mut data = std::collections::BTreeMap::new();
        let mut put = |key: &str, value: &str| {
            data.insert(key.to_owned(), ByteString(value.as_bytes().to_vec()));
        };
        if let Some(serving) = &self.serving {
            put(SERVING_CERT, &serving.cert_pem);
            put(SERVING_KEY, &serving.key_pem);
        }
        if let Some(next) = &self.next {
            put(NEXT_CERT, &next.cert_pem);
            put(NEXT_KEY, &next.key_pem);
        }
        put(CA_BUNDLE, &self.ca_bundle());
        data
    }

    fn signed_by_bundle(&self, pair: &Pair) -> bool {
        self.authorities.iter().any(|ca| ca.subject == pair.issuer)
    }
}

fn pem_of(der: &[u8]) -> String {
    use base64::Engine;
    let body = base64::engine::general_purpose::STANDARD.encode(der);
    let mut pem = String::from("-----BEGIN CERTIFICATE-----\n");
    for line in body.as_bytes().chunks(64) {
        pem.push_str(&String::from_utf8_lossy(line));
        pem.push('\n');
    }
    pem.push_str("-----END CERTIFICATE-----\n");
    pem
}

/// How the certificates are issued and where the caBundle goes.
#[derive(Debug, Clone)]
pub struct Issuing {
    /// The serving certificate's names: the Service's DNS names, or IP addresses.
    pub dns_names: Vec<String>,
    pub validity: Duration,
    /// Validating and Mutating webhook configurations of this name get the caBundle.
    pub configurations: Vec<String>,
}

impl Issuing {
    /// How long a new CA is in the caBundle before its certificate is served: the API server
    /// reloads webhook configurations from a watch, within a second or so.
    fn publish_delay(&self) -> Duration {
        (self.validity / 20).min(Duration::from_secs(60))
    }

    fn rotation_due(&self, serving: &Pair, now: Timestamp) -> bool {
        let left = serving.not_after.duration_since(now);
        left.is_negative() || left.unsigned_abs() < self.validity / 3
    }

    fn issue(&self, now: Timestamp) -> Result<(Pair, Authority), CertError> {
        let not_before = time::OffsetDateTime::from_unix_timestamp(now.as_second())
            .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
        let not_after = not_before + self.validity;
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        ca_params.distinguished_name.push(
            DnType::CommonName,
            format!("nodegrace termination-controller webhook CA {now}"),
        );
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign];
        ca_params.not_before = not_before;
        ca_params.not_after = not_after;
        let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate()?)?;
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(self.dns_names.clone())?;
        params
            .distinguished_name
            .push(DnType::CommonName, "termination-controller webhook");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.not_before = not_before;
        params.not_after = not_after;
        let cert = params.signed_by(&key, &ca)?;
        let unreadable = |why: String| CertError::Unreadable {
            key: SERVING_CERT,
            why,
        };
        let pair = Pair::read(cert.pem(), key.serialize_pem()).map_err(unreadable)?;
        let (_, parsed) =
            x509_parser::parse_x509_certificate(ca.der()).map_err(|e| unreadable(e.to_string()))?;
        let authority = Authority {
            pem: ca.pem(),
            subject: parsed.subject().as_raw().to_vec(),
            not_after: timestamp(parsed.validity().not_after),
        };
        Ok((pair, authority))
    }

    /// The next state of the Secret, and when to look again.
    pub fn step(&self, stored: &Stored, now: Timestamp) -> Result<(Stored, Timestamp), CertError> {
        let mut next = stored.clone();
        let names = self.dns_names.join(",");
        next.authorities.retain(|ca| ca.not_after > now);
        let serving_usable = next
            .serving
            .as_ref()
            .is_some_and(|serving| serving.not_after > now && next.signed_by_bundle(serving));
        if serving_usable {
            if next.next.is_none()
                && (next.dns_names != names
                    || next
                        .serving
                        .as_ref()
                        .is_some_and(|serving| self.rotation_due(serving, now)))
            {
                let (pair, authority) = self.issue(now)?;
                next.next = Some(pair);
                next.authorities.push(authority);
                next.dns_names = names;
            }
        } else {
            // Nothing servable: serve a new one at once (a short outage cannot be avoided).
            let (pair, authority) = self.issue(now)?;
            next.serving = Some(pair);
            next.next = None;
            next.authorities.push(authority);
            next.dns_names = names;
        }
        if next
            .next
            .as_ref()
            .is_some_and(|pair| !next.signed_by_bundle(pair))
        {
            next.next = None;
        }
        let mut wake = now + Duration::from_secs(3600);
        if let Some(pair) = &next.next {
            // not_before is the issue time rounded down to the second: counting from a second
            // later, the next certificate is never served in the pass that published its CA,
            // nor before a call already under way with the old caBundle has finished.
            let publish = pair.not_before + Duration::from_secs(1) + self.publish_delay();
            if publish <= now {
                next.serving = next.next.take();
            } else {
                wake = wake.min(publish);
            }
        }
        if let (Some(serving), None) = (&next.serving, &next.next) {
            let due = serving.not_after - self.validity / 3;
            wake = wake.min(due.max(now + Duration::from_secs(1)));
        }
        if let Some(earliest) = next.authorities.iter().map(|ca| ca.not_after).min() {
            wake = wake.min(earliest.max(now + Duration::from_secs(1)));
        }
        Ok((next, wake))
    }
}

/// One pass over the Secret: issue or rotate, write, publish the caBundle. Returns what the
/// Secret holds now and when to look again.
pub async fn reconcile(
    client: &Client,
    secrets: &Api<Secret>,
    name: &str,
    issuing: &Issuing,
) -> anyhow::Result<(Stored, Timestamp)> {
    use anyhow::Context;
    let current = secrets
        .get_opt(name)
        .await
        .with_context(|| format!("read Secret {name}"))?;
    let stored = current.as_ref().map(Stored::read).unwrap_or_default();
    // The caBundle goes out before a certificate of a new CA is served: a pass that issues
    // publishes, and only a later pass (after the publish delay) promotes.
    let now = Timestamp::now();
    let (mut wanted, mut wake) = issuing.step(&stored, now)?;
    if wanted.serving != stored.serving && stored.next.is_some() && wanted.next.is_none() {
        publish(client, issuing, &wanted.ca_bundle()).await?;
    }
    if wanted != stored {
        let mut secret = current.clone().unwrap_or_else(|| Secret {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..ObjectMeta::default()
            },
            type_: Some("kubernetes.io/tls".to_owned()),
            ..Secret::default()
        });
        secret.data = Some(wanted.data());
        secret
            .metadata
            .annotations
            .get_or_insert_default()
            .insert(DNS_NAMES_ANNOTATION.to_owned(), wanted.dns_names.clone());
        let written = match current {
            Some(_) => secrets.replace(name, &PostParams::default(), &secret).await,
            None => secrets.create(&PostParams::default(), &secret).await,
        };
        match written {
            Ok(_) => {}
            // Another replica wrote first: look again at once.
            Err(error) if matches!(status_code(&error), Some(409)) => {
                wanted = stored;
                wake = now;
            }
            Err(error) => return Err(error).with_context(|| format!("write Secret {name}")),
        }
    }
    publish(client, issuing, &wanted.ca_bundle()).await?;
    Ok((wanted, wake))
}

/// Sets the caBundle of every webhook in the named configurations.
async fn publish(client: &Client, issuing: &Issuing, bundle: &str) -> anyhow::Result<()> {
    let encoded = ByteString(bundle.as_bytes().to_vec());
    for name in &issuing.configurations {
        set_bundle::<ValidatingWebhookConfiguration>(client, name, &encoded).await?;
        set_bundle::<MutatingWebhookConfiguration>(client, name, &encoded).await?;
    }
    Ok(())
}

/// A webhook configuration kind: its webhooks' caBundle fields.
trait CaBundles:
    kube::Resource<DynamicType = ()>
    + Clone
    + serde::Serialize
    + serde::de::DeserializeOwned
    + std::fmt::Debug
{
    fn ca_bundles(&mut self) -> Vec<&mut Option<ByteString>>;
}

impl CaBundles for ValidatingWebhookConfiguration {
    fn ca_bundles(&mut self) -> Vec<&mut Option<ByteString>> {
        let webhooks = self.webhooks.iter_mut().flatten();
        webhooks
            .map(|webhook| &mut webhook.client_config.ca_bundle)
            .collect()
    }
}

impl CaBundles for MutatingWebhookConfiguration {
    fn ca_bundles(&mut self) -> Vec<&mut Option<ByteString>> {
        let webhooks = self.webhooks.iter_mut().flatten();
        webhooks
            .map(|webhook| &mut webhook.client_config.ca_bundle)
            .collect()
    }
}

async fn set_bundle<K: CaBundles>(
    client: &Client,
    name: &str,
    bundle: &ByteString,
) -> anyhow::Result<()> {
    use anyhow::Context;
    let api = Api::<K>::all(client.clone());
    for _ in 0..5 {
        // A configuration the chart did not make (only one of the two kinds) is fine.
        let Some(mut configuration) = api
            .get_opt(name)
            .await
            .context("read webhook configuration")?
        else {
            return Ok(());
        };
        let mut changed = false;
        for slot in configuration.ca_bundles() {
            if slot.as_ref() != Some(bundle) {
                *slot = Some(bundle.clone());
                changed = true;
            }
        }
        if !changed {
            return Ok(());
        }
        match api
            .replace(name, &PostParams::default(), &configuration)
            .await
        {
            Ok(_) => return Ok(()),
            Err(error) if status_code(&error) == Some(409) => {}
            Err(error) => {
                return Err(error).with_context(|| format!("set the caBundle of {name}"));
            }
        }
    }
    anyhow::bail!("webhook configuration {name} kept changing while its caBundle was set")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn issuing(validity: u64) -> Issuing {
        Issuing {
            dns_names: vec!["tc.ns.svc".to_owned(), "127.0.0.1".to_owned()],
            validity: Duration::from_secs(validity),
            configurations: vec![],
        }
    }

    #[test]
    fn issues_rotates_through_the_bundle_and_prunes() {
        let issuing = issuing(3000);
        let t0: Timestamp = "2026-11-23T10:00:00Z".parse().unwrap();
        let (first, wake) = issuing.step(&Stored::default(), t0).unwrap();
        let serving = first.serving.clone().unwrap();
        assert_eq!(first.authorities.len(), 1);
        assert_eq!(wake, serving.not_after - Duration::from_secs(1000));
        // Nothing to do before the last third.
        let (same, _) = issuing
            .step(&first, t0 + Duration::from_secs(1000))
            .unwrap();
        assert_eq!(same, first);
        // The last third: the next certificate and its CA come, the old one is still served.
        let t1 = t0 + Duration::from_secs(2001);
        let (rotating, wake) = issuing.step(&first, t1).unwrap();
        assert_eq!(rotating.serving, first.serving);
        assert_eq!(rotating.authorities.len(), 2);
        assert!(rotating.next.is_some());
        assert_eq!(wake, t1 + Duration::from_secs(61));
        // After the publish delay the next one is served; both CAs stay trusted.
        let (promoted, _) = issuing.step(&rotating, wake).unwrap();
        assert_eq!(promoted.serving, rotating.next);
        assert!(promoted.next.is_none());
        assert_eq!(promoted.authorities.len(), 2);
        // The old CA goes when it expires.
        let (pruned, _) = issuing
            .step(&promoted, serving.not_after + Duration::from_secs(1))
            .unwrap();
        assert_eq!(pruned.authorities.len(), 1);
        assert_eq!(pruned.serving, promoted.serving);
    }

    #[test]
    fn new_names_mean_a_new_certificate_and_garbage_means_a_fresh_start() {
        let issuing = issuing(3000);
        let t0 = Timestamp::now();
        let (first, _) = issuing.step(&Stored::default(), t0).unwrap();
        let renamed = Issuing {
            dns_names: vec!["other.ns.svc".to_owned()],
            ..issuing.clone()
        };
        let (rotating, _) = renamed.step(&first, t0).unwrap();
        assert!(rotating.next.is_some(), "new names rotate");
        let secret = Secret {
            data: Some(
                [(SERVING_CERT.to_owned(), ByteString(b"junk".to_vec()))]
                    .into_iter()
                    .collect(),
            ),
            ..Secret::default()
        };
        let stored = Stored::read(&secret);
        assert!(stored.serving.is_none());
        let (fresh, _) = issuing.step(&stored, t0).unwrap();
        assert!(fresh.serving.is_some());
        // What is written reads back the same.
        let written = Secret {
            data: Some(fresh.data()),
            metadata: ObjectMeta {
                annotations: Some(
                    [(DNS_NAMES_ANNOTATION.to_owned(), fresh.dns_names.clone())]
                        .into_iter()
                        .collect(),
                ),
                ..ObjectMeta::default()
            },
            ..Secret::default()
        };
        assert_eq!(Stored::read(&written), fresh);
    }
}
