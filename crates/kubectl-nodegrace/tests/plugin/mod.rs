//! The plugin on PATH behind the real kubectl, and the programs it reads started in-process.
#![allow(dead_code)] // each scenario uses its part

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, ensure};
use serde_json::Value;
use tempfile::TempDir;

pub use nodegrace_testing::wait_for;

/// `kubectl` with a PATH where `kubectl-nodegrace` is this build's binary, and a kubeconfig.
#[derive(Debug)]
pub struct Kubectl {
    bin: TempDir,
    kubeconfig: PathBuf,
}

impl Kubectl {
    pub fn new(kubeconfig: &Path) -> Result<Self> {
        let bin = tempfile::tempdir()?;
        std::os::unix::fs::symlink(
            env!("CARGO_BIN_EXE_kubectl-nodegrace"),
            bin.path().join("kubectl-nodegrace"),
        )?;
        Ok(Self {
            bin,
            kubeconfig: kubeconfig.to_owned(),
        })
    }

    fn command(&self, program: &str) -> tokio::process::Command {
        let path = std::env::var_os("PATH").unwrap_or_default();
        let mut paths = vec![self.bin.path().to_owned()];
        paths.extend(std::env::split_paths(&path));
        let mut command = tokio::process::Command::new(program);
        command
            .env("PATH", std::env::join_paths(paths).expect("PATH entries"))
            .env("KUBECONFIG", &self.kubeconfig)
            .env_remove("NO_COLOR")
            .kill_on_drop(true);
        command
    }

    /// `kubectl <args>`: stdout, or an error with stderr.
    pub async fn run(&self, args: &[&str]) -> Result<String> {
        let output = self
            .command("kubectl")
            .args(args)
            .output()
            .await
            .context("run kubectl (is it on PATH?)")?;
        ensure!(
            output.status.success(),
            "kubectl {} failed: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr),
            String::from_utf8_lossy(&output.stdout)
        );
        Ok(String::from_utf8(output.stdout)?)
    }

    /// `kubectl nodegrace <args>`, expected to fail: its stderr.
    pub async fn nodegrace_fails(&self, args: &[&str]) -> Result<String> {
        let output = self
            .command("kubectl")
            .arg("nodegrace")
            .args(args)
            .output()
            .await?;
        ensure!(
            !output.status.success(),
            "kubectl nodegrace {args:?} succeeded"
        );
        Ok(String::from_utf8(output.stderr)?)
    }

    /// `kubectl nodegrace <args>`.
    pub async fn nodegrace(&self, args: &[&str]) -> Result<String> {
        let mut all = vec!["nodegrace"];
        all.extend(args);
        self.run(&all).await
    }

    /// `kubectl nodegrace <args> -o json`, parsed.
    pub async fn json(&self, args: &[&str]) -> Result<Value> {
        let mut all = args.to_vec();
        all.extend(["-o", "json"]);
        let text = self.nodegrace(&all).await?;
        serde_json::from_str(&text).with_context(|| format!("parse: {text}"))
    }

