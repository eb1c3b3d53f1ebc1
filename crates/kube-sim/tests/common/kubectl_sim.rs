//! The simulator binary run as a server, and the real kubectl pointed at it.

// Each test binary uses its own share of the harness.
#![allow(dead_code, reason = "shared by several test binaries")]

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};

use super::files;
use files::wait_for_file;

pub struct Sim {
    child: Child,
    pub dir: tempfile::TempDir,
    pub url: String,
}

impl Drop for Sim {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Sim {
    pub fn start(nodes: usize) -> Result<Self> {
        Self::start_with(nodes, &[])
    }

    pub fn start_with(nodes: usize, extra: &[&str]) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let kubeconfig = dir.path().join("kubeconfig");
        let mut child = Command::new(env!("CARGO_BIN_EXE_kube-sim"))
            .args(["serve", "--nodes", &nodes.to_string()])
            .args(extra)
            .arg("--kubeconfig-out")
            .arg(&kubeconfig)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?;
        if !wait_for_file(&kubeconfig, Duration::from_secs(30))? {
            let _ = child.kill();
            bail!(
                "kube-sim did not write its kubeconfig ({:?})",
                child.wait()?
            );
        }
        let text = std::fs::read_to_string(&kubeconfig)?;
        let url = text
            .lines()
            .find_map(|l| l.trim().strip_prefix("server: "))
            .context("no server in kubeconfig")?
            .to_owned();
        Ok(Self { child, dir, url })
    }

    /// One node whose Lease is renewed every 200 ms and which turns Unknown after 1 s of
    /// silence (the real defaults are 10 s and 40 s).
    pub fn with_quick_leases() -> Result<Self> {
        Self::start_with(
            1,
            &[
                "--node-lease-renew-interval=200ms",
                "--node-monitor-grace-period=1s",
            ],
        )
    }

    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.path().join("kubeconfig")
    }

    pub fn kubectl(&self, args: &[&str]) -> Result<Output> {
        Ok(Command::new("kubectl")
            .args(args)
            .env("KUBECONFIG", self.kubeconfig())
            .output()?)
    }

    /// Runs kubectl and returns stdout, failing with stderr when it fails.
    pub fn ok(&self, args: &[&str]) -> Result<String> {
        let output = self.kubectl(args)?;
        ensure!(
            output.status.success(),
            "kubectl {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// `kubectl get <what…> -o jsonpath=<path>`.
    pub fn jsonpath(&self, what: &[&str], path: &str) -> Result<String> {
        let output = format!("jsonpath={path}");
        let mut args = vec!["get"];
        args.extend_from_slice(what);
        args.extend_from_slice(&["-o", &output]);
        self.ok(&args)
    }

    /// Stops `node`'s simulated kubelet, as a machine losing power stops it.
    pub fn stop_kubelet(&self, node: &str) -> Result<()> {
        self.ok(&["annotate", "node", node, "sim.nodegrace.io/kubelet=stopped"])?;
        Ok(())
    }

    /// `node`'s Ready condition status (`True`, `False`, `Unknown`).
    pub fn node_ready(&self, node: &str) -> Result<String> {
        self.jsonpath(
            &["node", node],
            r#"{.status.conditions[?(@.type=="Ready")].status}"#,
        )
    }

    /// Waits until `node`'s silence is noticed: its Ready condition turns Unknown.
    pub fn wait_node_unknown(&self, node: &str, timeout: Duration) -> Result<()> {
        self.wait_for(
            &format!("{node} to turn Unknown"),
            "nodes",
            timeout,
            |sim| Ok(sim.node_ready(node)? == "Unknown"),
        )
    }

    /// KEP-2268's taint, as an operator puts it on a node whose machine is off.
    pub fn taint_out_of_service(&self, node: &str) -> Result<()> {
        self.ok(&[
            "taint",
            "node",
            node,
            "node.kubernetes.io/out-of-service=nodeshutdown:NoExecute",
        ])?;
        Ok(())
    }

    pub fn apply(&self, yaml: &str) -> Result<String> {
        let path = self
            .dir
            .path()
            .join(format!("manifest-{}.yaml", rand_suffix()));
        std::fs::write(&path, yaml)?;
        self.ok(&["apply", "-f", path.to_str().unwrap_or_default()])
    }

    /// A TokenRequest for `account` (bound to a pod when given: name and uid), as kubectl's
    /// `--token=…` flag.
    pub fn token_flag(
        &self,
        namespace: &str,
        account: &str,
        pod: Option<(&str, &str)>,
    ) -> Result<String> {
        let bound = pod.map_or_else(String::new, |(name, uid)| {
            format!(r#""boundObjectRef":{{"kind":"Pod","apiVersion":"v1","name":"{name}","uid":"{uid}"}}"#)
        });
        let body = self
            .dir
            .path()
            .join(format!("token-request-{}.json", rand_suffix()));
        std::fs::write(
            &body,
            format!(
                r#"{{"apiVersion":"authentication.k8s.io/v1","kind":"TokenRequest","spec":{{{bound}}}}}"#
            ),
        )?;
        let answer = self.ok(&[
            "create",
            "--raw",
            &format!("/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token"),
            "-f",
            body.to_str().unwrap_or_default(),
        ])?;
        let answer: serde_json::Value = serde_json::from_str(&answer)?;
        let token = answer["status"]["token"]
            .as_str()
            .context("no token in the TokenRequest's answer")?;
        Ok(format!("--token={token}"))
    }

    /// Waits until `check` holds, checking again whenever an object of `resource` changes:
    /// a `kubectl get --watch` started before the first check prints a line for each change
    /// (or, listing, for one made before its watch began), so none goes unseen.
    pub fn wait_for(
        &self,
        what: &str,
        resource: &str,
        timeout: Duration,
        mut check: impl FnMut(&Self) -> Result<bool>,
    ) -> Result<()> {
        let mut watch = Command::new("kubectl")
            .args(["get", resource, "--all-namespaces", "--watch", "-o", "name"])
            .env("KUBECONFIG", self.kubeconfig())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?;
        let lines = watch
            .stdout
            .take()
            .context("no stdout of kubectl --watch")?;
        let (changed, changes) = mpsc::channel();
        std::thread::spawn(move || {
            for _ in BufReader::new(lines).lines() {
                if changed.send(()).is_err() {
                    break;
                }
            }
        });
        let deadline = Instant::now() + timeout;
        let waited = (|| loop {
            if check(self)? {
                return Ok(());
            }
            match changes.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(()) => {}
                Err(RecvTimeoutError::Timeout) => bail!("timed out waiting for {what}"),
                Err(RecvTimeoutError::Disconnected) => {
                    bail!("the watch of {resource} ended while waiting for {what}")
                }
            }
        })();
        let _ = watch.kill();
        let _ = watch.wait();
        waited
    }
}

pub fn rand_suffix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

pub fn kubectl_missing() -> bool {
    let missing = Command::new("kubectl")
        .arg("version")
        .arg("--client")
        .output()
        .is_err();
    if missing {
        eprintln!("SKIPPED: kubectl is not on PATH; the kubectl conformance tests need it");
    }
    missing
}
