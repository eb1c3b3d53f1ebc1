//! The container runtime, for images an option maps to local programs: such a container runs
//! as a real process (its own process group), with the container's command, args and plain
//! environment, stdout and stderr in a log file per container that `pods/log` serves. Other
//! images stay simulated (they run until stopped and log nothing).

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::str::FromStr;
use std::sync::Arc;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde_json::Value;
use tokio::sync::mpsc;

/// `PATTERN=DIR`: containers whose image matches PATTERN (exact, or a prefix ending in `*`) run
/// the program named by their `command[0]` (or, without a command, by the image's last path
/// segment without tag) from DIR.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageRule {
    pattern: String,
    dir: PathBuf,
}

impl FromStr for ImageRule {
    type Err = String;

    fn from_str(rule: &str) -> Result<Self, Self::Err> {
        let (pattern, dir) = rule.split_once('=').ok_or_else(|| {
            format!("image rule {rule:?} has no '=': write PATTERN=DIR, e.g. 'busybox:*=/bin'")
        })?;
        if pattern.is_empty() || dir.is_empty() {
            return Err(format!(
                "image rule {rule:?} needs both a pattern and a directory, e.g. 'busybox:*=/bin'"
            ));
        }
        Ok(Self {
            pattern: pattern.to_owned(),
            dir: PathBuf::from(dir),
        })
    }
}

impl ImageRule {
    fn matches(&self, image: &str) -> bool {
        match self.pattern.strip_suffix('*') {
            Some(prefix) => image.starts_with(prefix),
            None => image == self.pattern,
        }
    }

    /// The program and arguments a container runs under this rule.
    fn command(&self, container: &Value) -> Option<(PathBuf, Vec<String>)> {
        let strings = |value: &Value| -> Vec<String> {
            value
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        };
        let command = strings(&container["command"]);
        let mut args = strings(&container["args"]);
        let program = match command.split_first() {
            Some((program, rest)) => {
                let mut all = rest.to_vec();
                all.append(&mut args);
                args = all;
                program.rsplit('/').next().unwrap_or(program).to_owned()
            }
            None => image_program(container["image"].as_str()?)?,
        };
        Some((self.dir.join(program), args))
    }
}

/// `registry/org/name:tag@digest` → `name`.
fn image_program(image: &str) -> Option<String> {
    let without_digest = image.split('@').next()?;
    let last = without_digest.rsplit('/').next()?;
    let name = last.split(':').next()?;
    (!name.is_empty()).then(|| name.to_owned())
}

/// Where containers' logs live: one file per container, and the previous run's beside it.
#[derive(Debug, Clone)]
pub struct Logs {
    dir: Arc<tempfile::TempDir>,
}

impl Logs {
    pub fn new() -> std::io::Result<Self> {
        Ok(Self {
            dir: Arc::new(tempfile::Builder::new().prefix("kube-sim-logs").tempdir()?),
        })
    }

    pub fn current(&self, uid: &str, container: &str) -> PathBuf {
        self.dir.path().join(uid).join(format!("{container}.log"))
    }

    pub fn previous(&self, uid: &str, container: &str) -> PathBuf {
        self.dir
            .path()
            .join(uid)
            .join(format!("{container}.previous.log"))
    }
}

/// A container process ended with this code (128 + signal when a signal ended it).
#[derive(Debug)]
pub struct Exit {
    pub uid: String,
    pub container: String,
    pub code: i32,
}

pub struct Runtime {
    rules: Vec<ImageRule>,
    logs: Logs,
    exits: mpsc::UnboundedSender<Exit>,
    /// Process groups of running containers, by pod UID and container name.
    running: HashMap<(String, String), Pid>,
}

impl Runtime {
    pub fn new(rules: Vec<ImageRule>, logs: Logs) -> (Self, mpsc::UnboundedReceiver<Exit>) {
        let (exits, receiver) = mpsc::unbounded_channel();
        let runtime = Self {
            rules,
            logs,
            exits,
            running: HashMap::new(),
        };
        (runtime, receiver)
    }

    fn rule_for(&self, container: &Value) -> Option<&ImageRule> {
        let image = container["image"].as_str()?;
        self.rules.iter().find(|rule| rule.matches(image))
    }

    /// Whether this container runs as a process here.
    pub fn runs(&self, container: &Value) -> bool {
        self.rule_for(container).is_some()
    }

