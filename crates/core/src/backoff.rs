//! How long work that keeps failing waits before it is tried again: the one policy every
//! program's retries share (exponential, capped, with jitter), and [`Retry`], one piece of
//! work's place in it.

use std::time::Duration;

use tokio::time::Instant;

/// Retry delays for work that keeps failing: `first`, doubling, at most
/// `longest`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub first: Duration,
    pub longest: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            first: Duration::from_millis(500),
            longest: Duration::from_secs(300),
        }
    }
}

impl Backoff {
    /// The delay after the `failures`-th failure in a row (1-based).
    pub fn delay(self, failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(31);
        self.first
            .saturating_mul(1u32 << doublings)
            .min(self.longest)
    }
}

impl Backoff {
    /// How many tries the schedule allows within `window` of the first one: the first, then
    /// one for each delay that has run out by then (jitter only makes them later).
    pub fn tries_within(self, window: Duration) -> usize {
        let mut at = Duration::ZERO;
        let mut tries = 1;
        for failures in 1.. {
            at = at.saturating_add(self.delay(failures));
            if at > window {
                break;
            }
            tries += 1;
        }
        tries
    }
}

/// How far above the schedule a jittered delay may land: up to a tenth, so that many nodes
/// failing together (an IAM policy wrong for all of them) spread their retries.
const JITTER: f64 = 0.1;

impl Backoff {
    /// [`Self::delay`] plus up to a tenth of it at random: never sooner than the schedule.
    pub fn jittered(self, failures: u32) -> Duration {
        self.delay(failures)
            .mul_f64(1.0 + JITTER * rand::random::<f64>())
    }
}

/// One piece of work's failures in a row and the earliest it may be tried again. Whatever
/// wakes the work (a watch event, our own write, a resync, a new term as leader) asks
/// [`Self::wait`] first: only a timer of the backoff's length retries a failure.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Retry {
    failures: u32,
    not_before: Option<Instant>,
}

impl Retry {
    /// Counts a failure at `now` and returns how long the work now waits.
    pub fn failed(&mut self, policy: Backoff, now: Instant) -> Duration {
        self.failures = self.failures.saturating_add(1);
        let delay = policy.jittered(self.failures);
        self.not_before = Some(now + delay);
        delay
    }

    /// Holds the work for `wait` from `now` without counting a failure (a guard said "not
    /// yet"); a hold never shortens a backoff under way.
    pub fn hold(&mut self, wait: Duration, now: Instant) {
        let until = now + wait;
        self.not_before = Some(self.not_before.map_or(until, |before| before.max(until)));
    }

    /// The work succeeded: the next failure starts the schedule again.
    pub fn succeeded(&mut self) {
        *self = Self::default();
    }

    /// How long the work must still wait at `now`; `None` when it may go.
    pub fn wait(&self, now: Instant) -> Option<Duration> {
        self.not_before
            .filter(|until| *until > now)
            .map(|until| until - now)
    }

    pub fn failures(&self) -> u32 {
        self.failures
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tries_within_a_window_follow_the_schedule() {
        let backoff = Backoff {
            first: Duration::from_secs(10),
            longest: Duration::from_secs(300),
        };
        // 0, 10, 30, 70, 150 s.
        assert_eq!(backoff.tries_within(Duration::from_secs(9)), 1);
        assert_eq!(backoff.tries_within(Duration::from_secs(24)), 2);
        assert_eq!(backoff.tries_within(Duration::from_secs(60)), 3);
        assert_eq!(backoff.tries_within(Duration::from_secs(150)), 5);
    }

    #[test]
    fn a_jittered_delay_is_never_below_the_schedule_nor_a_tenth_above_it() {
        let backoff = Backoff {
            first: Duration::from_secs(10),
            longest: Duration::from_secs(300),
        };
        for failures in 1..12 {
            let nominal = backoff.delay(failures);
            for _ in 0..50 {
                let jittered = backoff.jittered(failures);
                assert!(jittered >= nominal, "{jittered:?} < {nominal:?}");
                assert!(
                    jittered <= nominal.mul_f64(1.1),
                    "{jittered:?} > 1.1 × {nominal:?}"
                );
            }
        }
    }

    #[test]
    fn a_retry_waits_out_its_backoff_and_a_success_starts_it_again() {
        let policy = Backoff {
            first: Duration::from_secs(10),
            longest: Duration::from_secs(40),
        };
        let start = Instant::now();
        let mut retry = Retry::default();
        assert_eq!(retry.wait(start), None);
        let first = retry.failed(policy, start);
        assert!(first >= Duration::from_secs(10) && first < Duration::from_secs(11));
        assert_eq!(retry.wait(start), Some(first));
        assert_eq!(retry.wait(start + first), None);
        let second = retry.failed(policy, start + first);
        assert!(second >= Duration::from_secs(20), "{second:?}");
        retry.failed(policy, start);
        let capped = retry.failed(policy, start);
        assert!(capped <= Duration::from_secs(44), "{capped:?}");
        assert_eq!(retry.failures(), 4);
        retry.succeeded();
        assert_eq!(retry, Retry::default());
        assert!(retry.failed(policy, start) < Duration::from_secs(11));
    }

    #[test]
    fn a_hold_never_shortens_a_backoff() {
        let policy = Backoff {
            first: Duration::from_secs(10),
            longest: Duration::from_secs(10),
        };
        let start = Instant::now();
        let mut retry = Retry::default();
        let delay = retry.failed(policy, start);
        retry.hold(Duration::from_secs(1), start);
        assert_eq!(retry.wait(start), Some(delay));
        retry.hold(Duration::from_secs(30), start);
        assert_eq!(retry.wait(start), Some(Duration::from_secs(30)));
        assert_eq!(retry.failures(), 1);
    }

    #[test]
    fn backoff_doubles_from_the_first_delay_to_the_cap() {
        let backoff = Backoff {
            first: Duration::from_millis(500),
            longest: Duration::from_secs(5),
        };
        let cases = [
            (0, 500),
            (1, 500),
            (2, 1000),
            (3, 2000),
            (4, 4000),
            (5, 5000),
            (40, 5000),
            (u32::MAX, 5000),
        ];
        for (failures, millis) in cases {
            assert_eq!(
                backoff.delay(failures),
                Duration::from_millis(millis),
                "after {failures} failures"
            );
        }
    }
}
