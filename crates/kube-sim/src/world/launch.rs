//! What the kubelet works out before a container process starts, from the pod as the API
//! holds it (pkg/kubelet/kubelet_pods.go's makeEnvironmentVariables and the volume plugins):
//! the environment (values, ConfigMap and Secret references, `envFrom`, the downward API,
//! `$(VAR)` expansion, the in-cluster `KUBERNETES_SERVICE_*`), the command line, and each
//! volume made real on the host (ConfigMap, Secret, projected — with a bound ServiceAccount
//! token —, downward API, emptyDir, hostPath on the node's filesystem) with where it mounts.
//!
//! A process has no network namespace: it gets its own loopback address as pod IP, and
//! `0.0.0.0` and `[::]` (the unspecified addresses, which in a pod's own network namespace
//! mean its addresses) in its args and env are that address, so every pod can bind the ports
//! its chart names.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use base64::Engine;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::store::Store;
use crate::tokens::{API_AUDIENCE, TokenIssuer, service_account_claims};

/// How a pod's processes reach the API server, as in-cluster clients do.
#[derive(Debug, Clone)]
pub struct InCluster {
    pub host: String,
    pub port: u16,
    /// The CA of the serving certificate; empty over plain HTTP.
    pub ca_pem: String,
    pub tokens: TokenIssuer,
}

fn home(context: &Context<'_>) -> Result<PathBuf, String> {
    let home = context.pod_dir.join("home");
    std::fs::create_dir_all(&home).map_err(|e| format!("cannot make {}: {e}", home.display()))?;
    Ok(home)
}

/// A volume mounted into the container: `source` on the host at `target` in the container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mount {
    pub source: PathBuf,
    pub target: String,
    pub read_only: bool,
}

/// A container process, ready to start.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Launch {
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub working_dir: Option<String>,
    pub mounts: Vec<Mount>,
}

impl Launch {
    /// The program as a command: its arguments, only its own environment, its directory.
    pub fn command(&self) -> std::process::Command {
        let mut command = std::process::Command::new(&self.program);
        command
            .args(&self.args)
            .env_clear()
            .envs(self.env.iter().map(|(k, v)| (k, v)));
        if let Some(dir) = &self.working_dir {
            command.current_dir(dir);
        }
        command
    }
}

/// What preparing a container reads beyond the pod.
pub struct Context<'a> {
    pub store: &'a Store,
    pub in_cluster: &'a InCluster,
    /// Where the node's own filesystem is (hostPath volumes); the host's when `None`.
    pub node_root: Option<PathBuf>,
    /// The pod's own directory for the volumes the kubelet writes.
    pub pod_dir: PathBuf,
}

fn text(value: &Value) -> &str {
    value.as_str().unwrap_or_default()
}

/// The unspecified addresses in `value`, as the pod's own address.
fn bind_to_pod(value: String, pod_ip: &str) -> String {
    if pod_ip.is_empty() {
        return value;
    }
    value
        .replace("0.0.0.0:", &format!("{pod_ip}:"))
        .replace("[::]:", &format!("{pod_ip}:"))
}

pub fn prepare(
    context: &Context<'_>,
    pod: &Value,
    container: &Value,
    program: PathBuf,
    args: Vec<String>,
) -> Result<Launch, String> {
    let pod_ip = text(&pod["status"]["podIP"]).to_owned();
    let env = environment(context, pod, container)?;
    let lookup: BTreeMap<&str, &str> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let bind_here = |value: String| bind_to_pod(value, &pod_ip);
    let args = args
        .into_iter()
        .map(|arg| bind_here(expand(&arg, &lookup)))
        .collect();
    let env = env
        .iter()
        .map(|(name, value)| (name.clone(), bind_here(value.clone())))
        .collect();
    Ok(Launch {
        program,
        args,
        env,
        // An image without a WORKDIR starts in `/`, never in kube-sim's own directory.
        working_dir: Some(container["workingDir"].as_str().unwrap_or("/").to_owned()),
        mounts: mounts(context, pod, container)?,
    })
}

