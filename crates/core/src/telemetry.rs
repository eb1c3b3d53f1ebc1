//! Logging and the metrics registry every program starts with.

use std::io::IsTerminal;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::{Metric, Registry};
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

/// The label of a failure's kind (`api`, `provider`, …).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: &'static str,
}

/// Failed calls by kind: each controller's `errors_total{kind}`.
pub type ErrorsByKind = Family<KindLabel, Counter>;

/// The registry a program serves on `/metrics`, every metric named `nodegrace_<program>_…`
/// (`-` becomes `_`), with a catalogue of what was registered: a labelled family has no series
/// until its first label set, so the exposition alone does not list it, but the program's docs
/// and dashboard must.
#[derive(Debug)]
pub struct ProgramRegistry {
    prefix: String,
    registry: Registry,
    catalogue: Vec<RegisteredMetric>,
}

/// One metric family as registered.
#[derive(Debug, Clone)]
pub struct RegisteredMetric {
    /// With the program's prefix, before the type's suffix (`_total`, `_bucket`, …).
    pub name: String,
    pub help: String,
    pub kind: MetricType,
}

impl RegisteredMetric {
    /// The series names a query can select: a counter's `_total`, a histogram's three.
    pub fn series(&self) -> Vec<String> {
        let suffixes: &[&str] = match self.kind {
            MetricType::Counter => &["_total"],
            MetricType::Histogram => &["_bucket", "_sum", "_count"],
            MetricType::Info => &["_info"],
            _ => &[""],
        };
        suffixes
            .iter()
            .map(|suffix| format!("{}{suffix}", self.name))
            .collect()
    }

    /// The type as the exposition format's `# TYPE` line names it.
    pub fn kind_name(&self) -> &'static str {
        match self.kind {
            MetricType::Counter => "counter",
            MetricType::Gauge => "gauge",
            MetricType::Histogram => "histogram",
            MetricType::Info => "info",
            MetricType::Unknown => "unknown",
        }
    }
}

/// Registers fields of a program's metrics struct, one line each: `field: "help"`, named as the
/// field, or `field as "name": "help"` (a field's field: `field.part as "name": "help"`).
///
/// ```
/// # use prometheus_client::metrics::counter::Counter;
/// # let mut registry = nodegrace_core::telemetry::ProgramRegistry::new("p");
/// # #[derive(Default)] struct Metrics { pods: Counter, taints_added: Counter }
/// let metrics = Metrics::default();
/// nodegrace_core::register_metrics!(registry, metrics, {
///     pods: "Pods force-deleted",
///     taints_added as "taints": "Taints added",
/// });
/// ```
#[macro_export]
macro_rules! register_metrics {
    (
        $registry:expr, $metrics:expr,
        { $( $field:ident $(. $part:ident)* $(as $name:literal)? : $help:expr ),* $(,)? }
    ) => {
        $( $registry.register(
            $crate::register_metrics!(@name $field $($name)?),
            $help,
            $metrics.$field $(.$part)* .clone(),
        ); )*
    };
    (@name $field:ident $name:literal) => { $name };
    (@name $field:ident) => { stringify!($field) };
}

impl ProgramRegistry {
    pub fn new(program: &str) -> Self {
        let prefix = format!("nodegrace_{}", program.replace('-', "_"));
        Self {
            registry: Registry::with_prefix(prefix.clone()),
            prefix,
            catalogue: Vec::new(),
        }
    }

    pub fn register<M: Metric + TypedMetric>(&mut self, name: &str, help: &str, metric: M) {
        self.catalogue.push(RegisteredMetric {
            name: format!("{}_{name}", self.prefix),
            help: help.to_owned(),
            kind: M::TYPE,
        });
        self.registry.register(name, help, metric);
    }

    pub fn catalogue(&self) -> &[RegisteredMetric] {
        &self.catalogue
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    pub fn into_registry(self) -> Registry {
        self.registry
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::encoding::text::encode;
    use prometheus_client::metrics::gauge::Gauge;

    #[test]
    fn registry_prefixes_the_program() {
        let mut registry = ProgramRegistry::new("out-of-service-gc");
        registry.register("pods", "help", Gauge::<i64>::default());
        let mut text = String::new();
        encode(&mut text, registry.registry()).unwrap();
        assert!(
            text.contains("nodegrace_out_of_service_gc_pods 0"),
            "{text}"
        );
    }

    #[test]
    fn the_catalogue_lists_families_without_series_and_their_series_names() {
        use prometheus_client::metrics::counter::Counter;
        use prometheus_client::metrics::family::Family;
        let mut registry = ProgramRegistry::new("termination-controller");
        registry.register(
            "evictions",
            "Evictions",
            Family::<Vec<(String, String)>, Counter>::default(),
        );
        let mut text = String::new();
        encode(&mut text, registry.registry()).unwrap();
        assert!(!text.contains("evictions"), "no series yet: {text}");
        let [family] = registry.catalogue() else {
            panic!("one family registered")
        };
        assert_eq!(
            family.series(),
            ["nodegrace_termination_controller_evictions_total"]
        );
        assert_eq!(family.kind_name(), "counter");
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
