//! A chart's Grafana dashboard against the program's metrics: every query must parse as PromQL
//! and select only series the program exports, and every metric must be on the dashboard.

use std::collections::BTreeSet;
use std::path::Path;

use anyhow::{Context, Result, bail};
use promql_parser::parser::{self, Expr};
use serde_json::Value;

use nodegrace_core::telemetry::{ProgramRegistry, RegisteredMetric};

/// Grafana replaces these before Prometheus sees the query; any duration parses the same.
const GRAFANA_INTERVALS: [&str; 3] = ["$__rate_interval", "$__interval", "$__range"];

/// Checks the dashboard a program's chart ships, `charts/<program>/dashboards/<program>.json`.
pub fn check_program_dashboard(program: &str, registry: &ProgramRegistry) -> Result<usize> {
    let dashboard = super::reference::workspace()
        .join("charts")
        .join(program)
        .join("dashboards")
        .join(format!("{program}.json"));
    check_dashboard(&dashboard, registry)
}

/// Returns how many queries the dashboard has.
pub fn check_dashboard(dashboard: &Path, registry: &ProgramRegistry) -> Result<usize> {
    let text = std::fs::read_to_string(dashboard)
        .with_context(|| format!("could not read {}", dashboard.display()))?;
    let json: Value = serde_json::from_str(&text)
        .with_context(|| format!("{} is not JSON", dashboard.display()))?;
    let mut queries = Vec::new();
    collect_queries(&json, &mut queries);
    if queries.is_empty() {
        bail!("{} has no queries", dashboard.display());
    }
    let families = registry.catalogue();
    let exported: BTreeSet<String> = families.iter().flat_map(RegisteredMetric::series).collect();
    let mut shown = BTreeSet::new();
    for query in &queries {
        let promql = GRAFANA_INTERVALS
            .iter()
            .fold(query.clone(), |promql, variable| {
                promql.replace(variable, "5m")
            });
        let expr = parser::parse(&promql).map_err(|error| {
            anyhow::anyhow!("{}: `{query}` is not PromQL: {error}", dashboard.display())
        })?;
        let mut selected = Vec::new();
        selected_metrics(&expr, &mut selected);
        if selected.is_empty() {
            bail!("{}: `{query}` selects no metric", dashboard.display());
        }
        for name in selected {
            if !exported.contains(&name) {
                bail!(
                    "{}: `{query}` selects `{name}`, which the program does not export (it exports {})",
                    dashboard.display(),
                    exported.iter().cloned().collect::<Vec<_>>().join(", ")
                );
            }
            shown.insert(name);
        }
    }
    let missing: Vec<&str> = families
        .iter()
        .filter(|family| !family.series().iter().any(|series| shown.contains(series)))
        .map(|family| family.name.as_str())
        .collect();
    if !missing.is_empty() {
        bail!(
            "{}: no panel shows {}; add a panel for each metric",
            dashboard.display(),
            missing.join(", ")
        );
    }
    Ok(queries.len())
}

/// Every `expr` of every target, wherever panels nest them (rows hold panels too).
fn collect_queries(value: &Value, queries: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, value) in map {
                match (key.as_str(), value) {
                    ("expr", Value::String(expr)) => queries.push(expr.clone()),
                    _ => collect_queries(value, queries),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|item| collect_queries(item, queries)),
        _ => {}
    }
}

pub(super) fn selected_metrics(expr: &Expr, names: &mut Vec<String>) {
    match expr {
        Expr::VectorSelector(selector) => names.extend(selector.name.clone()),
        Expr::MatrixSelector(matrix) => names.extend(matrix.vs.name.clone()),
        Expr::Aggregate(aggregate) => {
            selected_metrics(&aggregate.expr, names);
            if let Some(param) = &aggregate.param {
                selected_metrics(param, names);
            }
        }
        Expr::Unary(unary) => selected_metrics(&unary.expr, names),
        Expr::Binary(binary) => {
            selected_metrics(&binary.lhs, names);
            selected_metrics(&binary.rhs, names);
        }
        Expr::Paren(paren) => selected_metrics(&paren.expr, names),
        Expr::Subquery(subquery) => selected_metrics(&subquery.expr, names),
        Expr::Call(call) => call
            .args
            .args
            .iter()
            .for_each(|arg| selected_metrics(arg, names)),
        Expr::NumberLiteral(_) | Expr::StringLiteral(_) | Expr::Extension(_) => {}
    }
}

#[cfg(test)]
mod tests {
    use prometheus_client::metrics::counter::Counter;
    use prometheus_client::metrics::gauge::Gauge;
    use serde_json::json;

    use super::*;

    fn registry() -> ProgramRegistry {
        let mut registry = ProgramRegistry::new("x");
        registry.register("evictions", "Evictions", Counter::<u64>::default());
        registry.register("held", "Held", Gauge::<i64>::default());
        registry
    }

    fn dashboard(exprs: &[&str]) -> tempfile::NamedTempFile {
        let targets: Vec<Value> = exprs.iter().map(|expr| json!({"expr": expr})).collect();
        let file = tempfile::NamedTempFile::new().unwrap();
        let panels = json!({"panels": [{"type": "row", "panels": [{"targets": targets}]}]});
        std::fs::write(file.path(), panels.to_string()).unwrap();
        file
    }

    #[test]
    fn queries_through_grafana_intervals_and_nested_rows_are_checked() {
        let file = dashboard(&[
            "sum(increase(nodegrace_x_evictions_total[$__rate_interval]))",
            "sum by (instance) (nodegrace_x_held) > 0",
        ]);
        assert_eq!(check_dashboard(file.path(), &registry()).unwrap(), 2);
    }

    #[test]
    fn a_query_of_a_metric_nobody_exports_is_named() {
        // Without the _total suffix the counter's series does not exist.
        let file = dashboard(&["rate(nodegrace_x_evictions[5m])", "nodegrace_x_held"]);
        let error = check_dashboard(file.path(), &registry()).unwrap_err();
        assert!(
            error
                .to_string()
                .contains("selects `nodegrace_x_evictions`"),
            "{error}"
        );
    }

    #[test]
    fn a_metric_without_a_panel_is_named() {
        let file = dashboard(&["nodegrace_x_held"]);
        let error = check_dashboard(file.path(), &registry()).unwrap_err();
        assert!(
            error
                .to_string()
                .contains("no panel shows nodegrace_x_evictions"),
            "{error}"
        );
    }

    #[test]
    fn a_query_that_is_not_promql_is_named() {
        let file = dashboard(&["sum(nodegrace_x_held", "nodegrace_x_evictions_total"]);
        let error = check_dashboard(file.path(), &registry()).unwrap_err();
        assert!(error.to_string().contains("is not PromQL"), "{error}");
    }
}