    /// Starts a container's process; a previous run's log becomes the `previous` log.
    pub fn start(&mut self, pod: &Value, container: &Value) -> Result<(), String> {
        let rule = self
            .rule_for(container)
            .ok_or("no image rule matches this container")?;
        let (program, args) = rule
            .command(container)
            .ok_or("the container names no command and its image no program")?;
        let uid = pod["metadata"]["uid"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let name = container["name"].as_str().unwrap_or_default().to_owned();
        let log = self.logs.current(&uid, &name);
        let log_file = open_log(&log, &self.logs.previous(&uid, &name))
            .map_err(|e| format!("cannot open the log {}: {e}", log.display()))?;
        let stderr = log_file
            .try_clone()
            .map_err(|e| format!("cannot share the log file: {e}"))?;
        let mut command = tokio::process::Command::new(&program);
        command
            .args(&args)
            .env_clear()
            .envs(std::env::var_os("PATH").map(|path| ("PATH", path)))
            .env(
                "HOSTNAME",
                pod["metadata"]["name"].as_str().unwrap_or_default(),
            )
            .envs(environment(pod, container))
            .stdin(Stdio::null())
            .stdout(log_file)
            .stderr(stderr)
            .process_group(0)
            .kill_on_drop(true);
        if let Some(dir) = container["workingDir"].as_str() {
            command.current_dir(dir);
        }
        let mut child = command
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", program.display()))?;
        let pid = child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .map(Pid::from_raw)
            .ok_or("the process ended before it could be watched")?;
        self.running.insert((uid.clone(), name.clone()), pid);
        let exits = self.exits.clone();
        tokio::spawn(async move {
            let code = match child.wait().await {
                Ok(status) => exit_code(status),
                Err(_) => 128,
            };
            let _ = exits.send(Exit {
                uid,
                container: name,
                code,
            });
        });
        Ok(())
    }

    /// Forgets an ended process.
    pub fn exited(&mut self, exit: &Exit) {
        self.running
            .remove(&(exit.uid.clone(), exit.container.clone()));
    }

    /// Whether any of the pod's containers still runs as a process.
    pub fn any_running(&self, uid: &str) -> bool {
        self.running.keys().any(|(pod, _)| pod == uid)
    }

    /// Sends `signal` to every process group of the pod.
    pub fn signal(&self, uid: &str, signal: Signal) {
        for ((pod, _), pid) in &self.running {
            if pod == uid {
                // Gone already: its exit is on its way.
                let _ = killpg(*pid, signal);
            }
        }
    }
}

/// Truncates the log for a new run, keeping the last run's as the previous log.
fn open_log(current: &Path, previous: &Path) -> std::io::Result<File> {
    if let Some(dir) = current.parent() {
        std::fs::create_dir_all(dir)?;
    }
    if current.exists() {
        std::fs::rename(current, previous)?;
    }
    File::create(current)
}

fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .or_else(|| status.signal().map(|signal| 128 + signal))
        .unwrap_or(128)
}

/// The container's `env`: plain values, and the downward API fields a pod knows of itself.
fn environment(pod: &Value, container: &Value) -> Vec<(String, String)> {
    container["env"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|entry| {
            let name = entry["name"].as_str()?.to_owned();
            if let Some(value) = entry["value"].as_str() {
                return Some((name, value.to_owned()));
            }
            let value = match entry["valueFrom"]["fieldRef"]["fieldPath"].as_str()? {
                "metadata.name" => &pod["metadata"]["name"],
                "metadata.namespace" => &pod["metadata"]["namespace"],
                "metadata.uid" => &pod["metadata"]["uid"],
                "spec.nodeName" => &pod["spec"]["nodeName"],
                "spec.serviceAccountName" => &pod["spec"]["serviceAccountName"],
                "status.podIP" => &pod["status"]["podIP"],
                _ => return None,
            };
            Some((name, value.as_str().unwrap_or_default().to_owned()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn rules_parse_match_and_name_the_program() {
        let rule: ImageRule = "busybox:*=/bin".parse().unwrap();
        assert!(rule.matches("busybox:stable"));
        assert!(!rule.matches("nginx:1"));
        let container =
            json!({"image": "busybox:stable", "command": ["sh", "-c"], "args": ["echo hi"]});
        assert_eq!(
            rule.command(&container),
            Some((
                PathBuf::from("/bin/sh"),
                vec!["-c".to_owned(), "echo hi".to_owned()]
            ))
        );
        let bare: ImageRule = "ghcr.io/nodegrace/*=target/release".parse().unwrap();
        let agent = json!({"image": "ghcr.io/nodegrace/out-of-service-gc:0.1@sha256:ab", "args": ["--help"]});
        assert_eq!(
            bare.command(&agent),
            Some((
                PathBuf::from("target/release/out-of-service-gc"),
                vec!["--help".to_owned()]
            ))
        );
        assert!("no-equals".parse::<ImageRule>().is_err());
        assert!("=dir".parse::<ImageRule>().is_err());
    }

    #[test]
    fn environment_has_values_and_downward_fields() {
        let pod = json!({"metadata": {"name": "p", "namespace": "ns"}, "spec": {"nodeName": "n"}});
        let container = json!({"env": [
            {"name": "A", "value": "1"},
            {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": "SECRET", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
        ]});
        assert_eq!(
            environment(&pod, &container),
            vec![
                ("A".to_owned(), "1".to_owned()),
                ("NODE".to_owned(), "n".to_owned())
            ]
        );
    }
}
