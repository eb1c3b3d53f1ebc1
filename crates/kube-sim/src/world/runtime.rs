//! The container runtime, for images an option maps to local programs: such a container runs
//! as a real process (its own process group) as launch.rs prepared it, stdout and stderr in a
//! log file per container that `pods/log` serves. Other images stay simulated (they run until
//! stopped and log nothing).

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::str::FromStr;
use std::sync::Arc;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde_json::Value;

use crate::json::owned_strings;
use tokio::sync::mpsc;

use super::launch::Launch;

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
        let command = owned_strings(&container["command"]);
        let mut args = owned_strings(&container["args"]);
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

    /// The pod's own directory: its logs, its volumes, its containers' specs.
    pub fn pod_dir(&self, uid: &str) -> PathBuf {
        self.dir.path().join(uid)
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
    /// The `kube-sim` binary, whose `run-container` mounts volumes; without it volumes are
    /// not mounted.
    container_init: Option<PathBuf>,
    logs: Logs,
    exits: mpsc::UnboundedSender<Exit>,
    /// Process groups of running containers, by pod UID and container name.
    running: HashMap<(String, String), Pid>,
}

impl Runtime {
    pub fn new(
        rules: Vec<ImageRule>,
        container_init: Option<PathBuf>,
        logs: Logs,
    ) -> (Self, mpsc::UnboundedReceiver<Exit>) {
        let (exits, receiver) = mpsc::unbounded_channel();
        let runtime = Self {
            rules,
            container_init,
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

    /// The program and arguments the container's image rule names.
    pub fn command(&self, container: &Value) -> Result<(PathBuf, Vec<String>), String> {
        let rule = self
            .rule_for(container)
            .ok_or("no image rule matches this container")?;
        rule.command(container)
            .ok_or_else(|| "the container names no command and its image no program".to_owned())
    }

    /// Starts a container's process; a previous run's log becomes the `previous` log. The
    /// container init (`kube-sim run-container`), when known, ties the process's life to
    /// kube-sim's, mounts its volumes in a mount namespace of its own, then becomes the
    /// program.
    pub fn start(&mut self, uid: &str, name: &str, launch: &Launch) -> Result<(), String> {
        let log = self.logs.current(uid, name);
        let log_file = open_log(&log, &self.logs.previous(uid, name))
            .map_err(|e| format!("cannot open the log {}: {e}", log.display()))?;
        let stderr = log_file
            .try_clone()
            .map_err(|e| format!("cannot share the log file: {e}"))?;
        let mut command = if let Some(init) = &self.container_init {
            let spec = self.logs.pod_dir(uid).join(format!("{name}.json"));
            let json = serde_json::to_vec(launch).map_err(|e| e.to_string())?;
            std::fs::write(&spec, json)
                .map_err(|e| format!("cannot write {}: {e}", spec.display()))?;
            let mut command = tokio::process::Command::new(init);
            command
                .arg("run-container")
                .arg(spec)
                .arg(format!("--simulator-pid={}", std::process::id()))
                .env_clear();
            command
        } else {
            tokio::process::Command::from(launch.command())
        };
        command
            .stdin(Stdio::null())
            .stdout(log_file)
            .stderr(stderr)
            .process_group(0)
            .kill_on_drop(true);
        let mut child = command
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", launch.program.display()))?;
        let pid = child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .map(Pid::from_raw)
            .ok_or("the process ended before it could be watched")?;
        let (uid, name) = (uid.to_owned(), name.to_owned());
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
    pub fn is_running(&self, uid: &str, container: &str) -> bool {
        self.running
            .contains_key(&(uid.to_owned(), container.to_owned()))
    }

    pub fn any_running(&self, uid: &str) -> bool {
        self.running.keys().any(|(pod, _)| pod == uid)
    }

    /// Sends `signal` to one container's process group.
    pub fn signal_container(&self, uid: &str, container: &str, signal: Signal) {
        if let Some(pid) = self.running.get(&(uid.to_owned(), container.to_owned())) {
            // Gone already: its exit is on its way.
            let _ = killpg(*pid, signal);
        }
    }

    pub fn pod_dir(&self, uid: &str) -> PathBuf {
        self.logs.pod_dir(uid)
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
}
