//! The deleting nodes that wait for their budgets' grants, kept by the leader's loop without a
//! task each. A rollout of 5,000 under a 10 % budget has thousands waiting at once: a task
//! apiece (its future, its wake-up channel, its boxed first step, what it had reported) held
//! about 5.5 KiB per node, 26 MiB at the rollout's peak (heap profile). Here a waiting node
//! costs its identity and the words it was last told, a few
//! hundred bytes; its task starts once every budget covering it has granted it, or it is
//! cordoned already (a restart mid-disruption), and a task whose grant was given back returns
//! its node here.
//!
//! What a waiting node is told: its `MaintenancePlanned` and `Terminating` conditions, written
//! when its wait changes (not at every change of its budget's numbers), and one more in its
//! budget's `AwaitingBudget` Event series when it begins to wait.

use std::collections::HashMap;

use nodegrace_core::k8s::conditions::ConditionSpec;
use nodegrace_core::k8s::events::{EventReport, object_reference};
use nodegrace_core::k8s::node_identity::NodeIdentity;
use nodegrace_core::k8s::reporter::ConditionGuard;

use crate::conditions::{MAINTENANCE_PLANNED, Reason, TERMINATING};
use crate::shared::Shared;
use crate::waits::{INVALID, Refusal};

/// The waiting nodes, by UID (grants and verdicts name nodes by UID).
#[derive(Debug, Default)]
pub struct WaitingRoom {
    nodes: HashMap<String, WaitingNode>,
}

#[derive(Debug)]
pub struct WaitingNode {
    pub identity: NodeIdentity,
    told: Told,
}

/// What a waiting node was last told, so a wait that goes on writes nothing more.
#[derive(Debug, Default)]
struct Told {
    /// The waits counted in their budget's Event series: (budget, invalid).
    counted: Vec<(String, bool)>,
    /// The messages of its `MaintenancePlanned` and `Terminating` conditions.
    conditions: Option<(String, String)>,
}

impl WaitingRoom {
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    pub fn contains(&self, uid: &str) -> bool {
        self.nodes.contains_key(uid)
    }

    /// Seats `node`, unless it waits here already.
    pub fn seat(&mut self, node: NodeIdentity) {
        self.nodes
            .entry(node.uid().to_owned())
            .or_insert_with(|| WaitingNode {
                identity: node,
                told: Told::default(),
            });
    }

    pub fn get(&self, uid: &str) -> Option<&WaitingNode> {
        self.nodes.get(uid)
    }

    /// Takes the node out; whether it was told `MaintenancePlanned` (its task turns it False).
    pub fn leave(&mut self, uid: &str) -> Option<(NodeIdentity, bool)> {
        let node = self.nodes.remove(uid)?;
        Some((node.identity, node.told.conditions.is_some()))
    }

    /// Tells the node with `uid` that it waits on `budget` for `refusal`: its conditions where
    /// the wait changed, and its budget's Event count the first time it waits on it.
    pub fn tell(&mut self, shared: &Shared, uid: &str, budget: &str, refusal: &Refusal) {
        let Some(node) = self.nodes.get_mut(uid) else {
            return;
        };
        let counted = (budget.to_owned(), matches!(refusal, Refusal::Invalid(_)));
        if !node.told.counted.contains(&counted) {
            count_wait(shared, budget, refusal);
            node.told.counted.push(counted);
        }
        let (reason, planned, waiting) = wait_conditions(budget, refusal);
        if node.told.conditions.as_ref() == Some(&(planned.clone(), waiting.clone())) {
            return;
        }
        let condition = |type_, reason: Reason, message: &str| {
            shared.reporter.condition_of(
                &node.identity,
                ConditionSpec::new(type_, "True", reason.as_str(), message.to_owned()),
                ConditionGuard::Always,
            );
        };
        condition(MAINTENANCE_PLANNED, reason, &planned);
        condition(TERMINATING, Reason::AwaitingBudget, &waiting);
        node.told.conditions = Some((planned, waiting));
    }
}

/// How a waiting node's conditions name the budget they wait for: `NodeDisruptionBudget
/// <name>: <why>`.
const WAITED_BUDGET: &str = "NodeDisruptionBudget ";

/// The budget named by a `Terminating` or `MaintenancePlanned` message of a waiting node (what
/// `kubectl nodegrace` shows as its blocker).
pub fn waited_budget(message: &str) -> Option<&str> {
    let (name, _) = message.strip_prefix(WAITED_BUDGET)?.split_once(':')?;
    Some(name)
}

/// Whether a waiting node's message says its budget is invalid: only a fix of the budget
/// moves it on.
pub fn waits_for_a_fix(message: &str) -> bool {
    message
        .strip_prefix(WAITED_BUDGET)
        .and_then(|rest| rest.split_once(": "))
        .is_some_and(|(_, why)| why.starts_with(INVALID))
}

