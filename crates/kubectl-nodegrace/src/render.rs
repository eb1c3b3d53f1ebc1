//! People's tables and scripts' documents. Colour only on a terminal, and never with NO_COLOR
//! set (no-color.org).

use std::fmt::Write as _;

use jiff::Timestamp;
use serde::Serialize;

use crate::cli::Output;
use crate::diagnose::age;
use crate::explain_node::NodeStory;
use crate::explain_pod::PodStory;
use crate::lifecycle::{NodeLifecycle, State, Status};
use crate::timeline::Moment;

/// How text is dressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Style {
    pub colour: bool,
}

impl Style {
    /// Colour when stdout is a terminal and NO_COLOR is unset or empty.
    pub fn for_stdout() -> Self {
        use std::io::IsTerminal as _;
        let no_colour = std::env::var_os("NO_COLOR").is_some_and(|value| !value.is_empty());
        Self {
            colour: std::io::stdout().is_terminal() && !no_colour,
        }
    }

    fn paint(self, code: &str, text: &str) -> String {
        if self.colour {
            format!("\x1b[{code}m{text}\x1b[0m")
        } else {
            text.to_owned()
        }
    }

    fn state(self, state: State, width: usize) -> String {
        let text = format!("{:width$}", state.word());
        let code = match state {
            State::Healthy => "32",
            State::RecoveryFailed | State::ShutdownBlocked => "31",
            _ => "33",
        };
        self.paint(code, &text)
    }

    fn bold(self, text: &str) -> String {
        self.paint("1", text)
    }
}

/// A document for `-o json|yaml`.
pub fn document<T: Serialize>(value: &T, output: Output) -> anyhow::Result<String> {
    Ok(match output {
        Output::Json => serde_json::to_string_pretty(value)? + "\n",
        Output::Yaml => serde_yaml_ng::to_string(value)?,
        Output::Table => unreachable!("tables are drawn by their own functions"),
    })
}

fn since(row: &NodeLifecycle, now: Timestamp) -> String {
    row.since.map_or_else(|| "-".to_owned(), |at| age(now, at))
}

fn next(row: &NodeLifecycle) -> String {
    row.next.as_ref().map_or_else(String::new, |next| {
        next.command.clone().unwrap_or_else(|| next.text.clone())
    })
}

const HEADER: [&str; 6] = ["NODE", "PROGRAM", "STATE", "SINCE", "BLOCKED BY", "NEXT"];

