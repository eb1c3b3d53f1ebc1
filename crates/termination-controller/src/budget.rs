//! NodeDisruptionBudget arithmetic, as the disruption controller does it for pods.
//!
//! - A budget selects nothing with a null or empty selector (the design's rule, unlike a PDB).
//! - **Available** = Ready and not disrupted. *Disrupted* = granted by this budget, cordoned by
//!   this controller (its drain or termination has begun, whichever budget granted it, and
//!   also for budgets created or re-selected since), or being deleted without waiting for a
//!   grant (a node without our finalizer goes away regardless). A node being deleted that
//!   still waits, untouched, for a grant counts as available: counting it as gone would let
//!   two waiting nodes block each other forever.
//! - `desiredAvailable` = `minAvailable`, or selected − `maxUnavailable` (never below 0);
//!   percentages of the selected nodes round **up** in both, as `GetScaledValueFromIntOrPercent`
//!   with `roundUp` does for PDBs (so `maxUnavailable: 10%` of 5 nodes allows 1).
//! - `disruptionsAllowed` = max(available − desired, 0).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use nodegrace_core::k8s::selectors::{SelectorError, selector_matches};

use crate::api::NodeDisruptionBudgetSpec;

/// What a budget needs to know about one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeFacts<'a> {
    pub name: &'a str,
    pub labels: &'a BTreeMap<String, String>,
    pub ready: bool,
    pub deleting: bool,
    /// Being deleted and held by our finalizer: it waits for grants before anything happens.
    pub awaits_grants: bool,
    /// Cordoned by this controller: its drain or its machine's termination has begun.
    pub disrupting: bool,
}

/// A spec the controller cannot act on; the budget then fails closed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error("set exactly one of spec.minAvailable and spec.maxUnavailable (both are set)")]
    Both,
    #[error("set exactly one of spec.minAvailable and spec.maxUnavailable (neither is set)")]
    Neither,
    #[error("spec.{field}: {value:?} is not a count ≥ 0 or a percentage such as \"20%\" (0–100%)")]
    Value { field: &'static str, value: String },
    #[error("spec.selector: {0}")]
    Selector(#[from] SelectorError),
    #[error(transparent)]
    Window(#[from] crate::windows::WindowError),
}

/// The budget's limit, validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    MinAvailable(Amount),
    MaxUnavailable(Amount),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Amount {
    Count(i32),
    Percent(i32),
}

impl Amount {
    fn parse(field: &'static str, value: &IntOrString) -> Result<Self, SpecError> {
        let invalid = || SpecError::Value {
            field,
            value: match value {
                IntOrString::Int(n) => n.to_string(),
                IntOrString::String(text) => text.clone(),
            },
        };
        match value {
            IntOrString::Int(n) if *n >= 0 => Ok(Self::Count(*n)),
            IntOrString::Int(_) => Err(invalid()),
            IntOrString::String(text) => {
                let percent = text
                    .strip_suffix('%')
                    .and_then(|digits| digits.parse::<i32>().ok())
                    .filter(|percent| (0..=100).contains(percent))
                    .ok_or_else(invalid)?;
                Ok(Self::Percent(percent))
            }
        }
    }

    /// The amount of `total`, percentages rounded up.
    fn of(self, total: i32) -> i32 {
        match self {
            Self::Count(n) => n,
            Self::Percent(percent) => {
                let scaled = i64::from(percent) * i64::from(total);
                i32::try_from((scaled + 99) / 100).unwrap_or(i32::MAX)
            }
        }
    }
}

impl std::fmt::Display for Amount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Count(n) => write!(f, "{n}"),
            Self::Percent(percent) => write!(f, "{percent}%"),
        }
    }
}

impl Limit {
    pub fn of(spec: &NodeDisruptionBudgetSpec) -> Result<Self, SpecError> {
        match (&spec.min_available, &spec.max_unavailable) {
            (Some(_), Some(_)) => Err(SpecError::Both),
            (None, None) => Err(SpecError::Neither),
            (Some(min), None) => Ok(Self::MinAvailable(Amount::parse("minAvailable", min)?)),
            (None, Some(max)) => Ok(Self::MaxUnavailable(Amount::parse("maxUnavailable", max)?)),
        }
    }

    fn desired_available(self, expected: i32) -> i32 {
        match self {
            Self::MinAvailable(amount) => amount.of(expected),
            Self::MaxUnavailable(amount) => (expected - amount.of(expected)).max(0),
        }
    }
}

/// Whether the budget selects a node with these labels.
pub fn selects(
    spec: &NodeDisruptionBudgetSpec,
    labels: &BTreeMap<String, String>,
) -> Result<bool, SelectorError> {
    match &spec.selector {
        None => Ok(false),
        Some(selector)
            if selector
                .match_labels
                .as_ref()
                .is_none_or(BTreeMap::is_empty)
                && selector
                    .match_expressions
                    .as_ref()
                    .is_none_or(Vec::is_empty) =>
        {
            Ok(false)
        }
        Some(selector) => selector_matches(selector, labels),
    }
}

/// A budget's numbers at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Numbers {
    pub expected: i32,
    pub available: i32,
    pub desired: i32,
    pub allowed: i32,
}

impl std::fmt::Display for Numbers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} of {} selected nodes available, {} must stay available",
            self.available, self.expected, self.desired
        )
    }
}

/// The numbers of a budget with `limit` over `nodes` (those it selects), each with whether
/// the budget has granted it.
pub fn numbers<'a>(
    limit: Limit,
    nodes: impl IntoIterator<Item = (&'a NodeFacts<'a>, bool)>,
) -> Numbers {
    let mut expected = 0;
    let mut available = 0;
    for (node, granted) in nodes {
        expected += 1;
        if available_unless_granted(node) && !granted {
            available += 1;
        }
    }
    Numbers::counted(limit, expected, available)
}

