//! Any cloud through a command the operator provides: `<command> state <providerID> [<node>]`
//! prints `running`, `stopping`, `stopped`, `terminated` or `not-found`; `<command> terminate <providerID> [<node>]`
//! exits 0 once the cloud accepted the request (the node's name comes last when the id was
//! read from a Node, so a script can look the machine up by either). A non-zero exit is a transient failure (tried again later), with
//! the command's stderr in the error; a command that does not finish within the timeout is
//! killed and counts as failed.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;

use super::{InstanceError, InstanceProvider, InstanceState, ProviderId};

#[derive(Debug, Clone)]
pub struct ExecInstances {
    command: PathBuf,
    timeout: Duration,
}

impl ExecInstances {
    pub fn new(command: PathBuf, timeout: Duration) -> Self {
        Self { command, timeout }
    }

    async fn run(&self, verb: &str, id: &ProviderId) -> Result<String, InstanceError> {
        let shown = format!("{} {verb} {id}", self.command.display());
        let child = tokio::process::Command::new(&self.command)
            .args([verb, id.as_str()])
            .args(id.node())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|error| InstanceError::Refused(format!("cannot run {shown}: {error}")))?;
        let output = tokio::time::timeout(self.timeout, child.wait_with_output())
            .await
            .map_err(|_| {
                InstanceError::Transient(format!(
                    "{shown} did not finish within {:?}",
                    self.timeout
                ))
            })?
            .map_err(|error| InstanceError::Transient(format!("{shown}: {error}")))?;
        if !output.status.success() {
            let stderr = String::from_utf8_lossy(&output.stderr);
            return Err(InstanceError::Transient(format!(
                "{shown} failed ({}): {}",
                output.status,
                stderr.trim()
            )));
        }
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
    }
}

impl InstanceProvider for ExecInstances {
    fn name(&self) -> &'static str {
        "exec"
    }

    fn state<'a>(
        &'a self,
        id: &'a ProviderId,
    ) -> BoxFuture<'a, Result<InstanceState, InstanceError>> {
        async move {
            let printed = self.run("state", id).await?;
            InstanceState::parse(&printed).ok_or_else(|| {
                InstanceError::Refused(format!(
                    "{} state {id} printed {printed:?}; it must print running, stopping, \
                     stopped, terminated or not-found",
                    self.command.display()
                ))
            })
        }
        .boxed()
    }

    fn terminate<'a>(&'a self, id: &'a ProviderId) -> BoxFuture<'a, Result<(), InstanceError>> {
        async move { self.run("terminate", id).await.map(drop) }.boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A provider script that answers from a state file next to it.
    fn script(dir: &std::path::Path, body: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.join("provider");
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    #[tokio::test]
    async fn the_command_reports_states_and_terminates() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("calls");
        let command = script(
            dir.path(),
            &format!(
                "echo \"$1 $2\" >> {log}\ncase \"$2\" in aws:///a) echo stopped;; \
                 aws:///b) echo '  running ';; *) echo sideways;; esac",
                log = log.display()
            ),
        );
        let provider = ExecInstances::new(command, Duration::from_secs(10));
        let state = |id: &'static str| {
            let provider = provider.clone();
            async move { provider.state(&ProviderId::new(id)).await }
        };
        assert_eq!(state("aws:///a").await.unwrap(), InstanceState::Stopped);
        assert_eq!(state("aws:///b").await.unwrap(), InstanceState::Running);
        let error = state("aws:///c").await.unwrap_err().to_string();
        assert!(error.contains("printed \"sideways\""), "{error}");
        provider
            .terminate(&ProviderId::new("aws:///a"))
            .await
            .unwrap();
        let calls = std::fs::read_to_string(&log).unwrap();
        assert!(calls.ends_with("terminate aws:///a\n"), "{calls}");
    }

    #[tokio::test]
    async fn failures_and_hangs_are_transient_errors_with_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        let failing = ExecInstances::new(
            script(dir.path(), "echo 'no credentials' >&2; exit 3"),
            Duration::from_secs(10),
        );
        let error = failing
            .terminate(&ProviderId::new("aws:///a"))
            .await
            .unwrap_err();
        assert!(matches!(error, InstanceError::Transient(_)), "{error}");
        assert!(error.to_string().contains("no credentials"), "{error}");

        let hanging_dir = tempfile::tempdir().unwrap();
        let hanging = ExecInstances::new(
            script(hanging_dir.path(), "exec sleep 30"),
            Duration::from_millis(200),
        );
        let error = hanging
            .state(&ProviderId::new("aws:///a"))
            .await
            .unwrap_err();
        assert!(error.to_string().contains("did not finish"), "{error}");

        let missing = ExecInstances::new(dir.path().join("absent"), Duration::from_secs(1));
        let error = missing
            .state(&ProviderId::new("aws:///a"))
            .await
            .unwrap_err();
        assert!(matches!(error, InstanceError::Refused(_)), "{error}");
    }
}