/// `$(NAME)` → the variable's value when defined (left as written otherwise); `$$` → `$`.
pub fn expand(text: &str, variables: &BTreeMap<&str, &str>) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(inner) = after.strip_prefix('(')
            && let Some(close) = inner.find(')')
        {
            let name = &inner[..close];
            if let Some(value) = variables.get(name) {
                out.push_str(value);
            } else {
                out.push_str("$(");
                out.push_str(name);
                out.push(')');
            }
            rest = &inner[close + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

fn environment(
    context: &Context<'_>,
    pod: &Value,
    container: &Value,
) -> Result<Vec<(String, String)>, String> {
    let namespace = text(&pod["metadata"]["namespace"]);
    let mut env: Vec<(String, String)> = vec![
        (
            "PATH".to_owned(),
            std::env::var("PATH").unwrap_or_else(|_| "/usr/local/bin:/usr/bin:/bin".to_owned()),
        ),
        (
            "HOSTNAME".to_owned(),
            text(&pod["metadata"]["name"]).to_owned(),
        ),
        // No image gives a home: the pod's own directory keeps what a program writes there
        // (kubectl's cache, say) off the host.
        ("HOME".to_owned(), home(context)?.display().to_string()),
    ];
    let host = &context.in_cluster.host;
    let port = context.in_cluster.port;
    for (name, value) in [
        ("KUBERNETES_SERVICE_HOST", host.clone()),
        ("KUBERNETES_SERVICE_PORT", port.to_string()),
        ("KUBERNETES_SERVICE_PORT_HTTPS", port.to_string()),
        ("KUBERNETES_PORT", format!("tcp://{host}:{port}")),
        ("KUBERNETES_PORT_443_TCP", format!("tcp://{host}:{port}")),
        ("KUBERNETES_PORT_443_TCP_PROTO", "tcp".to_owned()),
        ("KUBERNETES_PORT_443_TCP_PORT", port.to_string()),
        ("KUBERNETES_PORT_443_TCP_ADDR", host.clone()),
    ] {
        env.push((name.to_owned(), value));
    }
    let set = |env: &mut Vec<(String, String)>, name: String, value: String| {
        env.retain(|(existing, _)| *existing != name);
        env.push((name, value));
    };
    for source in container["envFrom"].as_array().into_iter().flatten() {
        let prefix = text(&source["prefix"]);
        let (reference, data) = if source["configMapRef"].is_object() {
            let reference = &source["configMapRef"];
            (
                reference,
                config_map_data(context.store, namespace, text(&reference["name"])),
            )
        } else {
            let reference = &source["secretRef"];
            (
                reference,
                secret_data(context.store, namespace, text(&reference["name"])),
            )
        };
        match data {
            Ok(data) => {
                for (key, value) in data {
                    set(
                        &mut env,
                        format!("{prefix}{key}"),
                        String::from_utf8_lossy(&value).into_owned(),
                    );
                }
            }
            Err(_) if reference["optional"].as_bool() == Some(true) => {}
            Err(error) => return Err(error),
        }
    }
    for variable in container["env"].as_array().into_iter().flatten() {
        let name = text(&variable["name"]).to_owned();
        let value = if let Some(value) = variable["value"].as_str() {
            let defined: BTreeMap<&str, &str> =
                env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            Some(expand(value, &defined))
        } else if variable["valueFrom"].is_object() {
            value_from(context.store, pod, namespace, &variable["valueFrom"])
                .map_err(|error| format!("env {name}: {error}"))?
        } else {
            Some(String::new())
        };
        if let Some(value) = value {
            set(&mut env, name, value);
        }
    }
    Ok(env)
}

/// A `valueFrom`'s value; `None` for a missing optional key.
fn value_from(
    store: &Store,
    pod: &Value,
    namespace: &str,
    source: &Value,
) -> Result<Option<String>, String> {
    let optional = |reference: &Value| reference["optional"].as_bool() == Some(true);
    if let Some(field) = source["fieldRef"]["fieldPath"].as_str() {
        return field_value(pod, field).map(Some);
    }
    for (key, read) in [
        (
            "configMapKeyRef",
            config_map_data as fn(&Store, &str, &str) -> Result<BTreeMap<String, Vec<u8>>, String>,
        ),
        ("secretKeyRef", secret_data),
    ] {
        let reference = &source[key];
        if !reference.is_object() {
            continue;
        }
        let wanted = text(&reference["key"]);
        return match read(store, namespace, text(&reference["name"])) {
            Ok(data) => match data.get(wanted) {
                Some(value) => Ok(Some(String::from_utf8_lossy(value).into_owned())),
                None if optional(reference) => Ok(None),
                None => Err(format!(
                    "couldn't find key {wanted} in {} {namespace}/{}",
                    if key == "secretKeyRef" {
                        "Secret"
                    } else {
                        "ConfigMap"
                    },
                    text(&reference["name"])
                )),
            },
            Err(_) if optional(reference) => Ok(None),
            Err(error) => Err(error),
        };
    }
    Err("only fieldRef, configMapKeyRef and secretKeyRef are supported".to_owned())
}

/// The downward API's fields of a pod.
fn field_value(pod: &Value, field: &str) -> Result<String, String> {
    let meta = &pod["metadata"];
    let from_map =
        |map: &Value, key: &str| text(&map[key.trim_matches(|c| c == '\'' || c == '"')]).to_owned();
    if let Some(key) = field
        .strip_prefix("metadata.labels[")
        .and_then(|rest| rest.strip_suffix(']'))
    {
        return Ok(from_map(&meta["labels"], key));
    }
    if let Some(key) = field
        .strip_prefix("metadata.annotations[")
        .and_then(|rest| rest.strip_suffix(']'))
    {
        return Ok(from_map(&meta["annotations"], key));
    }
    let value = match field {
        "metadata.name" => &meta["name"],
        "metadata.namespace" => &meta["namespace"],
        "metadata.uid" => &meta["uid"],
        "spec.nodeName" => &pod["spec"]["nodeName"],
        "spec.serviceAccountName" => &pod["spec"]["serviceAccountName"],
        "status.podIP" => &pod["status"]["podIP"],
        "status.hostIP" => &pod["status"]["hostIP"],
        "metadata.labels" | "metadata.annotations" => {
            let map = &meta[field.trim_start_matches("metadata.")];
            let lines: Vec<String> = map
                .as_object()
                .into_iter()
                .flatten()
                .map(|(k, v)| format!("{k}=\"{}\"", text(v)))
                .collect();
            return Ok(lines.join("\n"));
        }
        other => return Err(format!("fieldRef {other} is not supported")),
    };
    Ok(text(value).to_owned())
}

fn config_map_data(
    store: &Store,
    namespace: &str,
    name: &str,
) -> Result<BTreeMap<String, Vec<u8>>, String> {
    let config_map = store
        .get(&store.kind("", "configmaps"), Some(namespace), name)
        .map_err(|_| format!("configmap \"{name}\" not found"))?;
    let mut data: BTreeMap<String, Vec<u8>> = config_map["data"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(key, value)| (key.clone(), text(value).as_bytes().to_vec()))
        .collect();
    for (key, value) in config_map["binaryData"].as_object().into_iter().flatten() {
        if let Ok(bytes) = base64::engine::general_purpose::STANDARD.decode(text(value)) {
            data.insert(key.clone(), bytes);
        }
    }
    Ok(data)
}

fn secret_data(
    store: &Store,
    namespace: &str,
    name: &str,
) -> Result<BTreeMap<String, Vec<u8>>, String> {
    let secret = store
        .get(&store.kind("", "secrets"), Some(namespace), name)
        .map_err(|_| format!("secret \"{name}\" not found"))?;
    Ok(secret["data"]
        .as_object()
        .into_iter()
        .flatten()
        .filter_map(|(key, value)| {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(text(value))
                .ok()?;
            Some((key.clone(), bytes))
        })
        .collect())
}

/// The files of a ConfigMap or Secret volume: `items` when given, every key otherwise.
fn keyed_files(
    data: &BTreeMap<String, Vec<u8>>,
    items: &Value,
    kind: &str,
    name: &str,
) -> Result<Vec<(String, Vec<u8>)>, String> {
    let Some(items) = items.as_array() else {
        return Ok(data.iter().map(|(k, v)| (k.clone(), v.clone())).collect());
    };
    items
        .iter()
        .map(|item| {
            let key = text(&item["key"]);
            let value = data.get(key).ok_or_else(|| {
                format!("configuration of volume {kind} {name}: key {key} not found")
            })?;
            Ok((text(&item["path"]).to_owned(), value.clone()))
        })
        .collect()
}

fn mounts(context: &Context<'_>, pod: &Value, container: &Value) -> Result<Vec<Mount>, String> {
    let volumes = pod["spec"]["volumes"]
        .as_array()
        .map_or(&[][..], Vec::as_slice);
    let mut mounts = Vec::new();
    for mount in container["volumeMounts"].as_array().into_iter().flatten() {
        let name = text(&mount["name"]);
        let volume = volumes
            .iter()
            .find(|volume| volume["name"] == name)
            .ok_or_else(|| format!("volumeMount {name} names no volume of the pod"))?;
        let mut source = volume_source(context, pod, volume)?;
        if let Some(sub_path) = mount["subPath"].as_str().filter(|p| !p.is_empty()) {
            if sub_path.split('/').any(|part| part == "..") || sub_path.starts_with('/') {
                return Err(format!(
                    "subPath {sub_path:?} must be a relative path without '..'"
                ));
            }
            source = source.join(sub_path);
        }
        mounts.push(Mount {
            source,
            target: text(&mount["mountPath"]).to_owned(),
            read_only: mount["readOnly"].as_bool() == Some(true),
        });
    }
    Ok(mounts)
}

/// The host path behind a volume, made (and filled) for the API-backed kinds.
fn volume_source(context: &Context<'_>, pod: &Value, volume: &Value) -> Result<PathBuf, String> {
    let name = text(&volume["name"]);
    let namespace = text(&pod["metadata"]["namespace"]);
    if let Some(host_path) = volume.get("hostPath") {
        return host_path_source(context, text(&host_path["path"]), text(&host_path["type"]));
    }
    let dir = context.pod_dir.join("volumes").join(name);
    let files: Vec<(String, Vec<u8>)> = if volume.get("emptyDir").is_some() {
        std::fs::create_dir_all(&dir).map_err(|e| format!("emptyDir {name}: {e}"))?;
        return Ok(dir);
    } else if let Some(source) = volume.get("configMap") {
        config_map_files(context.store, namespace, source)?
    } else if let Some(source) = volume.get("secret") {
        secret_files(context.store, namespace, source)?
    } else if let Some(source) = volume.get("downwardAPI") {
        downward_files(pod, &source["items"])?
    } else if let Some(projected) = volume.get("projected") {
        let mut files = Vec::new();
        for source in projected["sources"].as_array().into_iter().flatten() {
            if let Some(token) = source.get("serviceAccountToken") {
                files.push((
                    text(&token["path"]).to_owned(),
                    service_account_token(context, pod, token)?.into_bytes(),
                ));
            } else if let Some(config_map) = source.get("configMap") {
                files.extend(config_map_files(context.store, namespace, config_map)?);
            } else if let Some(secret) = source.get("secret") {
                files.extend(secret_files(context.store, namespace, secret)?);
            } else if let Some(downward) = source.get("downwardAPI") {
                files.extend(downward_files(pod, &downward["items"])?);
            }
        }
        files
    } else {
        return Err(format!(
            "volume {name}: only configMap, secret, projected, downwardAPI, emptyDir and hostPath volumes are supported"
        ));
    };
    write_files(&dir, &files).map_err(|e| format!("volume {name}: {e}"))?;
    Ok(dir)
}

fn config_map_files(
    store: &Store,
    namespace: &str,
    source: &Value,
) -> Result<Vec<(String, Vec<u8>)>, String> {
    let name = text(&source["name"]);
    match config_map_data(store, namespace, name) {
        Ok(data) => keyed_files(&data, &source["items"], "configmap", name),
        Err(_) if source["optional"].as_bool() == Some(true) => Ok(Vec::new()),
        Err(error) => Err(error),
    }
}

fn secret_files(
    store: &Store,
    namespace: &str,
    source: &Value,
) -> Result<Vec<(String, Vec<u8>)>, String> {
    let name = source["secretName"]
        .as_str()
        .or_else(|| source["name"].as_str())
        .unwrap_or_default();
    match secret_data(store, namespace, name) {
        Ok(data) => keyed_files(&data, &source["items"], "secret", name),
        Err(_) if source["optional"].as_bool() == Some(true) => Ok(Vec::new()),
        Err(error) => Err(error),
    }
}

fn downward_files(pod: &Value, items: &Value) -> Result<Vec<(String, Vec<u8>)>, String> {
    items
        .as_array()
        .into_iter()
        .flatten()
        .map(|item| {
            let field = text(&item["fieldRef"]["fieldPath"]);
            Ok((
                text(&item["path"]).to_owned(),
                field_value(pod, field)?.into_bytes(),
            ))
        })
        .collect()
}

/// A token for the pod's ServiceAccount, bound to the pod (and so to its node), as the kubelet
/// requests one through TokenRequest.
fn service_account_token(
    context: &Context<'_>,
    pod: &Value,
    source: &Value,
) -> Result<String, String> {
    let namespace = text(&pod["metadata"]["namespace"]);
    let account_name = pod["spec"]["serviceAccountName"]
        .as_str()
        .unwrap_or("default");
    let account = context
        .store
        .get(
            &context.store.kind("", "serviceaccounts"),
            Some(namespace),
            account_name,
        )
        .map_err(|_| format!("serviceaccounts \"{account_name}\" not found"))?;
    let node_name = text(&pod["spec"]["nodeName"]);
    let node = context
        .store
        .get(&context.store.kind("", "nodes"), None, node_name)
        .map(|node| json!({"name": node_name, "uid": node["metadata"]["uid"]}))
        .ok();
    let audience = source["audience"]
        .as_str()
        .filter(|a| !a.is_empty())
        .unwrap_or(API_AUDIENCE);
    let seconds = source["expirationSeconds"]
        .as_i64()
        .unwrap_or(3607)
        .max(600);
    let bound =
        json!({"kind": "Pod", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]});
    let claims = service_account_claims(
        namespace,
        &account,
        &json!([audience]),
        seconds,
        &bound,
        node.as_ref(),
    );
    Ok(context.in_cluster.tokens.issue(&claims))
}

fn write_files(dir: &Path, files: &[(String, Vec<u8>)]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    for (path, contents) in files {
        if path.split('/').any(|part| part == "..") || path.starts_with('/') {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("item path {path:?} must be relative, without '..'"),
            ));
        }
        let file = dir.join(path);
        if let Some(parent) = file.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(file, contents)?;
    }
    Ok(())
}

