//! How a shutdown went, group by group, in words for the Events people read.

use std::fmt::Write;
use std::time::Duration;

/// How one priority group's turn ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupEnd {
    /// The group ran its course: every pod gone, or its own period over.
    Finished {
        stopped: usize,
        still_running: usize,
    },
    /// The shutdown budget ended during the group.
    CutShort {
        stopped: usize,
        still_running: usize,
    },
    /// The budget was gone before the group's turn came.
    NotStarted { pods: usize },
}

impl GroupEnd {
    /// How a group that ran ended: cut short only when the budget, not the group's own
    /// period, set its deadline (`cut`) and pods were left running.
    pub fn of(cut: bool, stopped: usize, still_running: usize) -> Self {
        if cut && still_running > 0 {
            Self::CutShort {
                stopped,
                still_running,
            }
        } else {
            Self::Finished {
                stopped,
                still_running,
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupResult {
    pub priority: i32,
    pub period: Duration,
    pub end: GroupEnd,
}

impl GroupResult {
    /// The note of the group's `ShutdownGroupFinished` Event.
    pub fn note(&self) -> String {
        let priority = self.priority;
        match self.end {
            GroupEnd::Finished {
                stopped,
                still_running: 0,
            } => format!("Priority group >= {priority}: all {stopped} pod(s) stopped"),
            GroupEnd::Finished {
                stopped,
                still_running,
            } => format!(
                "Priority group >= {priority}: {stopped} pod(s) stopped, {still_running} still running \
                 at the end of its {}s period",
                self.period.as_secs()
            ),
            GroupEnd::CutShort {
                stopped,
                still_running,
            } => format!(
                "Priority group >= {priority} cut short by the end of the shutdown budget: \
                 {stopped} pod(s) stopped, {still_running} still running"
            ),
            GroupEnd::NotStarted { pods } => format!(
                "Priority group >= {priority} not started: the shutdown budget ended first ({pods} pod(s))"
            ),
        }
    }
}

/// Every group that had pods, in shutdown order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ShutdownSummary {
    pub groups: Vec<GroupResult>,
}

impl ShutdownSummary {
    /// Whether the budget cut anything: a group short, or a group never started.
    pub fn budget_ran_out(&self) -> bool {
        self.groups
            .iter()
            .any(|group| !matches!(group.end, GroupEnd::Finished { .. }))
    }

    /// The note of the `NodeShutdownCompleted` Event: what was done, and what was cut.
    pub fn note(&self) -> String {
        let done = self
            .groups
            .iter()
            .filter(|group| matches!(group.end, GroupEnd::Finished { .. }))
            .count();
        let mut note = if self.budget_ran_out() {
            format!(
                "The shutdown budget ran out: {done} of {} priority group(s) done",
                self.groups.len()
            )
        } else {
            format!("All {} priority group(s) done", self.groups.len())
        };
        for group in &self.groups {
            match group.end {
                GroupEnd::Finished { .. } => {}
                GroupEnd::CutShort { still_running, .. } => {
                    let _ = write!(
                        note,
                        "; group >= {} cut short with {still_running} pod(s) still running",
                        group.priority
                    );
                }
                GroupEnd::NotStarted { pods } => {
                    let _ = write!(
                        note,
                        "; group >= {} not started ({pods} pod(s))",
                        group.priority
                    );
                }
            }
        }
        note.push_str("; the shutdown inhibitor was released");
        note
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_is_cut_short_only_by_the_budget_with_pods_left() {
        let cases = [
            (
                false,
                3,
                0,
                GroupEnd::Finished {
                    stopped: 3,
                    still_running: 0,
                },
            ),
            (
                false,
                1,
                2,
                GroupEnd::Finished {
                    stopped: 1,
                    still_running: 2,
                },
            ),
            (
                true,
                3,
                0,
                GroupEnd::Finished {
                    stopped: 3,
                    still_running: 0,
                },
            ),
            (
                true,
                1,
                2,
                GroupEnd::CutShort {
                    stopped: 1,
                    still_running: 2,
                },
            ),
        ];
        for (cut, stopped, still_running, end) in cases {
            assert_eq!(GroupEnd::of(cut, stopped, still_running), end);
        }
    }

    fn group(priority: i32, end: GroupEnd) -> GroupResult {
        GroupResult {
            priority,
            period: Duration::from_secs(5),
            end,
        }
    }

    #[test]
    fn notes_say_what_was_done_and_what_was_cut() {
        let complete = ShutdownSummary {
            groups: vec![group(
                0,
                GroupEnd::Finished {
                    stopped: 2,
                    still_running: 1,
                },
            )],
        };
        assert!(!complete.budget_ran_out());
        assert_eq!(
            complete.note(),
            "All 1 priority group(s) done; the shutdown inhibitor was released"
        );
        assert_eq!(
            complete.groups[0].note(),
            "Priority group >= 0: 2 pod(s) stopped, 1 still running at the end of its 5s period"
        );

        let cut = ShutdownSummary {
            groups: vec![
                group(
                    0,
                    GroupEnd::Finished {
                        stopped: 1,
                        still_running: 0,
                    },
                ),
                group(
                    1000,
                    GroupEnd::CutShort {
                        stopped: 1,
                        still_running: 2,
                    },
                ),
                group(100_000, GroupEnd::NotStarted { pods: 3 }),
            ],
        };
        assert!(cut.budget_ran_out());
        assert_eq!(
            cut.note(),
            "The shutdown budget ran out: 1 of 3 priority group(s) done; \
             group >= 1000 cut short with 2 pod(s) still running; \
             group >= 100000 not started (3 pod(s)); the shutdown inhibitor was released"
        );
        assert_eq!(
            cut.groups[0].note(),
            "Priority group >= 0: all 1 pod(s) stopped"
        );
        assert_eq!(
            cut.groups[2].note(),
            "Priority group >= 100000 not started: the shutdown budget ended first (3 pod(s))"
        );
    }
}
