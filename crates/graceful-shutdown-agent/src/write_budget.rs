//! How many API writes a shutdown needs at once, and whether the client's limit lets them go
//! in time. A shutdown costs two writes per pod (the DisruptionTarget status patch and the
//! delete), all of a group at its start; the agent's steady work (a pod watch, a few Events)
//! needs next to nothing, so the shutdown's writes get a client of their own whose burst holds a
//! full node's writes: the limit follows the work instead of the chart's idle rate.

use std::time::Duration;

use crate::plan::ShutdownPlan;

/// The status patch and the delete.
pub const WRITES_PER_POD: u32 = 2;
/// The node's `status.allocatable.pods` when it says nothing: the kubelet's default maxPods.
pub const DEFAULT_MAX_PODS: u32 = 110;
/// The node's Events and condition written during a shutdown.
const MARGIN: u32 = 10;

/// The burst of the shutdown's client: `configured`, or with 0, a full node's writes.
pub fn shutdown_burst(configured: u32, max_pods: u32) -> u32 {
    if configured > 0 {
        configured
    } else {
        max_pods
            .saturating_mul(WRITES_PER_POD)
            .saturating_add(MARGIN)
    }
}

/// A budget that cannot fit: the node's pods, all in one group, need longer than that group's
/// period just to be asked to stop.
#[derive(Debug, Clone, PartialEq)]
pub struct TooSlow {
    pub pods: u32,
    pub writes: u32,
    pub qps: f64,
    pub burst: u32,
    pub needed: Duration,
    pub group_priority: i32,
    pub group_period: Duration,
}

impl std::fmt::Display for TooSlow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "at {} writes/s with a burst of {}, the {} writes of a full node ({} pods) take {:.0}s to send, \
             more than the {}s of the group from priority {}; raise --shutdown-api-burst (0 sizes it from the node) or --api-qps",
            self.qps,
            self.burst,
            self.writes,
            self.pods,
            self.needed.as_secs_f64(),
            self.group_period.as_secs(),
            self.group_priority,
        )
    }
}

/// Whether `max_pods` pods in the group with the shortest period could all be sent their
/// writes within it, at `qps` after a burst of `burst`.
pub fn check(plan: &ShutdownPlan, max_pods: u32, qps: f64, burst: u32) -> Result<(), TooSlow> {
    let writes = max_pods.saturating_mul(WRITES_PER_POD);
    let paced = writes.saturating_sub(burst);
    let needed = Duration::from_secs_f64(f64::from(paced) / qps);
    let Some(shortest) = plan
        .groups()
        .iter()
        .filter(|group| !group.period.is_zero())
        .min_by_key(|group| group.period)
    else {
        return Ok(());
    };
    if needed <= shortest.period {
        return Ok(());
    }
    Err(TooSlow {
        pods: max_pods,
        writes,
        qps,
        burst,
        needed,
        group_priority: shortest.priority,
        group_period: shortest.period,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::PriorityGroup;

    fn plan() -> ShutdownPlan {
        ShutdownPlan::new(vec![
            PriorityGroup {
                priority: 0,
                period: Duration::from_secs(20),
            },
            PriorityGroup {
                priority: 2_000_000_000,
                period: Duration::from_secs(10),
            },
        ])
    }

    #[test]
    fn the_default_burst_holds_a_full_node_and_fits_any_group() {
        let burst = shutdown_burst(0, 110);
        assert_eq!(burst, 230);
        assert_eq!(check(&plan(), 110, 5.0, burst), Ok(()));
    }

    #[test]
    fn the_charts_old_limit_is_refused_with_its_numbers() {
        let refusal = check(&plan(), 110, 5.0, 10).unwrap_err();
        assert_eq!(refusal.needed, Duration::from_secs(42));
        assert_eq!(refusal.group_period, Duration::from_secs(10));
        let text = refusal.to_string();
        for number in [
            "5 writes/s",
            "burst of 10",
            "220 writes",
            "110 pods",
            "42s",
            "10s",
        ] {
            assert!(text.contains(number), "{number}: {text}");
        }
    }

    #[test]
    fn a_disabled_plan_needs_no_writes() {
        assert_eq!(check(&ShutdownPlan::default(), 110, 0.1, 1), Ok(()));
    }
}
