//! Logging and the metrics registry every program starts with.

use std::io::IsTerminal;

use prometheus_client::registry::Registry;
use tracing_subscriber::EnvFilter;

use crate::cli::{LogArgs, LogFormat};

#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error(
        "--log-level {level:?} is not a valid filter (e.g. `info` or `debug,kube=info`): {source}"
    )]
    Filter {
        level: String,
        #[source]
        source: tracing_subscriber::filter::ParseError,
    },
    #[error("a global logger is already installed")]
    AlreadyInstalled,
}

/// Installs the global logger in the requested format and level. Text is coloured only when
/// stdout is a terminal: container logs and files get plain text.
pub fn init_tracing(args: &LogArgs) -> Result<(), TelemetryError> {
    let filter = EnvFilter::try_new(&args.log_level).map_err(|source| TelemetryError::Filter {
        level: args.log_level.clone(),
        source,
    })?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stdout().is_terminal());
    let installed = match args.log_format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    installed.map_err(|_| TelemetryError::AlreadyInstalled)
}

/// A registry whose metrics are all named `nodegrace_<program>_…` (`-` becomes `_`).
pub fn program_registry(program: &str) -> Registry {
    Registry::with_prefix(format!("nodegrace_{}", program.replace('-', "_")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::encoding::text::encode;
    use prometheus_client::metrics::gauge::Gauge;

    #[test]
    fn registry_prefixes_the_program() {
        let mut registry = program_registry("out-of-service-gc");
        registry.register("pods", "help", Gauge::<i64>::default());
        let mut text = String::new();
        encode(&mut text, &registry).unwrap();
        assert!(
            text.contains("nodegrace_out_of_service_gc_pods 0"),
            "{text}"
        );
    }

    #[test]
    fn bad_level_is_reported_with_the_flag() {
        let args = LogArgs {
            log_format: LogFormat::Text,
            log_level: "info,=[".to_owned(),
        };
        let error = init_tracing(&args).unwrap_err().to_string();
        assert!(error.contains("--log-level"), "{error}");
    }
}
