//! `--tls`: a throwaway CA and a serving certificate for 127.0.0.1/localhost, the CA going
//! into the kubeconfig as `certificate-authority-data`.

use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio_rustls::TlsAcceptor;

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot generate the serving certificate: {0}")]
    Certificate(#[from] rcgen::Error),
    #[error("cannot configure TLS: {0}")]
    Rustls(#[from] rustls::Error),
}

pub struct ServingTls {
    pub ca_pem: String,
    pub acceptor: TlsAcceptor,
}

impl std::fmt::Debug for ServingTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServingTls").finish_non_exhaustive()
    }
}

pub fn generate() -> Result<ServingTls, TlsError> {
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "kube-sim CA");
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate()?)?;

    let serving_key = KeyPair::generate()?;
    let mut serving_params =
        CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])?;
    serving_params
        .distinguished_name
        .push(DnType::CommonName, "kube-sim");
    let serving = serving_params.signed_by(&serving_key, &ca)?;

    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(
            vec![serving.der().clone(), ca.der().clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(serving_key.serialize_der())),
        )?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(ServingTls {
        ca_pem: ca.pem(),
        acceptor: TlsAcceptor::from(Arc::new(config)),
    })
}