/// The rows as a table, with or without its header (a watch prints it once).
pub fn rows_table(rows: &[NodeLifecycle], now: Timestamp, header: bool, style: Style) -> String {
    let cells: Vec<[String; 6]> = rows
        .iter()
        .map(|row| {
            let state = match &row.step {
                Some(step) => format!("{} ({step})", row.state.word()),
                None => row.state.word().to_owned(),
            };
            [
                row.node.clone(),
                row.program.map_or("-", |program| program.name()).to_owned(),
                state,
                since(row, now),
                row.blocked_by
                    .as_ref()
                    .map_or_else(|| "-".to_owned(), |blocker| blocker.text.clone()),
                next(row),
            ]
        })
        .collect();
    let mut widths = HEADER.map(str::len);
    for row in &cells {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut text = String::new();
    let line = |text: &mut String, cells: [&str; 6], state: Option<State>| {
        for (column, cell) in cells.iter().enumerate() {
            let width = widths[column];
            match (column, state) {
                (5, _) => text.push_str(cell),
                (2, Some(state)) => {
                    // The state's colour covers its word; the step follows plain.
                    let word = state.word();
                    let rest = &cell[word.len()..];
                    text.push_str(&style.state(state, word.len()));
                    let _ = write!(text, "{rest:pad$}   ", pad = width - word.len());
                }
                _ => {
                    let _ = write!(text, "{cell:width$}   ");
                }
            }
        }
        text.truncate(text.trim_end().len());
        text.push('\n');
    };
    if header {
        line(&mut text, HEADER, None);
    }
    for (row, cells) in rows.iter().zip(&cells) {
        line(
            &mut text,
            cells.each_ref().map(String::as_str),
            Some(row.state),
        );
    }
    text
}

fn footer(text: &mut String, unread: &[String]) {
    for line in unread {
        let _ = writeln!(text, "! {line}");
    }
}

pub fn status(status: &Status, style: Style) -> String {
    let mut text = if status.nodes.is_empty() {
        "No node is in a lifecycle state: none shutting down, out of service or deleting.\n"
            .to_owned()
    } else {
        rows_table(&status.nodes, status.observed_at, true, style)
    };
    let missing: Vec<&str> = status
        .programs
        .iter()
        .filter(|presence| presence.installed == Some(false))
        .map(|presence| presence.program.name())
        .collect();
    if !missing.is_empty() {
        let _ = writeln!(
            text,
            "Not installed (no Deployment or DaemonSet labelled app.kubernetes.io/name=<program>): \
             {}; nodes show their states only where these programs wrote them.",
            missing.join(", ")
        );
    }
    footer(&mut text, &status.unread);
    text
}

/// The moments a table shows: the latest; `-o json` has them all.
const TIMELINE_LINES: usize = 15;
/// A message's part a table shows.
const MESSAGE_CHARS: usize = 140;

/// The message's first sentence, at most [`MESSAGE_CHARS`] characters.
fn short(message: &str) -> String {
    let line = message.lines().next().unwrap_or_default();
    let sentence = line.split_once(". ").map_or(line, |(first, _)| first);
    if sentence.chars().count() > MESSAGE_CHARS {
        let cut: String = sentence.chars().take(MESSAGE_CHARS - 1).collect();
        format!("{cut}…")
    } else {
        sentence.to_owned()
    }
}

fn timeline(text: &mut String, moments: &[Moment], now: Timestamp) {
    if moments.is_empty() {
        text.push_str("Timeline: nothing recorded (Events expire after an hour).\n");
        return;
    }
    let earlier = moments.len().saturating_sub(TIMELINE_LINES);
    if earlier > 0 {
        let _ = writeln!(
            text,
            "Timeline (the last {TIMELINE_LINES}; {earlier} earlier with -o json):"
        );
    } else {
        text.push_str("Timeline:\n");
    }
    for moment in &moments[earlier..] {
        let at = moment
            .at
            .map_or_else(|| "?".to_owned(), |at| format!("{} ago", age(now, at)));
        let count = if moment.count > 1 {
            format!(" (x{})", moment.count)
        } else {
            String::new()
        };
        let by = if moment.by.is_empty() {
            "-"
        } else {
            &moment.by
        };
        let _ = writeln!(
            text,
            "  {at:>9}  {by:<24} {:<9} {}{count}: {}",
            moment.kind,
            if moment.kind == "Condition" {
                format!("{} {}", moment.type_, moment.reason)
            } else {
                moment.reason.clone()
            },
            short(&moment.message)
        );
    }
}

pub fn node_story(story: &NodeStory, style: Style) -> String {
    let now = story.observed_at;
    let mut text = String::new();
    let _ = writeln!(
        text,
        "{} {}  uid {}  {}",
        style.bold("Node"),
        story.node,
        story.uid.as_deref().unwrap_or("-"),
        story.ready
    );
    for row in &story.now {
        let program = row.program.map_or("-", |program| program.name());
        let step = row
            .step
            .as_deref()
            .map(|step| format!(" ({step})"))
            .unwrap_or_default();
        let since = row
            .since
            .map(|at| format!(", since {} ago", age(now, at)))
            .unwrap_or_default();
        let _ = writeln!(
            text,
            "{program}: {}{step}{since}",
            style.state(row.state, row.state.word().len())
        );
        if let Some(blocker) = &row.blocked_by {
            let object = blocker
                .object
                .as_ref()
                .map(|object| match &object.key {
                    Some(key) => format!("  [{object}, {key}]"),
                    None => format!("  [{object}]"),
                })
                .unwrap_or_default();
            let _ = writeln!(text, "  blocked by: {}{object}", blocker.text);
        }
        if let Some(next) = &row.next {
            let _ = writeln!(text, "  next: {}", next.text);
        }
    }
    timeline(&mut text, &story.timeline, now);
    if let Some(command) = &story.unblock {
        let _ = writeln!(text, "{}\n  {command}", style.bold("To unblock it:"));
    }
    footer(&mut text, &story.unread);
    text
}

pub fn pod_story(story: &PodStory, style: Style) -> String {
    let now = story.observed_at;
    let mut text = String::new();
    let place = match (&story.node, story.exists) {
        (Some(node), true) => format!("on node {node}"),
        (None, true) => "not scheduled".to_owned(),
        (_, false) => "gone".to_owned(),
    };
    let _ = writeln!(text, "{} {}  {place}", style.bold("Pod"), story.pod);
    match &story.verdict {
        Some(verdict) => {
            let by = verdict
                .program
                .map_or("not a nodegrace program", |program| program.name());
            let at = verdict
                .at
                .map(|at| format!(" {} ago", age(now, at)))
                .unwrap_or_default();
            if let Some(uid) = &verdict.earlier_uid {
                let _ = write!(text, "The pod of this name before it (uid {uid}) was ");
            }
            let _ = writeln!(
                text,
                "{} by {by}{at} ({} {}): {}",
                verdict.how, verdict.from, verdict.reason, verdict.message
            );
        }
        None => text.push_str(
            "No nodegrace program evicted, force-deleted or terminated it, as far as its \
             DisruptionTarget condition and Events tell.\n",
        ),
    }
    timeline(&mut text, &story.timeline, now);
    footer(&mut text, &story.unread);
    text
}