/// A hostPath on the pod's node, checked (and made) as its `type` says.
fn host_path_source(context: &Context<'_>, path: &str, kind: &str) -> Result<PathBuf, String> {
    let real = match &context.node_root {
        Some(root) => root.join(path.trim_start_matches('/')),
        None => PathBuf::from(path),
    };
    let failed = |what: &str| Err(format!("hostPath type check failed: {path} is not {what}"));
    match kind {
        "DirectoryOrCreate" => {
            std::fs::create_dir_all(&real).map_err(|e| format!("hostPath {path}: {e}"))?;
        }
        "FileOrCreate" => {
            if let Some(parent) = real.parent() {
                std::fs::create_dir_all(parent).map_err(|e| format!("hostPath {path}: {e}"))?;
            }
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&real)
                .map_err(|e| format!("hostPath {path}: {e}"))?;
        }
        "Directory" if !real.is_dir() => return failed("a directory"),
        "File" if !real.is_file() => return failed("a file"),
        "Socket" => {
            use std::os::unix::fs::FileTypeExt;
            let socket = std::fs::metadata(&real).is_ok_and(|m| m.file_type().is_socket());
            if !socket {
                return failed("a socket file");
            }
        }
        _ if !real.exists() && !kind.is_empty() => return failed("present"),
        _ => {}
    }
    Ok(real)
}