    /// Runs a command the plugin suggested, through a shell as an operator pastes it.
    pub async fn paste(&self, command: &str) -> Result<String> {
        let output = self
            .command("sh")
            .arg("-c")
            .arg(command)
            .output()
            .await
            .context("run sh")?;
        ensure!(
            output.status.success(),
            "{command} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        Ok(String::from_utf8(output.stdout)?)
    }

    /// Runs a suggested command that must fail now: the value it was based on changed.
    pub async fn paste_fails(&self, command: &str) -> Result<String> {
        let output = self.command("sh").arg("-c").arg(command).output().await?;
        ensure!(
            !output.status.success(),
            "{command} succeeded on a changed object"
        );
        Ok(String::from_utf8(output.stderr)?)
    }

    /// The `status` rows of `node` (every program's).
    pub async fn rows(&self, node: &str) -> Result<Vec<Value>> {
        let status = self.json(&["status"]).await?;
        Ok(status["nodes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|row| row["node"] == node)
            .cloned()
            .collect())
    }

    /// The row of `node` by `program`, if it is in a lifecycle state.
    pub async fn row(&self, node: &str, program: &str) -> Result<Option<Value>> {
        Ok(self
            .rows(node)
            .await?
            .into_iter()
            .find(|row| row["program"] == program))
    }

    /// Waits for `node`'s row by `program` to be at `step`, and returns it.
    pub async fn row_at(&self, node: &str, program: &str, step: &str) -> Result<Value> {
        let found = std::sync::Mutex::new(None);
        wait_for(&format!("{node}: {program} at {step}"), || async {
            let row = self
                .row(node, program)
                .await?
                .filter(|row| row["step"] == step);
            let seen = row.is_some();
            *found.lock().expect("not poisoned") = row;
            Ok(seen)
        })
        .await?;
        Ok(found
            .into_inner()
            .expect("not poisoned")
            .expect("found by the wait"))
    }

    /// Waits for `node` to have no row by `program` at `step` any more: it moved on.
    pub async fn moves_on(&self, node: &str, program: &str, step: &str) -> Result<()> {
        wait_for(
            &format!("{node} to move on from {program} {step}"),
            || async {
                Ok(self
                    .row(node, program)
                    .await?
                    .is_none_or(|row| row["step"] != step))
            },
        )
        .await
    }
}

/// The row's suggested command.
pub fn command(row: &Value) -> Result<String> {
    row["next"]["command"]
        .as_str()
        .map(ToOwned::to_owned)
        .with_context(|| format!("no command in {row:#}"))
}

/// Asserts `row`'s blocker says `text` and names `object` (`Kind ns/name` or `Kind name`).
pub fn blocked_by(row: &Value, text: &str, object: &str) -> Result<()> {
    let said = row["blockedBy"]["text"].as_str().unwrap_or_default();
    ensure!(
        said.contains(text),
        "blocked by {said:?}, not {text:?}: {row:#}"
    );
    let found = &row["blockedBy"]["object"];
    let named = match found["namespace"].as_str() {
        Some(namespace) => format!(
            "{} {namespace}/{}",
            found["kind"].as_str().unwrap_or_default(),
            found["name"].as_str().unwrap_or_default()
        ),
        None => format!(
            "{} {}",
            found["kind"].as_str().unwrap_or_default(),
            found["name"].as_str().unwrap_or_default()
        ),
    };
    ensure!(
        named == object,
        "the blocker's object is {named:?}, not {object:?}: {row:#}"
    );
    Ok(())
}

/// The plugin for a ServiceAccount bound to the docs' `nodegrace-viewer` ClusterRole, less the
/// rules for `without` resources (e.g. `leases`).
pub async fn viewer(sim: &kube_sim::KubeSim, account: &str, without: &[&str]) -> Result<Kubectl> {
    use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
    use k8s_openapi::api::core::v1::ServiceAccount;
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
    use kube::Api;
    use kube::api::PostParams;
    use serde_json::json;

    let docs = include_str!("../../../../docs/kubectl-nodegrace.md");
    let block = docs
        .split("<!-- viewer-role -->")
        .nth(1)
        .and_then(|rest| rest.split("<!-- /viewer-role -->").next())
        .context("docs/kubectl-nodegrace.md has its viewer role")?;
    let yaml = block
        .trim()
        .trim_start_matches("```yaml")
        .trim_end_matches("```");
    let mut role: Value = serde_yaml_ng::from_str(yaml)?;
    role["metadata"]["name"] = json!(account);
    if let Some(rules) = role["rules"].as_array_mut() {
        rules.retain(|rule| {
            !rule["resources"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|resource| without.iter().any(|left| resource == left))
        });
    }
    let client = sim.client();
    let post = PostParams::default();
    Api::<ClusterRole>::all(client.clone())
        .create(&post, &serde_json::from_value(role)?)
        .await?;
    let accounts = Api::<ServiceAccount>::namespaced(client.clone(), "default");
    accounts
        .create(
            &post,
            &serde_json::from_value(json!({"metadata": {"name": account}}))?,
        )
        .await?;
    Api::<ClusterRoleBinding>::all(client.clone())
        .create(
            &post,
            &serde_json::from_value(json!({
                "metadata": {"name": account},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": account},
                "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": "default"}],
            }))?,
        )
        .await?;
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(3600),
            ..TokenRequestSpec::default()
        }),
        ..TokenRequest::default()
    };
    let token = accounts
        .create_token_request(account, &post, &request)
        .await?
        .status
        .and_then(|status| status.token)
        .context("a token")?;
    let mut kubeconfig: Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(sim.kubeconfig_path())?)?;
    for user in kubeconfig["users"].as_array_mut().into_iter().flatten() {
        user["user"] = json!({"token": token});
    }
    let path = sim
        .kubeconfig_path()
        .with_file_name(format!("{account}.kubeconfig"));
    std::fs::write(&path, serde_yaml_ng::to_string(&kubeconfig)?)?;
    Kubectl::new(&path)
}

/// `status -o json` without the time it was read: what two users are compared on.
pub async fn status_facts(kubectl: &Kubectl) -> Result<Value> {
    let mut status = kubectl.json(&["status"]).await?;
    if let Some(object) = status.as_object_mut() {
        object.remove("observedAt");
    }
    for row in status["nodes"].as_array_mut().into_iter().flatten() {
        if let Some(object) = row.as_object_mut() {
            object.remove("since");
        }
        // "held by … for 3s": the age moves between two reads.
        if let Some(text) = row["blockedBy"]["text"].as_str() {
            let kept = text.split(" for ").next().unwrap_or(text).to_owned();
            row["blockedBy"]["text"] = Value::String(kept);
        }
    }
    Ok(status)
}

/// A running `kubectl nodegrace status --watch -o json`: the lines it printed so far.
#[derive(Debug)]
pub struct Watch {
    _child: tokio::process::Child,
    lines: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Kubectl {
    pub fn watch(&self) -> Result<Watch> {
        use tokio::io::AsyncBufReadExt as _;
        let mut child = self
            .command("kubectl")
            .args(["nodegrace", "status", "--watch", "-o", "json"])
            .stdout(std::process::Stdio::piped())
            .spawn()?;
        let stdout = child.stdout.take().context("the watch's stdout")?;
        let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = std::sync::Arc::clone(&lines);
        tokio::spawn(async move {
            let mut reader = tokio::io::BufReader::new(stdout).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                sink.lock().expect("not poisoned").push(line);
            }
        });
        Ok(Watch {
            _child: child,
            lines,
        })
    }
}

impl Watch {
    /// Waits for a one-line row of `node` whose `field` is `value`.
    pub async fn printed(&self, node: &str, field: &str, value: &str) -> Result<()> {
        wait_for(
            &format!("the watch to print {node} {field}={value}"),
            || async {
                let lines = self.lines.lock().expect("not poisoned");
                Ok(lines.iter().any(|line| {
                    serde_json::from_str::<Value>(line)
                        .is_ok_and(|row| row["node"] == node && row[field] == value)
                }))
            },
        )
        .await
    }
}
