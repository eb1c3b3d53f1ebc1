//! The operator's reference in `docs/<program>.md`, generated from what the program really is:
//! its clap definition, its chart's values.schema.json and values.yaml, its metrics registry.
//! Each program's tests compare the generated text with the page, so a page cannot go stale;
//! `cargo xtask docs` (which sets `NODEGRACE_UPDATE_DOCS=1`) rewrites it.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result, bail};
use serde_json::Value;

use nodegrace_core::telemetry::ProgramRegistry;

/// Set by `cargo xtask docs`: rewrite the generated sections instead of failing on a difference.
pub const UPDATE_DOCS_VAR: &str = "NODEGRACE_UPDATE_DOCS";

/// Every flag of the program (and of its subcommands), with its variable and default.
pub fn options_reference(command: &clap::Command) -> String {
    let mut out = String::new();
    options_table(command, &mut out);
    for sub in command
        .get_subcommands()
        .filter(|sub| sub.get_name() != "help")
    {
        let _ = writeln!(
            out,
            "\n`{} {}`: {}\n",
            command.get_name(),
            sub.get_name(),
            one_line(&sub.get_about().map(ToString::to_string).unwrap_or_default())
        );
        options_table(sub, &mut out);
    }
    out
}

fn options_table(command: &clap::Command, out: &mut String) {
    out.push_str("| flag | environment | default | meaning |\n|---|---|---|---|\n");
    for arg in command.get_arguments() {
        let id = arg.get_id().as_str();
        if id == "help" || id == "version" {
            continue;
        }
        let flag = match (arg.get_long(), arg.get_value_names()) {
            (Some(long), Some(names)) if arg.get_action().takes_values() => {
                format!("`--{long} <{}>`", names.join(" "))
            }
            (Some(long), _) if arg.get_action().takes_values() => format!("`--{long} <VALUE>`"),
            (Some(long), _) => format!("`--{long}`"),
            (None, _) => format!("`<{}>`", id.to_uppercase()),
        };
        let env = arg
            .get_env()
            .map(|env| format!("`{}`", env.to_string_lossy()))
            .unwrap_or_default();
        let defaults: Vec<String> = arg
            .get_default_values()
            .iter()
            .map(|value| value.to_string_lossy().into_owned())
            .collect();
        let default = match defaults.join(",") {
            joined if defaults.is_empty() => joined,
            joined if joined.is_empty() => "`\"\"`".to_owned(),
            joined => format!("`{joined}`"),
        };
        let mut meaning = one_line(
            &arg.get_long_help()
                .or_else(|| arg.get_help())
                .map(ToString::to_string)
                .unwrap_or_default(),
        );
        let choices: Vec<String> = arg
            .get_possible_values()
            .iter()
            .filter(|value| !value.is_hide_set())
            .map(|value| format!("`{}`", value.get_name()))
            .collect();
        // A bool flag's true/false is obvious; a real choice is worth listing.
        if !choices.is_empty() && choices != ["`true`", "`false`"] {
            end_sentence(&mut meaning);
            let _ = write!(meaning, " One of {}.", choices.join(", "));
        }
        let _ = writeln!(out, "| {flag} | {env} | {default} | {} |", cell(&meaning));
    }
}

/// Every value of the chart: from the schema, its type, constraints and description; from
/// values.yaml, its default. Fails when a value has no description.
pub fn values_reference(schema: &Value, values: &Value) -> Result<String> {
    let mut rows = Vec::new();
    value_rows(schema, schema, values, "", &mut rows)?;
    let mut out = String::from("| value | type | default | meaning |\n|---|---|---|---|\n");
    for row in rows {
        out.push_str(&row);
    }
    Ok(out)
}

fn value_rows(
    root: &Value,
    schema: &Value,
    values: &Value,
    prefix: &str,
    rows: &mut Vec<String>,
) -> Result<()> {
    let Some(properties) = schema.get("properties").and_then(Value::as_object) else {
        return Ok(());
    };
    for (key, property) in properties {
        let path = if prefix.is_empty() {
            key.clone()
        } else {
            format!("{prefix}.{key}")
        };
        let default = values.get(key).unwrap_or(&Value::Null);
        let nested = property
            .get("properties")
            .and_then(Value::as_object)
            .is_some_and(|nested| !nested.is_empty());
        if nested {
            value_rows(root, property, default, &path, rows)?;
            continue;
        }
        // A shared definition (`"$ref": "#/definitions/duration"`) says the type.
        let shared = property
            .get("$ref")
            .and_then(Value::as_str)
            .and_then(|reference| reference.strip_prefix("#/"))
            .and_then(|pointer| root.pointer(&format!("/{pointer}")));
        let description = property
            .get("description")
            .and_then(Value::as_str)
            .with_context(|| {
                format!("values.schema.json: `{path}` has no description; add one for the docs")
            })?;
        let kind = property
            .get("type")
            .or_else(|| shared.and_then(|shared| shared.get("type")))
            .map(|kind| match kind {
                Value::Array(kinds) => kinds
                    .iter()
                    .filter_map(Value::as_str)
                    .collect::<Vec<_>>()
                    .join(" or "),
                other => other.as_str().unwrap_or_default().to_owned(),
            })
            .unwrap_or_default();
        let mut meaning = one_line(description);
        if let Some(choices) = property.get("enum").and_then(Value::as_array) {
            end_sentence(&mut meaning);
            let choices: Vec<String> = choices.iter().map(|c| format!("`{c}`")).collect();
            let _ = write!(meaning, " One of {}.", choices.join(", "));
        }
        let default = match default {
            Value::Null => String::new(),
            Value::String(text) if text.is_empty() => "`\"\"`".to_owned(),
            other => format!("`{other}`"),
        };
        rows.push(format!(
            "| `{path}` | {kind} | {} | {} |\n",
            cell(&default),
            cell(&meaning)
        ));
    }
    Ok(())
}