#[cfg(test)]
mod tests {
    #[test]
    fn both_unspecified_addresses_are_the_pods_own() {
        for arg in ["--admin-listen=0.0.0.0:9452", "--admin-listen=[::]:9452"] {
            assert_eq!(
                bind_to_pod(arg.to_owned(), "127.64.0.2"),
                "--admin-listen=127.64.0.2:9452"
            );
        }
        assert_eq!(bind_to_pod("[::]:1".to_owned(), ""), "[::]:1");
    }

    use super::*;

    #[test]
    fn references_expand_as_the_kubelet_expands_them() {
        let variables = BTreeMap::from([("NODE", "node-1"), ("EMPTY", "")]);
        assert_eq!(expand("--node=$(NODE)", &variables), "--node=node-1");
        assert_eq!(expand("$(MISSING)/$(EMPTY)x", &variables), "$(MISSING)/x");
        assert_eq!(expand("$$(NODE) costs $5", &variables), "$(NODE) costs $5");
        assert_eq!(expand("open $(NODE", &variables), "open $(NODE");
    }

    #[test]
    fn the_downward_api_reads_the_pod() {
        let pod = json!({"metadata": {"name": "p", "labels": {"app": "web"}}, "status": {"podIP": "127.64.0.2"}});
        assert_eq!(field_value(&pod, "metadata.labels['app']").unwrap(), "web");
        assert_eq!(field_value(&pod, "status.podIP").unwrap(), "127.64.0.2");
        assert!(field_value(&pod, "spec.unknown").is_err());
    }
}
