//! The demo's kubelet for our own images: a pod bound to a node whose image is one of the
//! program binaries is started as a process of that node, from the pod's spec as the chart
//! rendered it — args, env (values and the downward API), ConfigMap and hostPath volumes, the
//! readiness probe.
//!
//! A process is not a container: it shares the host's filesystem and network. So mount paths in
//! args and env are rewritten to the real paths behind them, a port bound on `0.0.0.0` binds on
//! the node's own loopback address, and the in-cluster credentials are the cluster's kubeconfig
//! (`KUBECONFIG`). Everything else comes from the pod unchanged.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{Api, Client};
use serde_json::Value;

use crate::node_host::NodeHost;
use crate::processes::Guarded;

/// Which binary runs an image: `<registry>/<owner>/<program>:<tag>` runs `<dir>/<program>`,
/// unless an override names another binary for that program.
#[derive(Debug, Clone)]
pub struct ImageBinaries {
    pub dir: PathBuf,
    pub overrides: BTreeMap<String, PathBuf>,
}

impl ImageBinaries {
    /// The program an image carries, if it is one of ours.
    pub fn program_of(image: &str) -> &str {
        let without_digest = image.split('@').next().unwrap_or(image);
        let last = without_digest.rsplit('/').next().unwrap_or(without_digest);
        last.split(':').next().unwrap_or(last)
    }

    pub fn binary_for(&self, image: &str) -> Result<PathBuf> {
        let program = Self::program_of(image);
        if let Some(binary) = self.overrides.get(program) {
            return Ok(binary.clone());
        }
        let binary = self.dir.join(program);
        if !binary.is_file() {
            bail!(
                "no binary for image {image}: {} does not exist (build it with `cargo build --release -p {program}`)",
                binary.display()
            );
        }
        Ok(binary)
    }
}

/// A pod's process and how to ask it whether it is ready.
#[derive(Debug)]
pub struct PodProcess {
    pub namespace: String,
    pub pod: String,
    pub node: String,
    pub program: String,
    pub log: PathBuf,
    pub readiness: Option<(SocketAddr, String)>,
    process: Guarded,
}

impl PodProcess {
    pub fn has_exited(&mut self) -> bool {
        self.process.exited().is_some()
    }

    /// Ends the process at once, as a machine losing power ends it.
    pub fn kill(&mut self) {
        self.process.kill();
    }
}

/// Starts `pod` (bound to `host`) as a process.
pub async fn start(
    client: &Client,
    pod: &Value,
    host: &NodeHost,
    binaries: &ImageBinaries,
    kubeconfig: &Path,
) -> Result<PodProcess> {
    let namespace = text(&pod["metadata"]["namespace"]).to_owned();
    let name = text(&pod["metadata"]["name"]).to_owned();
    let containers = pod["spec"]["containers"]
        .as_array()
        .map_or(&[][..], Vec::as_slice);
    let [container] = containers else {
        bail!("pod {namespace}/{name}: the demo's kubelet runs pods of exactly one container");
    };
    if !container["command"].is_null() {
        bail!("pod {namespace}/{name}: `command` is not supported; the image's entrypoint runs");
    }
    let image = text(&container["image"]);
    let program = ImageBinaries::program_of(image).to_owned();
    let binary = binaries.binary_for(image)?;
    let pod_dir = host.pod_dir(&namespace, &name);
    let mounts = mounts(client, pod, container, host, &pod_dir).await?;
    let rewrite = |value: &str| {
        let value = rewrite_mount_paths(value, &mounts);
        value.replace("0.0.0.0:", &format!("{}:", host.address()))
    };
    let args: Vec<String> = container["args"]
        .as_array()
        .map(|args| args.iter().map(|arg| rewrite(text(arg))).collect())
        .unwrap_or_default();
    let mut env = vec![("KUBECONFIG".to_owned(), kubeconfig.display().to_string())];
    for variable in container["env"].as_array().into_iter().flatten() {
        let value = env_value(pod, variable)
            .with_context(|| format!("pod {namespace}/{name}: env {}", text(&variable["name"])))?;
        env.push((text(&variable["name"]).to_owned(), rewrite(&value)));
    }
    let readiness = readiness_target(container, host)?;
    let log = pod_dir.join(format!("{}.log", text(&container["name"])));
    std::fs::create_dir_all(&pod_dir)?;
    let process = Guarded::spawn(&format!("{namespace}/{name}"), &binary, &args, &env, &log)?;
    Ok(PodProcess {
        namespace,
        pod: name,
        node: host.name().to_owned(),
        program,
        log,
        readiness,
        process,
    })
}

fn text(value: &Value) -> &str {
    value.as_str().unwrap_or_default()
}

/// (mount path in the container, real path), longest mount path first so nested mounts win.
async fn mounts(
    client: &Client,
    pod: &Value,
    container: &Value,
    host: &NodeHost,
    pod_dir: &Path,
) -> Result<Vec<(String, PathBuf)>> {
    let namespace = text(&pod["metadata"]["namespace"]);
    let volumes = pod["spec"]["volumes"]
        .as_array()
        .map_or(&[][..], Vec::as_slice);
    let mut mounts = Vec::new();
    for mount in container["volumeMounts"].as_array().into_iter().flatten() {
        // The API credentials are the cluster's kubeconfig here (KUBECONFIG).
        if mount["mountPath"] == "/var/run/secrets/kubernetes.io/serviceaccount" {
            continue;
        }
        let volume_name = text(&mount["name"]);
        let volume = volumes
            .iter()
            .find(|volume| volume["name"] == volume_name)
            .with_context(|| format!("volumeMount {volume_name} names no volume of the pod"))?;
        let real = if let Some(config_map) = volume.get("configMap") {
            let dir = pod_dir.join("volumes").join(volume_name);
            write_config_map(client, namespace, text(&config_map["name"]), &dir).await?;
            dir
        } else if let Some(host_path) = volume.get("hostPath") {
            let real = host.host_path(text(&host_path["path"]))?;
            if host_path["type"] == "DirectoryOrCreate" {
                std::fs::create_dir_all(&real)
                    .with_context(|| format!("create {}", real.display()))?;
            }
            real
        } else {
            bail!(
                "volume {volume_name}: the demo's kubelet mounts configMap and hostPath volumes only"
            );
        };
        mounts.push((text(&mount["mountPath"]).to_owned(), real));
    }
    mounts.sort_by_key(|(path, _)| std::cmp::Reverse(path.len()));
    Ok(mounts)
}

