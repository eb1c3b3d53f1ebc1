//! The budgets' verdict for a node, and why each node waiting for its budgets waits, as the
//! leader's last granting pass judged it. The pass records its verdicts here and learns which
//! waits changed; a node's task reads its own verdict here. Nothing else writes them.

use std::collections::HashMap;
use std::sync::{Arc, PoisonError, RwLock};

use crate::budget::{Numbers, SpecError};

/// The answer for a node: granted by every budget covering it, or waiting on `budget`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Granted { budgets: Vec<String> },
    Waiting { budget: String, refusal: Refusal },
}

/// How a refusal for an invalid budget begins, wherever it is said.
pub const INVALID: &str = "the budget is invalid";

/// Why a node is not granted by one budget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    Exhausted(Numbers),
    Invalid(SpecError),
    /// Outside every maintenance window; `next` is when the next opens (in its time zone).
    OutsideWindows {
        next: Option<String>,
    },
    /// The window open now has started the `max` disruptions it allows.
    WindowSpent {
        max: i32,
        next: Option<String>,
    },
}

impl Refusal {
    /// Whether the node waits for a maintenance window (rather than for nodes to recover).
    pub fn is_window(&self) -> bool {
        matches!(self, Self::OutsideWindows { .. } | Self::WindowSpent { .. })
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let next = |next: &Option<String>| {
            next.as_ref().map_or_else(
                || "no window opens again".to_owned(),
                |next| format!("the next opens at {next}"),
            )
        };
        match self {
            Self::Exhausted(numbers) => write!(f, "{numbers}"),
            Self::Invalid(error) => write!(f, "{INVALID} and holds its nodes: {error}"),
            Self::OutsideWindows { next: at } => {
                write!(f, "outside its maintenance windows; {}", next(at))
            }
            Self::WindowSpent { max, next: at } => write!(
                f,
                "the {max} disruption(s) its maintenance window allows have started; {}",
                next(at)
            ),
        }
    }
}

impl Verdict {
    /// Whether a node waiting with `self` sees nothing new in `other`: the same budget and the
    /// same refusal, a window's times included, but not the numbers, which move with every
    /// node of the budget and are in its status.
    pub fn same_wait(&self, other: &Self) -> bool {
        match (self, other) {
            (
                Self::Waiting {
                    budget: a,
                    refusal: Refusal::Exhausted(_),
                },
                Self::Waiting {
                    budget: b,
                    refusal: Refusal::Exhausted(_),
                },
            ) => a == b,
            _ => self == other,
        }
    }
}

/// The verdicts by Node UID; clones share them.
#[derive(Debug, Clone, Default)]
pub struct Waits {
    by_uid: Arc<RwLock<Arc<HashMap<String, Verdict>>>>,
}

impl Waits {
    /// Keeps a pass's verdicts. Returns the nodes (by UID) whose wait they changed: granted,
    /// gone from the pass, or waiting on something new — not a budget's numbers moving.
    pub fn record(&self, verdicts: HashMap<String, Verdict>) -> Vec<String> {
        let new = Arc::new(verdicts);
        let old = std::mem::replace(
            &mut *self.by_uid.write().unwrap_or_else(PoisonError::into_inner),
            Arc::clone(&new),
        );
        let changed = new
            .iter()
            .filter(|(uid, verdict)| {
                old.get(*uid)
                    .is_none_or(|before| !before.same_wait(verdict))
            })
            .map(|(uid, _)| uid);
        let left = old.keys().filter(|uid| !new.contains_key(*uid));
        changed.chain(left).cloned().collect()
    }

    /// Why the node with `uid` waits, if the last pass saw it waiting.
    pub fn of(&self, uid: &str) -> Option<Verdict> {
        self.by_uid
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(uid)
            .cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiting(budget: &str, refusal: Refusal) -> Verdict {
        Verdict::Waiting {
            budget: budget.to_owned(),
            refusal,
        }
    }

    #[test]
    fn only_waits_that_changed_are_reported() {
        let waits = Waits::default();
        let exhausted = || Refusal::Exhausted(Numbers::default());
        let first = waits.record(HashMap::from([
            ("a".to_owned(), waiting("workers", exhausted())),
            ("b".to_owned(), waiting("workers", exhausted())),
        ]));
        assert_eq!(first.len(), 2, "both are new");
        let mut second = waits.record(HashMap::from([
            ("a".to_owned(), waiting("workers", exhausted())),
            ("c".to_owned(), waiting("gpu", exhausted())),
        ]));
        second.sort();
        assert_eq!(second, ["b", "c"], "a waits as before; b left; c is new");
        assert!(waits.of("a").is_some() && waits.of("b").is_none());
    }
}
