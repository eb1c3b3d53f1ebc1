//! Priority groups and grace periods, exactly as the kubelet computes them (KEP-2712).

use std::time::Duration;

/// The legacy critical-pods period applies from the system-critical classes' priority up.
pub use nodegrace_core::k8s::pods::SYSTEM_CRITICAL_PRIORITY;

/// One `shutdownGracePeriodByPodPriority` entry: pods of at least `priority` (and below the
/// next entry) get `period` to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PriorityGroup {
    pub priority: i32,
    pub period: Duration,
}

/// The groups in shutdown order: lowest priority first.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ShutdownPlan {
    groups: Vec<PriorityGroup>,
}

impl ShutdownPlan {
    /// Sorts the groups by priority; the caller has rejected duplicates already.
    pub fn new(mut groups: Vec<PriorityGroup>) -> Self {
        groups.sort_by_key(|group| group.priority);
        Self { groups }
    }

    /// The kubelet's conversion of `shutdownGracePeriod` + `shutdownGracePeriodCriticalPods`:
    /// ordinary pods (priority 0 and up) get total − critical, system-critical pods get critical.
    pub fn from_legacy(total: Duration, critical: Duration) -> Self {
        if total.is_zero() {
            return Self::default();
        }
        Self::new(vec![
            PriorityGroup {
                priority: 0,
                period: total.saturating_sub(critical),
            },
            PriorityGroup {
                priority: SYSTEM_CRITICAL_PRIORITY,
                period: critical,
            },
        ])
    }

    pub fn groups(&self) -> &[PriorityGroup] {
        &self.groups
    }

    /// Graceful shutdown is off when there is no time to give any pod.
    pub fn is_disabled(&self) -> bool {
        self.total().is_zero()
    }

    /// The delay to ask logind for: every group runs one after the other.
    pub fn total(&self) -> Duration {
        self.groups.iter().map(|group| group.period).sum()
    }

    /// The index of the group a pod of `priority` belongs to: the highest group whose priority
    /// does not exceed the pod's; pods below the lowest group fall into the lowest, pods above
    /// the highest into the highest.
    pub fn group_index(&self, priority: i32) -> usize {
        let at_or_below = self
            .groups
            .partition_point(|group| group.priority <= priority);
        at_or_below.saturating_sub(1)
    }
}

/// The grace period a pod gets: its own, capped by its group's period. Zero is raised to one
/// second because `gracePeriodSeconds: 0` on the API removes the pod object at once while its
/// containers may still run; one second is the shortest graceful stop.
pub fn grace_period_seconds(termination_grace_period: Option<i64>, group_period: Duration) -> i64 {
    // The API server's default when a pod does not say.
    const DEFAULT_TERMINATION_GRACE_PERIOD: i64 = 30;
    let own = termination_grace_period.unwrap_or(DEFAULT_TERMINATION_GRACE_PERIOD);
    let group = i64::try_from(group_period.as_secs()).unwrap_or(i64::MAX);
    own.min(group).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(seconds: u64) -> Duration {
        Duration::from_secs(seconds)
    }

    fn group(priority: i32, seconds: u64) -> PriorityGroup {
        PriorityGroup {
            priority,
            period: secs(seconds),
        }
    }

    #[test]
    fn legacy_pair_converts_like_the_kubelet() {
        // (shutdownGracePeriod, shutdownGracePeriodCriticalPods) → groups, from the kubelet's
        // migrateConfig table.
        let cases = [
            (
                30,
                10,
                vec![group(0, 20), group(SYSTEM_CRITICAL_PRIORITY, 10)],
            ),
            (
                30,
                0,
                vec![group(0, 30), group(SYSTEM_CRITICAL_PRIORITY, 0)],
            ),
            (
                30,
                30,
                vec![group(0, 0), group(SYSTEM_CRITICAL_PRIORITY, 30)],
            ),
            (0, 0, vec![]),
        ];
        for (total, critical, expected) in cases {
            let plan = ShutdownPlan::from_legacy(secs(total), secs(critical));
            assert_eq!(plan.groups(), expected.as_slice(), "{total}s/{critical}s");
            assert_eq!(
                plan.total(),
                secs(if expected.is_empty() { 0 } else { total })
            );
        }
    }

    #[test]
    fn groups_are_ordered_lowest_priority_first() {
        let plan = ShutdownPlan::new(vec![group(100_000, 10), group(0, 5), group(1000, 7)]);
        let priorities: Vec<_> = plan.groups().iter().map(|g| g.priority).collect();
        assert_eq!(priorities, vec![0, 1000, 100_000]);
        assert_eq!(plan.total(), secs(22));
    }

    #[test]
    fn pods_land_in_the_highest_group_not_above_them_and_out_of_range_is_clamped() {
        let plan = ShutdownPlan::new(vec![group(0, 5), group(1000, 7), group(100_000, 10)]);
        let cases = [
            (-5, 0),  // below the lowest group → lowest
            (0, 0),   // boundary belongs to its own group
            (999, 0), // between groups → the lower one
            (1000, 1),
            (50_000, 1),
            (100_000, 2),
            (i32::MAX, 2), // above the highest group → highest
        ];
        for (priority, index) in cases {
            assert_eq!(plan.group_index(priority), index, "priority {priority}");
        }
    }

    #[test]
    fn pods_without_priority_count_as_zero() {
        use nodegrace_core::k8s::pods::effective_priority;
        let plan = ShutdownPlan::new(vec![group(-10, 5), group(0, 5), group(10, 5)]);
        let without: k8s_openapi::api::core::v1::Pod = serde_json::from_value(
            serde_json::json!({"metadata": {"name": "p"}, "spec": {"containers": []}}),
        )
        .unwrap();
        assert_eq!(plan.group_index(effective_priority(&without)), 1);
    }

    #[test]
    fn zero_periods_disable_the_plan() {
        assert!(ShutdownPlan::new(vec![group(0, 0), group(10, 0)]).is_disabled());
        assert!(ShutdownPlan::default().is_disabled());
        assert!(!ShutdownPlan::new(vec![group(0, 0), group(10, 1)]).is_disabled());
    }

    #[test]
    fn grace_is_the_smaller_of_the_pods_and_the_groups_never_zero() {
        assert_eq!(grace_period_seconds(Some(10), secs(30)), 10);
        assert_eq!(grace_period_seconds(Some(60), secs(30)), 30);
        assert_eq!(grace_period_seconds(None, secs(45)), 30);
        assert_eq!(grace_period_seconds(None, secs(5)), 5);
        assert_eq!(grace_period_seconds(Some(0), secs(30)), 1);
        assert_eq!(grace_period_seconds(Some(10), secs(0)), 1);
    }
}