/// Whether a node the budget selects counts as available, unless the budget granted it: Ready,
/// not cordoned by us, and not being deleted other than through our grants.
pub fn available_unless_granted(node: &NodeFacts<'_>) -> bool {
    let deleted_around_us = node.deleting && !node.awaits_grants;
    node.ready && !node.disrupting && !deleted_around_us
}

impl Numbers {
    /// A budget's numbers with `limit`, from how many nodes it selects and how many of them
    /// are available.
    pub fn counted(limit: Limit, expected: i32, available: i32) -> Self {
        let desired = limit.desired_available(expected);
        Self {
            expected,
            available,
            desired,
            allowed: (available - desired).max(0),
        }
    }
}

/// Whether `node` may be granted now. A node that is not Ready takes nothing from the budget's
/// availability, so it is granted whatever the numbers (a dead node must be removable).
pub fn may_grant(numbers: Numbers, node: &NodeFacts<'_>) -> bool {
    !node.ready || numbers.allowed > 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

    fn spec(min: Option<IntOrString>, max: Option<IntOrString>) -> NodeDisruptionBudgetSpec {
        NodeDisruptionBudgetSpec {
            min_available: min,
            max_unavailable: max,
            ..NodeDisruptionBudgetSpec::default()
        }
    }

    // The spec's fields are options; the helpers give them as the spec holds them.
    #[allow(clippy::unnecessary_wraps)]
    fn int(n: i32) -> Option<IntOrString> {
        Some(IntOrString::Int(n))
    }

    #[allow(clippy::unnecessary_wraps)]
    fn pct(text: &str) -> Option<IntOrString> {
        Some(IntOrString::String(text.to_owned()))
    }

    fn ready_nodes(labels: &BTreeMap<String, String>, count: usize) -> Vec<NodeFacts<'_>> {
        const NAMES: [&str; 10] = ["n0", "n1", "n2", "n3", "n4", "n5", "n6", "n7", "n8", "n9"];
        NAMES[..count]
            .iter()
            .map(|name| NodeFacts {
                name,
                labels,
                ready: true,
                deleting: false,
                awaits_grants: false,
                disrupting: false,
            })
            .collect()
    }

    #[test]
    fn int_and_percent_limits_round_up_as_pdbs_do() {
        let labels = BTreeMap::new();
        let nodes = ready_nodes(&labels, 5);
        let cases = [
            (spec(int(3), None), 3, 2),
            (spec(pct("50%"), None), 3, 2),
            (spec(pct("100%"), None), 5, 0),
            (spec(pct("0%"), None), 0, 5),
            (spec(None, int(1)), 4, 1),
            (spec(None, pct("10%")), 4, 1),
            (spec(None, pct("40%")), 3, 2),
            (spec(None, int(0)), 5, 0),
            (spec(None, int(9)), 0, 5),
            (spec(int(7), None), 7, 0),
        ];
        for (spec, desired, allowed) in cases {
            let limit = Limit::of(&spec).unwrap();
            let numbers = numbers(limit, nodes.iter().map(|node| (node, false)));
            assert_eq!(
                (
                    numbers.expected,
                    numbers.available,
                    numbers.desired,
                    numbers.allowed
                ),
                (5, 5, desired, allowed),
                "{spec:?}"
            );
        }
    }

    #[test]
    fn grants_not_ready_and_unguarded_deletions_are_unavailable_but_waiting_nodes_are_not() {
        let labels = BTreeMap::new();
        let mut nodes = ready_nodes(&labels, 5);
        nodes[0].ready = false;
        nodes[1].deleting = true; // no finalizer of ours: goes regardless
        nodes[2].deleting = true;
        nodes[2].awaits_grants = true;
        nodes[3].deleting = true;
        nodes[3].awaits_grants = true;
        let limit = Limit::of(&spec(None, int(3))).unwrap();
        let numbers = numbers(limit, nodes.iter().map(|node| (node, node.name == "n3")));
        assert_eq!(numbers.available, 2, "n2 (waiting) and n4");
        assert_eq!(numbers.desired, 2);
        assert_eq!(numbers.allowed, 0);
        assert!(!may_grant(numbers, &nodes[2]));
        assert!(
            may_grant(numbers, &nodes[0]),
            "a NotReady node costs nothing"
        );
    }

    #[test]
    fn invalid_specs_name_the_field_and_the_fix() {
        let cases = [
            (spec(int(1), int(1)), "exactly one"),
            (spec(None, None), "neither is set"),
            (spec(int(-1), None), "spec.minAvailable: \"-1\""),
            (spec(None, pct("101%")), "spec.maxUnavailable: \"101%\""),
            (spec(None, pct("ten")), "percentage such as \"20%\""),
        ];
        for (spec, expected) in cases {
            let error = Limit::of(&spec).unwrap_err().to_string();
            assert!(error.contains(expected), "{error}");
        }
    }

    #[test]
    fn null_and_empty_selectors_select_no_nodes() {
        let labels: BTreeMap<String, String> = [("pool".to_owned(), "a".to_owned())].into();
        let mut budget = spec(None, int(1));
        assert_eq!(selects(&budget, &labels), Ok(false), "null");
        budget.selector = Some(LabelSelector::default());
        assert_eq!(selects(&budget, &labels), Ok(false), "empty");
        budget.selector = Some(LabelSelector {
            match_labels: Some(labels.clone()),
            match_expressions: Some(vec![]),
        });
        assert_eq!(selects(&budget, &labels), Ok(true));
        assert_eq!(selects(&budget, &BTreeMap::new()), Ok(false));
    }
}