/// Every metric the program exports, as it reads on `/metrics`.
pub fn metrics_reference(registry: &ProgramRegistry) -> String {
    let mut out = String::from("| metric | type | meaning |\n|---|---|---|\n");
    for family in registry.catalogue() {
        let _ = writeln!(
            out,
            "| `{}` | {} | {} |",
            family.series().join("`, `"),
            family.kind_name(),
            cell(&family.help)
        );
    }
    out
}

/// Compares a generated section of a page with what it should say, or rewrites it when
/// `NODEGRACE_UPDATE_DOCS` is set. Sections sit between `<!-- generated:NAME -->` and
/// `<!-- /generated:NAME -->`.
pub fn check_generated_section(page: &Path, name: &str, generated: &str) -> Result<()> {
    let text = std::fs::read_to_string(page)
        .with_context(|| format!("could not read {}", page.display()))?;
    let open = format!("<!-- generated:{name} -->\n");
    let close = format!("<!-- /generated:{name} -->");
    let start = text
        .find(&open)
        .map(|at| at + open.len())
        .with_context(|| {
            format!(
                "{} has no `{}` marker for its generated {name} reference",
                page.display(),
                open.trim_end()
            )
        })?;
    let end = start
        + text[start..]
            .find(&close)
            .with_context(|| format!("{}: `{close}` is missing", page.display()))?;
    if &text[start..end] == generated {
        return Ok(());
    }
    if std::env::var_os(UPDATE_DOCS_VAR).is_some() {
        let updated = format!("{}{generated}{}", &text[..start], &text[end..]);
        std::fs::write(page, updated)?;
        return Ok(());
    }
    bail!(
        "{}: the generated {name} reference is stale (the code or the chart changed); run `cargo xtask docs`",
        page.display()
    )
}

/// Reads a chart file as JSON (values.yaml through YAML).
pub fn read_chart_file(chart: &Path, file: &str) -> Result<Value> {
    let path = chart.join(file);
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("could not read {}", path.display()))?;
    if path.extension().is_some_and(|ext| ext == "json") {
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))
    } else {
        serde_yaml_ng::from_str(&text).with_context(|| format!("{} is not YAML", path.display()))
    }
}

/// The workspace this crate was built in: its docs and charts are what the checks read.
pub(super) fn workspace() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

/// Checks the three generated sections of `docs/<program>.md`: options, values and metrics.
pub fn check_program_reference(
    program: &str,
    command: &clap::Command,
    registry: &ProgramRegistry,
) -> Result<()> {
    let page = workspace().join("docs").join(format!("{program}.md"));
    let chart = workspace().join("charts").join(program);
    let schema = read_chart_file(&chart, "values.schema.json")?;
    let values = read_chart_file(&chart, "values.yaml")?;
    check_generated_section(&page, "options", &options_reference(command))?;
    check_generated_section(&page, "values", &values_reference(&schema, &values)?)?;
    check_generated_section(&page, "metrics", &metrics_reference(registry))
}

/// Appending a sentence to a help text that does not end one.
fn end_sentence(text: &mut String) {
    if !text.is_empty() && !text.ends_with('.') {
        text.push('.');
    }
}

/// Markdown table cells cannot hold a `|` or a line break.
fn cell(text: &str) -> String {
    text.replace('|', "\\|")
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn values_without_a_description_are_refused_by_path() {
        let schema = json!({"properties": {"image": {"properties": {"tag": {"type": "string"}}}}});
        let error = values_reference(&schema, &json!({})).unwrap_err();
        assert!(
            error.to_string().contains("`image.tag` has no description"),
            "{error}"
        );
    }

    #[test]
    fn values_rows_carry_type_default_and_choices() {
        let schema = json!({"properties": {"logFormat": {
            "type": "string", "enum": ["text", "json"], "description": "How logs look."
        }}});
        let table = values_reference(&schema, &json!({"logFormat": "json"})).unwrap();
        assert!(
            table.contains("| `logFormat` | string | `\"json\"` | How logs look. One of `\"text\"`, `\"json\"`. |"),
            "{table}"
        );
    }

    #[test]
    fn a_stale_section_names_the_fix_and_an_update_rewrites_it() {
        let dir = tempfile::tempdir().unwrap();
        let page = dir.path().join("page.md");
        std::fs::write(
            &page,
            "# p\n<!-- generated:options -->\nold\n<!-- /generated:options -->\n",
        )
        .unwrap();
        let error = check_generated_section(&page, "options", "new\n").unwrap_err();
        assert!(error.to_string().contains("cargo xtask docs"), "{error}");
        check_generated_section(&page, "options", "old\n").unwrap();
    }
}
