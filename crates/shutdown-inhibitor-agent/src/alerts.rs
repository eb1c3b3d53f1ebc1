//! `--alert-timeout`: a Lease held longer than this since its acquireTime is reported once per
//! acquisition (a new acquireTime is a new acquisition). An acquireTime in the future (the
//! holder's clock runs ahead) counts as age 0 and is reported once, on its own.

use std::collections::HashSet;
use std::time::Duration;

use jiff::Timestamp;

use crate::leases::Holder;

type Acquisition = (String, String, Timestamp);

#[derive(Debug, Default)]
pub struct Alerts {
    timeout: Option<Duration>,
    reported: HashSet<Acquisition>,
    reported_future: HashSet<Acquisition>,
}

/// What to report at one tick.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Due {
    /// Holders that just crossed the timeout.
    pub held_too_long: Vec<Holder>,
    /// Holders whose acquireTime was just seen in the future.
    pub acquired_in_future: Vec<Holder>,
}

fn acquisition(holder: &Holder) -> Acquisition {
    (
        holder.namespace.clone(),
        holder.holder.clone(),
        holder.acquired,
    )
}

/// How long `holder` has held its Lease at `now`; zero for an acquireTime in the future.
pub fn age(holder: &Holder, now: Timestamp) -> Duration {
    Duration::try_from(now.duration_since(holder.acquired)).unwrap_or_default()
}

impl Alerts {
    /// `timeout` zero disables alerts.
    pub fn new(timeout: Duration) -> Self {
        Self {
            timeout: (!timeout.is_zero()).then_some(timeout),
            reported: HashSet::new(),
            reported_future: HashSet::new(),
        }
    }

    /// What to report at `now`, each at most once per acquisition. Once a shutdown has begun
    /// the Leases no longer block anything, so nothing is reported about them.
    pub fn due(&mut self, holders: &[Holder], now: Timestamp, shutting_down: bool) -> Due {
        let current: HashSet<Acquisition> = holders.iter().map(acquisition).collect();
        // Forget released acquisitions so a later one with the same time is new again.
        self.reported.retain(|key| current.contains(key));
        self.reported_future.retain(|key| current.contains(key));
        if shutting_down {
            return Due::default();
        }
        let acquired_in_future = holders
            .iter()
            .filter(|h| h.acquired > now)
            .filter(|h| self.reported_future.insert(acquisition(h)))
            .cloned()
            .collect();
        let held_too_long = match self.timeout {
            None => Vec::new(),
            Some(timeout) => holders
                .iter()
                .filter(|h| h.acquired <= now && age(h, now) >= timeout)
                .filter(|h| self.reported.insert(acquisition(h)))
                .cloned()
                .collect(),
        };
        Due {
            held_too_long,
            acquired_in_future,
        }
    }
}

/// Age of the oldest active Lease, for the gauge.
pub fn oldest_age(holders: &[Holder], now: Timestamp) -> Duration {
    holders
        .iter()
        .map(|h| age(h, now))
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
        let mut too_long =
            |holders: &[Holder], now| alerts.due(holders, at(now), false).held_too_long;
        assert!(too_long(&holders, 1059).is_empty());
        assert_eq!(too_long(&holders, 1060).len(), 1);
        assert!(too_long(&holders, 1200).is_empty(), "once per acquisition");
        let again = [holder(2000)];
        assert!(too_long(&again, 2030).is_empty());
        assert_eq!(
            too_long(&again, 2061).len(),
            1,
            "a new acquisition alerts again"
        );
    }

    #[test]
    fn a_future_acquire_time_is_age_zero_and_reported_once_not_as_too_long() {
        let mut alerts = Alerts::new(Duration::from_secs(60));
        let at = |s| Timestamp::from_second(s).unwrap();
        let skewed = [holder(5000)];
        let due = alerts.due(&skewed, at(1000), false);
        assert!(due.held_too_long.is_empty(), "{due:?}");
        assert_eq!(due.acquired_in_future, skewed.to_vec());
        assert_eq!(alerts.due(&skewed, at(1001), false), Due::default());
        assert_eq!(oldest_age(&skewed, at(1000)), Duration::ZERO);
        // Once the clocks agree, the Lease ages from its acquireTime as any other.
        assert!(
            alerts
                .due(&skewed, at(5059), false)
                .held_too_long
                .is_empty()
        );
        assert_eq!(alerts.due(&skewed, at(5060), false).held_too_long.len(), 1);
    }

    #[test]
    fn nothing_is_reported_once_the_shutdown_has_begun() {
        let mut alerts = Alerts::new(Duration::from_secs(60));
        let now = Timestamp::from_second(10_000).unwrap();
        let holders = [holder(1000), holder(20_000)];
        assert_eq!(alerts.due(&holders, now, true), Due::default());
    }

    #[test]
    fn zero_disables_and_oldest_age_is_the_max() {
        let mut alerts = Alerts::new(Duration::ZERO);
        assert!(
            alerts
                .due(&[holder(0)], Timestamp::from_second(10_000).unwrap(), false)
                .held_too_long
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
