//! A client with the user's own credentials, found as kubectl finds them.

use std::path::Path;

use anyhow::Context as _;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

/// A client for `context` of `kubeconfig` (else `$KUBECONFIG` or `~/.kube/config`, else the
/// pod's service account), and the namespace its context names.
pub async fn connect(
    kubeconfig: Option<&Path>,
    context: Option<&str>,
) -> anyhow::Result<(Client, String)> {
    let options = KubeConfigOptions {
        context: context.map(ToOwned::to_owned),
        ..KubeConfigOptions::default()
    };
    let mut config = match kubeconfig {
        Some(path) => {
            let file = Kubeconfig::read_from(path).with_context(|| {
                format!("read the kubeconfig {} (--kubeconfig)", path.display())
            })?;
            Config::from_custom_kubeconfig(file, &options)
                .await
                .with_context(|| format!("use the kubeconfig {}", path.display()))?
        }
        None if context.is_some() => Config::from_kubeconfig(&options)
            .await
            .context("use the context given by --context ($KUBECONFIG or ~/.kube/config)")?,
        None => Config::infer().await.context(
            "find a kubeconfig: set --kubeconfig or $KUBECONFIG, or write ~/.kube/config",
        )?,
    };
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_static(concat!("kubectl-nodegrace/", env!("CARGO_PKG_VERSION"))),
    ));
    let namespace = config.default_namespace.clone();
    let client = Client::try_from(config).context("build the Kubernetes client")?;
    Ok((client, namespace))
}
