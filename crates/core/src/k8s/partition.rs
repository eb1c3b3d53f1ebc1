//! The partition guard both controllers that act on NotReady nodes share
//! (termination-controller's `--not-ready-timeout`, out-of-service-gc's `--fence-after`). One
//! machine dying is a NotReady node; many at once are far more often a control plane that
//! cannot hear them (a zone cut off, an API server overloaded): deleting or powering them off
//! would hurt healthy machines when the network heals. kube-controller-manager stops evicting
//! in a zone past 55 % unhealthy; Karpenter's node repair stops past 20 % of a NodePool. Both
//! actions here end a machine, which is Karpenter's action, so this follows Karpenter: more
//! than the fraction (of the managed nodes, and of the node's zone when nodes carry
//! `topology.kubernetes.io/zone`), rounded up, holds the action.

use std::sync::Arc;

use crate::k8s::nodes::{NodeFields, Readiness, readiness};

pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

/// Why the action is held: where too many nodes are NotReady.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partition {
    /// `None`: over all managed nodes.
    pub zone: Option<String>,
    pub not_ready: usize,
    pub total: usize,
    /// The most NotReady nodes that still count as dead machines.
    pub tolerated: usize,
}

impl std::fmt::Display for Partition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Self {
            zone,
            not_ready,
            total,
            tolerated,
        } = self;
        match zone {
            None => write!(f, "{not_ready} of {total} managed nodes are NotReady")?,
            Some(zone) => write!(
                f,
                "{not_ready} of {total} managed nodes in zone {zone} are NotReady"
            )?,
        }
        write!(
            f,
            ", more than the {tolerated} --not-ready-max-fraction tolerates"
        )
    }
}

fn zone(node: &impl NodeFields) -> Option<&str> {
    node.meta()
        .labels
        .as_ref()?
        .get(ZONE_LABEL)
        .map(String::as_str)
}

fn not_ready(node: &impl NodeFields) -> bool {
    readiness(node) != Readiness::Ready
}

fn check<'a, N: NodeFields + 'a>(
    nodes: impl Iterator<Item = &'a Arc<N>>,
    fraction: f64,
    zone: Option<&str>,
) -> Option<Partition> {
    let (mut total, mut down) = (0, 0);
    for node in nodes {
        total += 1;
        down += usize::from(not_ready(node.as_ref()));
    }
    // Rounded up, as Karpenter scales its 20 %: one dead node of three is still repaired.
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let tolerated = (fraction * total as f64).ceil() as usize;
    (down > tolerated).then(|| Partition {
        zone: zone.map(str::to_owned),
        not_ready: down,
        total,
        tolerated,
    })
}

/// Whether acting on `node` for being NotReady is held: too many of the `managed` nodes, or of
/// its zone's, are NotReady.
pub fn partitioned<N: NodeFields>(
    managed: &[Arc<N>],
    node: &N,
    fraction: f64,
) -> Option<Partition> {
    check(managed.iter(), fraction, None).or_else(|| {
        let zone = zone(node)?;
        check(
            managed
                .iter()
                .filter(|other| self::zone(other.as_ref()) == Some(zone)),
            fraction,
            Some(zone),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Node;
    use serde_json::json;

    fn node(ready: bool, zone: Option<&str>) -> Arc<Node> {
        let labels = zone.map_or_else(|| json!({}), |zone| json!({ZONE_LABEL: zone}));
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": "n", "labels": labels},
                "status": {"conditions": [{"type": "Ready", "status": if ready {"True"} else {"Unknown"}}]},
            }))
            .unwrap(),
        )
    }

    fn nodes(ready: usize, down: usize, zone: Option<&str>) -> Vec<Arc<Node>> {
        (0..ready)
            .map(|_| node(true, zone))
            .chain((0..down).map(|_| node(false, zone)))
            .collect()
    }

    #[test]
    fn more_than_the_fraction_rounded_up_is_a_partition() {
        let dead = node(false, None);
        // (ready, NotReady, held)
        for (ready, down, held) in [
            (9, 1, false),
            (8, 2, false),
            (7, 3, true),
            (4, 6, true),
            (2, 1, false),
            (0, 1, false),
            (0, 2, true),
        ] {
            let result = partitioned(&nodes(ready, down, None), &dead, 0.2);
            assert_eq!(
                result.is_some(),
                held,
                "{ready} Ready, {down} NotReady: {result:?}"
            );
        }
        let held = partitioned(&nodes(4, 6, None), &dead, 0.2).unwrap();
        assert_eq!(
            held.to_string(),
            "6 of 10 managed nodes are NotReady, more than the 2 --not-ready-max-fraction tolerates"
        );
    }

    #[test]
    fn a_zone_cut_off_is_held_even_when_the_cluster_is_mostly_ready() {
        let mut cluster = nodes(20, 0, Some("a"));
        cluster.extend(nodes(1, 3, Some("b")));
        let dead_in_b = node(false, Some("b"));
        let held = partitioned(&cluster, &dead_in_b, 0.2).unwrap();
        assert_eq!(held.zone.as_deref(), Some("b"));
        assert_eq!((held.not_ready, held.total, held.tolerated), (3, 4, 1));
        cluster.truncate(22);
        assert_eq!(
            partitioned(&cluster, &dead_in_b, 0.2),
            None,
            "1 of 2 in b, within ceil(0.4)"
        );
    }
}
