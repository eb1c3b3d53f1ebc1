//! How long work that keeps failing waits before it is tried again: the one policy every
//! program's retries share (exponential, capped).

use std::time::Duration;

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

#[cfg(test)]
mod tests {
    use super::*;

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
