//! Printing an error with its causes, each once.
//!
//! Many errors (ours and kube's among them) repeat their source in their own message and also
//! return it from `source()`, so a naive walk of the chain prints "…: X: X". The chain printed
//! here skips a cause whose text the message before it already contains.

use std::error::Error;
use std::fmt;
use std::process::ExitCode;

/// `error` and its causes as one line, `outer: cause: root`, each cause once.
#[derive(Debug, Clone, Copy)]
pub struct Chain<'a>(pub &'a (dyn Error + 'static));

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut said = self.0.to_string();
        f.write_str(&said)?;
        let mut cause = self.0.source();
        while let Some(error) = cause {
            let text = error.to_string();
            if !said.contains(&text) {
                write!(f, ": {text}")?;
                said = text;
            }
            cause = error.source();
        }
        Ok(())
    }
}

/// The end of a program's `main`: an error is printed to stderr once, as one line, with no
/// backtrace (`RUST_BACKTRACE` is for developers, not for container logs), and the process
/// exits 1.
pub fn exit_code<E: AsRef<dyn Error + 'static>>(result: Result<(), E>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("Error: {}", Chain(error.as_ref()));
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("read config {path}: {source}")]
    struct Repeats {
        path: &'static str,
        #[source]
        source: std::io::Error,
    }

    #[derive(Debug, thiserror::Error)]
    #[error("start the agent")]
    struct Outer(#[source] Repeats);

    #[test]
    fn each_cause_is_printed_once() {
        let root = std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
        let error = Outer(Repeats {
            path: "/x",
            source: root,
        });
        assert_eq!(
            Chain(&error).to_string(),
            "start the agent: read config /x: no such file"
        );
    }

    #[test]
    fn causes_not_in_the_message_are_kept() {
        let error = anyhow::Error::new(std::io::Error::other("connection refused"))
            .context("build the client")
            .context("start");
        assert_eq!(
            Chain(error.as_ref()).to_string(),
            "start: build the client: connection refused"
        );
    }
}
