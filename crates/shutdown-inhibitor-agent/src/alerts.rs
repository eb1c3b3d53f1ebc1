//! `--alert-timeout`: a Lease held longer than this since its acquireTime is reported once per
//! acquisition (a new acquireTime is a new acquisition).

use std::collections::HashSet;
use std::time::Duration;

use jiff::Timestamp;

use crate::leases::Holder;

#[derive(Debug, Default)]
pub struct Alerts {
    timeout: Option<Duration>,
    reported: HashSet<(String, String, Timestamp)>,
}

impl Alerts {
    /// `timeout` zero disables alerts.
    pub fn new(timeout: Duration) -> Self {
        Self {
            timeout: (!timeout.is_zero()).then_some(timeout),
            reported: HashSet::new(),
        }
    }

    /// The holders that just crossed the timeout at `now` (each reported once).
    pub fn due(&mut self, holders: &[Holder], now: Timestamp) -> Vec<Holder> {
        let Some(timeout) = self.timeout else {
            return Vec::new();
        };
        let current: HashSet<_> = holders
            .iter()
            .map(|h| (h.namespace.clone(), h.holder.clone(), h.acquired))
            .collect();
        // Forget released acquisitions so a later one with the same time is new again.
        self.reported.retain(|key| current.contains(key));
        holders
            .iter()
            .filter(|h| now.duration_since(h.acquired).unsigned_abs() >= timeout)
            .filter(|h| {
                self.reported
                    .insert((h.namespace.clone(), h.holder.clone(), h.acquired))
            })
            .cloned()
            .collect()
    }
}

/// Age of the oldest active Lease, for the gauge.
pub fn oldest_age(holders: &[Holder], now: Timestamp) -> Duration {
    holders
        .iter()
        .map(|h| now.duration_since(h.acquired).unsigned_abs())
        .max()
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holder(acquired: i64) -> Holder {
        Holder {
            namespace: "a".into(),
            holder: "job".into(),
            acquired: Timestamp::from_second(acquired).unwrap(),
        }
    }

    #[test]
    fn alerts_fire_once_per_acquisition_after_the_timeout() {
        let mut alerts = Alerts::new(Duration::from_secs(60));
        let at = |s| Timestamp::from_second(s).unwrap();
        let holders = [holder(1000)];
        assert!(alerts.due(&holders, at(1059)).is_empty());
        assert_eq!(alerts.due(&holders, at(1060)).len(), 1);
        assert!(
            alerts.due(&holders, at(1200)).is_empty(),
            "once per acquisition"
        );
        let again = [holder(2000)];
        assert!(alerts.due(&again, at(2030)).is_empty());
        assert_eq!(
            alerts.due(&again, at(2061)).len(),
            1,
            "a new acquisition alerts again"
        );
    }

    #[test]
    fn zero_disables_and_oldest_age_is_the_max() {
        let mut alerts = Alerts::new(Duration::ZERO);
        assert!(
            alerts
                .due(&[holder(0)], Timestamp::from_second(10_000).unwrap())
                .is_empty()
        );
        let now = Timestamp::from_second(1100).unwrap();
        assert_eq!(
            oldest_age(&[holder(1000), holder(1090)], now),
            Duration::from_secs(100)
        );
        assert_eq!(oldest_age(&[], now), Duration::ZERO);
    }
}
