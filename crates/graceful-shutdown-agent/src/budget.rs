//! The shutdown budget: how long the pods get, from what the groups want and what logind
//! grants (`InhibitDelayMaxSec`).

use std::time::Duration;

/// The budget in effect: the groups' total, capped by what logind grants.
pub fn effective(wanted: Duration, granted: Duration) -> Duration {
    wanted.min(granted)
}

/// What is left of `budget` once `elapsed` has passed (a resumed shutdown counts from its
/// recorded start).
pub fn remaining(budget: Duration, elapsed: Duration) -> Duration {
    budget.saturating_sub(elapsed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(seconds: u64) -> Duration {
        Duration::from_secs(seconds)
    }

    #[test]
    fn the_budget_is_capped_by_logind_and_consumed_by_time() {
        let cases = [
            // (wanted, granted, elapsed, effective, remaining)
            (30, 90, 0, 30, 30),
            (30, 5, 0, 5, 5),
            (30, 30, 10, 30, 20),
            (30, 90, 45, 30, 0),
            (0, 90, 0, 0, 0),
        ];
        for (wanted, granted, elapsed, budget, left) in cases {
            let budget_now = effective(secs(wanted), secs(granted));
            assert_eq!(budget_now, secs(budget), "{wanted}/{granted}");
            assert_eq!(
                remaining(budget_now, secs(elapsed)),
                secs(left),
                "{elapsed}s in"
            );
        }
    }
}