async fn write_config_map(client: &Client, namespace: &str, name: &str, dir: &Path) -> Result<()> {
    let config_map = Api::<ConfigMap>::namespaced(client.clone(), namespace)
        .get(name)
        .await
        .with_context(|| format!("read ConfigMap {namespace}/{name}"))?;
    std::fs::create_dir_all(dir)?;
    for (key, value) in config_map.data.unwrap_or_default() {
        std::fs::write(dir.join(&key), value)
            .with_context(|| format!("write ConfigMap key {key}"))?;
    }
    Ok(())
}

/// Replaces a mount path (as a whole path component) by the real path behind it.
fn rewrite_mount_paths(value: &str, mounts: &[(String, PathBuf)]) -> String {
    for (mount_path, real) in mounts {
        let mut from = 0;
        while let Some(found) = value[from..].find(mount_path.as_str()) {
            let start = from + found;
            let end = start + mount_path.len();
            if value[end..].is_empty() || value[end..].starts_with('/') {
                return format!("{}{}{}", &value[..start], real.display(), &value[end..]);
            }
            from = end;
        }
    }
    value.to_owned()
}

/// An env var's value: a literal or the downward API fields the kubelet resolves.
fn env_value(pod: &Value, variable: &Value) -> Result<String> {
    if let Some(value) = variable["value"].as_str() {
        return Ok(value.to_owned());
    }
    let field = text(&variable["valueFrom"]["fieldRef"]["fieldPath"]);
    let resolved = match field {
        "spec.nodeName" => &pod["spec"]["nodeName"],
        "metadata.name" => &pod["metadata"]["name"],
        "metadata.namespace" => &pod["metadata"]["namespace"],
        "status.podIP" => &pod["status"]["podIP"],
        "" => bail!("only `value` and `valueFrom.fieldRef` are supported"),
        other => bail!("fieldRef {other} is not supported"),
    };
    Ok(text(resolved).to_owned())
}

/// The address and path of the container's HTTP readiness probe, if it has one.
fn readiness_target(container: &Value, host: &NodeHost) -> Result<Option<(SocketAddr, String)>> {
    let probe = &container["readinessProbe"]["httpGet"];
    if probe.is_null() {
        return Ok(None);
    }
    let port = match &probe["port"] {
        Value::Number(number) => number.as_u64(),
        Value::String(name) => container["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|port| port["name"] == *name)
            .and_then(|port| port["containerPort"].as_u64()),
        _ => None,
    };
    let port = port
        .and_then(|port| u16::try_from(port).ok())
        .context("readinessProbe.httpGet.port names no container port")?;
    Ok(Some((
        SocketAddr::from((host.address(), port)),
        text(&probe["path"]).to_owned(),
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_name_their_program() {
        for image in [
            "ghcr.io/nodegrace/graceful-shutdown-agent:0.1.0",
            "ghcr.io/nodegrace/graceful-shutdown-agent@sha256:abc",
            "graceful-shutdown-agent",
        ] {
            assert_eq!(ImageBinaries::program_of(image), "graceful-shutdown-agent");
        }
    }

    #[test]
    fn mount_paths_are_rewritten_as_whole_components() {
        let mounts = vec![
            ("/etc/nodegrace".to_owned(), PathBuf::from("/demo/config")),
            (
                "/host/dbus/system_bus_socket".to_owned(),
                PathBuf::from("/demo/bus"),
            ),
        ];
        let rewrite = |value| rewrite_mount_paths(value, &mounts);
        assert_eq!(
            rewrite("--config=/etc/nodegrace/config.yaml"),
            "--config=/demo/config/config.yaml"
        );
        assert_eq!(
            rewrite("unix:path=/host/dbus/system_bus_socket"),
            "unix:path=/demo/bus"
        );
        assert_eq!(
            rewrite("--state-dir=/etc/nodegrace-state"),
            "--state-dir=/etc/nodegrace-state"
        );
        assert_eq!(rewrite("--log-level=info"), "--log-level=info");
    }

    #[test]
    fn env_comes_from_values_and_the_downward_api() {
        let pod = serde_json::json!({
            "metadata": {"name": "agent-x", "namespace": "nodegrace"},
            "spec": {"nodeName": "node-1"},
        });
        let field = |path: &str| serde_json::json!({"name": "X", "valueFrom": {"fieldRef": {"fieldPath": path}}});
        assert_eq!(env_value(&pod, &field("spec.nodeName")).unwrap(), "node-1");
        assert_eq!(env_value(&pod, &field("metadata.name")).unwrap(), "agent-x");
        assert_eq!(
            env_value(&pod, &field("metadata.namespace")).unwrap(),
            "nodegrace"
        );
        assert_eq!(
            env_value(&pod, &serde_json::json!({"name": "X", "value": "v"})).unwrap(),
            "v"
        );
        let unsupported = env_value(&pod, &field("metadata.labels")).unwrap_err();
        assert!(
            unsupported.to_string().contains("metadata.labels"),
            "{unsupported}"
        );
    }
}