/// The reason of `MaintenancePlanned` and the messages of it and of `Terminating`, without the
/// budget's numbers: those change with every node that comes or goes, and the budget's status
/// has them.
fn wait_conditions(budget: &str, refusal: &Refusal) -> (Reason, String, String) {
    let planned = match refusal {
        Refusal::Exhausted(_) => {
            format!("{WAITED_BUDGET}{budget}: too few of its nodes are available now")
        }
        Refusal::Invalid(_) => format!("{WAITED_BUDGET}{budget}: {INVALID}"),
        Refusal::OutsideWindows { .. } | Refusal::WindowSpent { .. } => {
            format!("{WAITED_BUDGET}{budget}: {refusal}")
        }
    };
    let waiting = match refusal {
        Refusal::Exhausted(_) => planned.clone(),
        _ => format!("{WAITED_BUDGET}{budget}: {refusal}"),
    };
    let reason = if refusal.is_window() {
        Reason::MaintenanceWindow
    } else {
        Reason::AwaitingBudget
    };
    (reason, planned, waiting)
}

/// A node that begins to wait is one more of its budget's `AwaitingBudget` Event, as
/// client-go's correlator folds the same reason about the same object: the nodes of a rollout
/// that wait for their turn are one Event on the budget whose count grows (and repeats queued
/// together are one write), not an Event per node. The node's own conditions say what it
/// waits for.
fn count_wait(shared: &Shared, budget: &str, refusal: &Refusal) {
    let Some(object) = shared.budgets.cache.get(None, budget) else {
        return;
    };
    let (kind, note) = match refusal {
        Refusal::Exhausted(_) => (
            "exhausted",
            "Nodes wait for their turn: too few of the budget's nodes are available \
             (its status has the numbers)"
                .to_owned(),
        ),
        Refusal::Invalid(_) => ("invalid", format!("Nodes wait: {refusal}")),
        Refusal::OutsideWindows { .. } | Refusal::WindowSpent { .. } => (
            "window",
            format!("Nodes wait for a maintenance window: {refusal}"),
        ),
    };
    let reference = object_reference(object.as_ref());
    let reason = Reason::AwaitingBudget.as_str();
    let series = format!(
        "{}/{reason}/{kind}",
        reference.uid.as_deref().unwrap_or(budget),
    );
    let event = if matches!(refusal, Refusal::Invalid(_)) {
        EventReport::warning(reference, reason, "Grant", note)
    } else {
        EventReport::normal(reference, reason, "Grant", note)
    };
    shared.reporter.event(event.in_paced_series(series));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::Numbers;

    /// What a waiting node holds, heap included: its identity and what it was told.
    fn bytes(node: &WaitingNode) -> usize {
        let told = &node.told;
        std::mem::size_of::<WaitingNode>()
            + node.identity.name().len()
            + node.identity.uid().len()
            + told.counted.capacity() * std::mem::size_of::<(String, bool)>()
            + told
                .counted
                .iter()
                .map(|(budget, _)| budget.capacity())
                .sum::<usize>()
            + told.conditions.as_ref().map_or(0, |(planned, waiting)| {
                planned.capacity() + waiting.capacity()
            })
    }

    /// What `kubectl nodegrace` reads back: every waiting message names its budget.
    #[test]
    fn the_waited_budget_is_read_back_from_each_message() {
        let refusals = [
            Refusal::Exhausted(Numbers::default()),
            Refusal::Invalid(crate::budget::SpecError::Neither),
        ];
        for refusal in &refusals {
            let (_, planned, waiting) = wait_conditions("rollout", refusal);
            assert_eq!(waited_budget(&planned), Some("rollout"), "{planned}");
            assert_eq!(waited_budget(&waiting), Some("rollout"), "{waiting}");
            let invalid = matches!(refusal, Refusal::Invalid(_));
            assert_eq!(waits_for_a_fix(&planned), invalid, "{planned}");
            assert_eq!(waits_for_a_fix(&waiting), invalid, "{waiting}");
        }
        assert_eq!(waited_budget("Pods web-1: PDB shop/web"), None);
    }

    /// The bound for a rollout of thousands: a node waiting for its turn costs a few
    /// hundred bytes, not a task (5.5 KiB each, measured by heap profile) and a queue of writes.
    #[test]
    fn a_waiting_node_costs_a_few_hundred_bytes() {
        let refusal = Refusal::Exhausted(Numbers::default());
        let (_, planned, waiting) = wait_conditions("rollout", &refusal);
        let node = WaitingNode {
            identity: NodeIdentity::new(
                "ip-10-0-12-34.ec2.internal",
                "8f14e45f-ceea-467f-a0e6-2a54c1a9e3d1",
            ),
            told: Told {
                counted: vec![("rollout".to_owned(), false)],
                conditions: Some((planned, waiting)),
            },
        };
        let bytes = bytes(&node);
        assert!(bytes <= 512, "a waiting node holds {bytes} bytes");
    }
}
