//! Where a fence stands, written on the Node itself so that a restart, a new leader or an
//! operator reads the same story: the label `nodegrace.io/fence=<step>` (a label, so that
//! `--max-fenced` counts them with one fresh list by selector) and the annotation
//! `nodegrace.io/fence-since=<RFC 3339>` (when that step began). The confirmed fence itself is
//! the shared contract `nodegrace.io/fenced=<time>` that external fencing agents write too.

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;

use crate::api::{DO_NOT_FENCE_ANNOTATION, FENCE_LABEL, FENCE_SINCE_ANNOTATION, FENCED_ANNOTATION};

/// The steps of a fence that hold a machine out of service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The power-off is about to be asked for, or was: not yet confirmed.
    Fencing,
    /// Confirmed off; the node is tainted.
    Fenced,
    /// Powered on again after the cleanup; the node is not Ready yet.
    Recovering,
    /// Not Ready within `--recover-timeout` of the power-on: powered off again and left off
    /// until an operator removes the label.
    RecoveryFailed,
}

impl Step {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Fencing => "fencing",
            Self::Fenced => "fenced",
            Self::Recovering => "recovering",
            Self::RecoveryFailed => "recovery-failed",
        }
    }

    fn parse(word: &str) -> Option<Self> {
        [
            Self::Fencing,
            Self::Fenced,
            Self::Recovering,
            Self::RecoveryFailed,
        ]
        .into_iter()
        .find(|step| step.as_str() == word)
    }
}

/// A fence's step on a node and since when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mark {
    pub step: Step,
    /// `None` when the annotation is missing or unreadable (an operator's edit): the step's
    /// timers then count from when this controller read it.
    pub since: Option<Timestamp>,
}

/// The fence step `node` carries, if any. An unknown label value reads as `Fencing`: something
/// is under way, and nothing is powered off or on again on a guess.
pub fn mark(node: &impl ResourceExt) -> Option<Mark> {
    let word = node.labels().get(FENCE_LABEL)?;
    let since = node
        .annotations()
        .get(FENCE_SINCE_ANNOTATION)
        .and_then(|text| text.parse().ok());
    Some(Mark {
        step: Step::parse(word).unwrap_or(Step::Fencing),
        since,
    })
}

/// Writes `step` as beginning `at`.
pub fn set_mark(node: &mut Node, step: Step, at: Timestamp) {
    node.metadata
        .labels
        .get_or_insert_with(BTreeMap::new)
        .insert(FENCE_LABEL.to_owned(), step.as_str().to_owned());
    node.metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(FENCE_SINCE_ANNOTATION.to_owned(), at.to_string());
}

/// Removes the fence's step and the fence annotation; whether there was anything to remove.
pub fn clear_mark(node: &mut Node) -> bool {
    let label = node
        .metadata
        .labels
        .as_mut()
        .and_then(|labels| labels.remove(FENCE_LABEL))
        .is_some();
    let annotations = node.metadata.annotations.as_mut().map_or(0, |annotations| {
        [FENCE_SINCE_ANNOTATION, FENCED_ANNOTATION]
            .into_iter()
            .filter(|key| annotations.remove(*key).is_some())
            .count()
    });
    label || annotations > 0
}

pub fn do_not_fence(node: &Node) -> Option<&str> {
    node.metadata
        .annotations
        .as_ref()?
        .get(DO_NOT_FENCE_ANNOTATION)
        .map(String::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mark_reads_back_as_written_and_clears_with_the_fence() {
        let mut node = Node::default();
        assert_eq!(mark(&node), None);
        let at: Timestamp = "2026-01-01T00:00:05Z".parse().unwrap();
        set_mark(&mut node, Step::Recovering, at);
        node.metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(FENCED_ANNOTATION.to_owned(), at.to_string());
        assert_eq!(
            mark(&node),
            Some(Mark {
                step: Step::Recovering,
                since: Some(at)
            })
        );
        assert!(clear_mark(&mut node));
        assert_eq!(mark(&node), None);
        assert!(node.metadata.annotations.as_ref().unwrap().is_empty());
        assert!(!clear_mark(&mut node));
        node.metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(FENCE_LABEL.to_owned(), "something-else".to_owned());
        assert_eq!(
            mark(&node),
            Some(Mark {
                step: Step::Fencing,
                since: None
            })
        );
    }
}
