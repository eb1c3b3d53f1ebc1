//! The demo's printed story: times relative to the start, what happened, and the command an
//! operator would type to see it. Colour only when stdout is a terminal.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

#[derive(Debug)]
pub struct Timeline {
    start: Instant,
    colour: bool,
}

const BOLD: &str = "\x1b[1m";
const DIM: &str = "\x1b[2m";
const GREEN: &str = "\x1b[32m";
const RED: &str = "\x1b[31m";
const RESET: &str = "\x1b[0m";

impl Timeline {
    pub fn new() -> Self {
        Self {
            start: Instant::now(),
            colour: std::io::stdout().is_terminal(),
        }
    }

    pub fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    fn paint(&self, style: &str, text: &str) -> String {
        if self.colour {
            format!("{style}{text}{RESET}")
        } else {
            text.to_owned()
        }
    }

    fn stamp(&self) -> String {
        format!("{:>6.1}s", self.start.elapsed().as_secs_f64())
    }

    pub fn heading(&self, text: &str) {
        println!("\n{}", self.paint(BOLD, &format!("== {text}")));
    }

    /// Something that happened (or was done) now.
    pub fn event(&self, text: &str) {
        println!("{}  {text}", self.paint(DIM, &self.stamp()));
    }

    /// The command that shows the state just described.
    pub fn show(&self, command: &str) {
        println!("{:9}{}", "", self.paint(DIM, &format!("$ {command}")));
    }

    /// A command run now and what it printed, indented under it: what an operator reads.
    /// `again`: it answers the same way on the cluster the demo leaves (`--keep`), and is
    /// offered as a `$` command; else it is told as run at that moment.
    pub fn ran(&self, command: &str, output: &str, again: bool) {
        let prompt = if again { "$" } else { "ran:" };
        println!(
            "{:9}{}",
            "",
            self.paint(BOLD, &format!("{prompt} {command}"))
        );
        for line in output.lines() {
            println!("{:11}{line}", "");
        }
    }

    pub fn pass(&self, text: &str) {
        println!(
            "{}  {} {text}",
            self.paint(DIM, &self.stamp()),
            self.paint(GREEN, "ok")
        );
    }

    pub fn fail(&self, text: &str) {
        println!(
            "{}  {} {text}",
            self.paint(DIM, &self.stamp()),
            self.paint(RED, "FAILED")
        );
    }
}

impl Default for Timeline {
    fn default() -> Self {
        Self::new()
    }
}

/// Seconds with one decimal below a minute, as the timeline prints durations.
pub fn seconds(duration: Duration) -> String {
    format!("{:.1} s", duration.as_secs_f64())
}

/// Milliseconds for the short latencies the acts report.
pub fn millis(duration: Duration) -> String {
    format!("{:.1} ms", duration.as_secs_f64() * 1000.0)
}
