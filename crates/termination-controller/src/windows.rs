//! Maintenance windows of a NodeDisruptionBudget: when its Ready nodes may start a disruption,
//! and how many may start in one window.
//!
//! - A schedule is a five-field cron expression read in the window's IANA time zone (UTC when
//!   none is given), so "0 2 * * 1-5" in Europe/Berlin opens at 02:00 Berlin time all year.
//! - Daylight saving, as Vixie cron and the Open Cron Pattern Specification do it (the `croner`
//!   crate): a start that falls into the hour skipped in spring opens at the first minute after
//!   the gap; a start in the hour repeated in autumn opens once, at its first occurrence. A
//!   window lasts its `duration` of real time, whatever the clocks do meanwhile.
//! - Outside every window the budget starts no disruption of a Ready node; a disruption granted
//!   inside a window goes on after it closes (the window gates starts, not drains). A NotReady
//!   node takes nothing from availability and is granted whatever the windows say, as it is
//!   whatever the numbers say: a dead node must be removable.
//! - `maxPerWindow` caps the disruptions started in one window; the count is kept in the
//!   budget's status (grants of nodes long gone no longer show how many started).

use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};
use jiff::tz::TimeZone;
use jiff::{SignedDuration, Timestamp, Zoned};
use nodegrace_core::duration::parse_go_duration;

use crate::api::{ActiveWindow, MaintenanceWindow, NodeDisruptionBudgetSpec};

/// A schedule whose next start is further than this is refused: it never opens in practice
/// (a 30th of February), and searching for it costs a walk to the year 5000.
const LONGEST_GAP_YEARS: i16 = 9;

/// A window spec the controller cannot read; the budget then fails closed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WindowError {
    #[error(
        "spec.windows[{index}].schedule: {value:?} is not a cron schedule of five fields \
         (minute hour day-of-month month day-of-week, such as \"0 2 * * 1-5\"): {reason}"
    )]
    Schedule {
        index: usize,
        value: String,
        reason: String,
    },
    #[error(
        "spec.windows[{index}].schedule: {value:?} opens no window in the next \
         {LONGEST_GAP_YEARS} years"
    )]
    NeverOpens { index: usize, value: String },
    #[error(
        "spec.windows[{index}].duration: {value:?} is not a duration above 0 such as \"3h\" or \
         \"90m\""
    )]
    Duration { index: usize, value: String },
    #[error(
        "spec.windows[{index}].timeZone: {value:?} is not an IANA time zone (such as \
         \"Europe/Berlin\" or \"UTC\")"
    )]
    TimeZone { index: usize, value: String },
    #[error("spec.maxPerWindow: {0} is below 0")]
    NegativeMax(i32),
    #[error("spec.maxPerWindow needs spec.windows: without windows there is no window to count in")]
    MaxWithoutWindows,
}

/// One recurring window, read.
#[derive(Debug, Clone)]
struct Window {
    schedule: Cron,
    length: SignedDuration,
    zone: TimeZone,
}

impl Window {
    /// The opening of this window that contains `now`, if one does: the latest start at or
    /// before `now` (later starts of overlapping openings end later).
    fn containing(&self, now: Timestamp) -> Option<Opening> {
        let start = self
            .schedule
            .find_previous_occurrence(&now.to_zoned(self.zone.clone()), true)
            .ok()?;
        let opening = self.opening(start)?;
        (opening.end.timestamp() > now).then_some(opening)
    }

    fn next_start(&self, after: Timestamp) -> Option<Zoned> {
        self.schedule
            .find_next_occurrence(&after.to_zoned(self.zone.clone()), false)
            .ok()
    }

    fn opening(&self, start: Zoned) -> Option<Opening> {
        let end = start.timestamp().checked_add(self.length).ok()?;
        Some(Opening {
            end: end.to_zoned(self.zone.clone()),
            start,
        })
    }
}

/// One opening of a window, in the window's time zone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Opening {
    pub start: Zoned,
    pub end: Zoned,
}

/// A budget's windows and their cap, read from its spec.
#[derive(Debug, Clone)]
pub struct Windows {
    windows: Vec<Window>,
    max_per_window: Option<i32>,
}

/// Whether the windows let a Ready node start its disruption now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gate {
    /// Inside a window; `left` more may start in it (`None`: no cap); `next` is when the
    /// following one opens.
    Open {
        opening: Opening,
        left: Option<i32>,
        next: Option<Zoned>,
    },
    /// Outside every window; `next` is when the next one opens.
    Closed { next: Option<Zoned> },
}

impl Windows {
    /// The budget's windows; `None` when it has none (disruptions may start at any time).
    pub fn of(
        spec: &NodeDisruptionBudgetSpec,
        now: Timestamp,
    ) -> Result<Option<Self>, WindowError> {
        if spec.windows.is_empty() {
            return match spec.max_per_window {
                Some(_) => Err(WindowError::MaxWithoutWindows),
                None => Ok(None),
            };
        }
        if let Some(max) = spec.max_per_window.filter(|max| *max < 0) {
            return Err(WindowError::NegativeMax(max));
        }
        let windows = spec
            .windows
            .iter()
            .enumerate()
            .map(|(index, window)| read(index, window, now))
            .collect::<Result<_, _>>()?;
        Ok(Some(Self {
            windows,
            max_per_window: spec.max_per_window,
        }))
    }

    /// The opening containing `now`: of several, the one that ends last (the earliest start
    /// of those).
    pub fn open_at(&self, now: Timestamp) -> Option<Opening> {
        self.windows
            .iter()
            .filter_map(|window| window.containing(now))
            .max_by(|a, b| {
                (a.end.timestamp(), std::cmp::Reverse(a.start.timestamp()))
                    .cmp(&(b.end.timestamp(), std::cmp::Reverse(b.start.timestamp())))
            })
    }

    /// When the next window opens after `now`.
    pub fn next_start(&self, now: Timestamp) -> Option<Zoned> {
        self.windows
            .iter()
            .filter_map(|window| window.next_start(now))
            .min_by_key(Zoned::timestamp)
    }

    /// The next moment the gate may change: the open window's end or the next start.
    pub fn next_change(&self, now: Timestamp) -> Option<Timestamp> {
        let end = self.open_at(now).map(|opening| opening.end.timestamp());
        let start = self.next_start(now).map(|start| start.timestamp());
        end.into_iter().chain(start).min()
    }

    /// The gate now, given how many disruptions the budget's status says started in the
    /// window it records.
    pub fn gate(&self, record: Option<&ActiveWindow>, now: Timestamp) -> Gate {
        match self.open_at(now) {
            Some(opening) => {
                let started = started_in(record, &opening);
                Gate::Open {
                    left: self.max_per_window.map(|max| (max - started).max(0)),
                    next: self.next_start(now),
                    opening,
                }
            }
            None => Gate::Closed {
                next: self.next_start(now),
            },
        }
    }

    /// The status record of the window open now, counting `more` disruptions started with
    /// those `record` holds for it; `None` outside every window.
    pub fn record(
        &self,
        record: Option<&ActiveWindow>,
        more: i32,
        now: Timestamp,
    ) -> Option<ActiveWindow> {
        let opening = self.open_at(now)?;
        Some(ActiveWindow {
            disruptions_started: started_in(record, &opening) + more,
            start: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(opening.start.timestamp()),
            end: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(opening.end.timestamp()),
        })
    }

    pub fn max_per_window(&self) -> Option<i32> {
        self.max_per_window
    }
}

/// Disruptions `record` counts for `opening` (0 when it records another window).
fn started_in(record: Option<&ActiveWindow>, opening: &Opening) -> i32 {
    record
        .filter(|record| record.start.0 == opening.start.timestamp())
        .map_or(0, |record| record.disruptions_started)
}

fn read(index: usize, window: &MaintenanceWindow, now: Timestamp) -> Result<Window, WindowError> {
    let schedule = CronParser::builder()
        .seconds(Seconds::Disallowed)
        .year(Year::Disallowed)
        .build()
        .parse(&window.schedule)
        .map_err(|error| WindowError::Schedule {
            index,
            value: window.schedule.clone(),
            reason: error.to_string(),
        })?;
    let length = parse_go_duration(&window.duration)
        .ok()
        .filter(|length| !length.is_zero())
        .and_then(|length| SignedDuration::try_from(length).ok())
        .ok_or_else(|| WindowError::Duration {
            index,
            value: window.duration.clone(),
        })?;
    let zone = match window.time_zone.as_deref().map(str::trim) {
        None | Some("") => TimeZone::UTC,
        Some(name) => jiff::tz::db()
            .get(name)
            .map_err(|_| WindowError::TimeZone {
                index,
                value: name.to_owned(),
            })?,
    };
    let read = Window {
        schedule,
        length,
        zone,
    };
    let horizon = now
        .to_zoned(TimeZone::UTC)
        .checked_add(jiff::Span::new().years(LONGEST_GAP_YEARS))
        .map_or(Timestamp::MAX, |horizon| horizon.timestamp());
    if read
        .next_start(now)
        .is_none_or(|start| start.timestamp() > horizon)
    {
        return Err(WindowError::NeverOpens {
            index,
            value: window.schedule.clone(),
        });
    }
    Ok(read)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(windows: &[(&str, &str, Option<&str>)], max: Option<i32>) -> NodeDisruptionBudgetSpec {
        NodeDisruptionBudgetSpec {
            windows: windows
                .iter()
                .map(|(schedule, duration, zone)| MaintenanceWindow {
                    schedule: (*schedule).to_owned(),
                    duration: (*duration).to_owned(),
                    time_zone: zone.map(str::to_owned),
                })
                .collect(),
            max_per_window: max,
            ..NodeDisruptionBudgetSpec::default()
        }
    }

    fn at(text: &str) -> Timestamp {
        text.parse().unwrap()
    }

    fn windows(windows: &[(&str, &str, Option<&str>)], max: Option<i32>) -> Windows {
        Windows::of(&spec(windows, max), at("2026-01-01T00:00:00Z"))
            .unwrap()
            .unwrap()
    }

    fn open(windows: &Windows, now: &str) -> Option<(String, String)> {
        windows
            .open_at(at(now))
            .map(|opening| (opening.start.to_string(), opening.end.to_string()))
    }

    #[test]
    fn weekday_nights_in_berlin_open_at_two_local_time_all_year() {
        let nights = windows(&[("0 2 * * 1-5", "3h", Some("Europe/Berlin"))], None);
        let cases = [
            // Monday 2026-11-30, CET (+01:00): 02:00 local is 01:00Z.
            ("2026-11-30T00:59:59Z", None),
            (
                "2026-11-30T01:00:00Z",
                Some((
                    "2026-11-30T02:00:00+01:00[Europe/Berlin]",
                    "2026-11-30T05:00:00+01:00[Europe/Berlin]",
                )),
            ),
            (
                "2026-11-30T03:59:59Z",
                Some((
                    "2026-11-30T02:00:00+01:00[Europe/Berlin]",
                    "2026-11-30T05:00:00+01:00[Europe/Berlin]",
                )),
            ),
            ("2026-11-30T04:00:00Z", None),
            // Sunday: no window.
            ("2026-11-29T01:30:00Z", None),
            // Summer, CEST (+02:00): 02:00 local is 00:00Z.
            (
                "2026-07-01T00:30:00Z",
                Some((
                    "2026-07-01T02:00:00+02:00[Europe/Berlin]",
                    "2026-07-01T05:00:00+02:00[Europe/Berlin]",
                )),
            ),
        ];
        for (now, expected) in cases {
            let expected = expected.map(|(start, end)| (start.to_owned(), end.to_owned()));
            assert_eq!(open(&nights, now), expected, "{now}");
        }
        assert_eq!(
            nights
                .next_start(at("2026-11-28T12:00:00Z"))
                .unwrap()
                .to_string(),
            "2026-11-30T02:00:00+01:00[Europe/Berlin]",
            "Saturday's next window is Monday's"
        );
    }

    #[test]
    fn a_start_in_the_skipped_spring_hour_opens_after_the_gap_and_lasts_real_time() {
        // 2026-03-29 in Berlin: 02:00 CET becomes 03:00 CEST; 02:30 does not exist.
        let nightly = windows(&[("30 2 * * *", "1h", Some("Europe/Berlin"))], None);
        let (start, end) = open(&nightly, "2026-03-29T01:30:00Z").unwrap();
        assert_eq!(start, "2026-03-29T03:00:00+02:00[Europe/Berlin]");
        assert_eq!(end, "2026-03-29T04:00:00+02:00[Europe/Berlin]");
        assert_eq!(
            open(&nightly, "2026-03-29T00:59:00Z"),
            None,
            "not before the gap"
        );
        // The day before and after open at 02:30 as usual.
        assert_eq!(
            open(&nightly, "2026-03-28T01:45:00Z").unwrap().0,
            "2026-03-28T02:30:00+01:00[Europe/Berlin]"
        );
        assert_eq!(
            open(&nightly, "2026-03-30T00:45:00Z").unwrap().0,
            "2026-03-30T02:30:00+02:00[Europe/Berlin]"
        );
    }

    #[test]
    fn a_start_in_the_repeated_autumn_hour_opens_once() {
        // 2026-10-25 in Berlin: 03:00 CEST becomes 02:00 CET; 02:30 happens twice.
        let nightly = windows(&[("30 2 * * *", "20m", Some("Europe/Berlin"))], None);
        let (start, end) = open(&nightly, "2026-10-25T00:40:00Z").unwrap();
        assert_eq!(start, "2026-10-25T02:30:00+02:00[Europe/Berlin]");
        assert_eq!(end, "2026-10-25T02:50:00+02:00[Europe/Berlin]");
        assert_eq!(
            open(&nightly, "2026-10-25T01:40:00Z"),
            None,
            "the second 02:30 (CET) opens nothing"
        );
        assert_eq!(
            nightly
                .next_start(at("2026-10-25T00:31:00Z"))
                .unwrap()
                .to_string(),
            "2026-10-26T02:30:00+01:00[Europe/Berlin]"
        );
    }

    #[test]
    fn the_cap_counts_starts_in_the_open_window_only() {
        let capped = windows(&[("0 2 * * *", "2h", None)], Some(2));
        let now = at("2026-11-30T02:30:00Z");
        let record = capped.record(None, 1, now).unwrap();
        assert_eq!(record.disruptions_started, 1);
        assert!(matches!(
            capped.gate(Some(&record), now),
            Gate::Open { left: Some(1), .. }
        ));
        let record = capped.record(Some(&record), 1, now).unwrap();
        assert!(matches!(
            capped.gate(Some(&record), now),
            Gate::Open { left: Some(0), .. }
        ));
        // The next night's window starts from 0 with yesterday's record in the status.
        let tomorrow = at("2026-12-01T02:10:00Z");
        assert!(matches!(
            capped.gate(Some(&record), tomorrow),
            Gate::Open { left: Some(2), .. }
        ));
        match capped.gate(Some(&record), at("2026-11-30T04:00:00Z")) {
            Gate::Closed { next } => {
                assert_eq!(next.unwrap().timestamp(), at("2026-12-01T02:00:00Z"));
            }
            open @ Gate::Open { .. } => panic!("closed at the window's end, got {open:?}"),
        }
        assert_eq!(
            capped.next_change(now),
            Some(at("2026-11-30T04:00:00Z")),
            "an open window changes at its end"
        );
    }

    #[test]
    fn of_overlapping_windows_the_one_ending_last_counts() {
        let both = windows(
            &[("0 1 * * *", "2h", None), ("0 2 * * *", "3h", None)],
            None,
        );
        assert_eq!(
            open(&both, "2026-11-30T02:30:00Z").unwrap().1,
            "2026-11-30T05:00:00+00:00[UTC]"
        );
    }

    #[test]
    fn bad_windows_name_the_field_and_the_fix() {
        let cases = [
            (
                spec(&[("0 2 * *", "1h", None)], None),
                "spec.windows[0].schedule: \"0 2 * *\"",
            ),
            (spec(&[("0 2 * * * *", "1h", None)], None), "five fields"),
            (spec(&[("0 2 30 2 *", "1h", None)], None), "opens no window"),
            (
                spec(&[("0 2 * * *", "3 hours", None)], None),
                "spec.windows[0].duration: \"3 hours\"",
            ),
            (spec(&[("0 2 * * *", "0s", None)], None), "above 0"),
            (
                spec(
                    &[
                        ("0 2 * * *", "1h", None),
                        ("0 3 * * *", "1h", Some("Europe/Berln")),
                    ],
                    None,
                ),
                "spec.windows[1].timeZone: \"Europe/Berln\" is not an IANA time zone",
            ),
            (spec(&[], Some(1)), "spec.maxPerWindow needs spec.windows"),
            (
                spec(&[("0 2 * * *", "1h", None)], Some(-1)),
                "spec.maxPerWindow: -1",
            ),
        ];
        for (spec, expected) in cases {
            let error = Windows::of(&spec, at("2026-11-30T00:00:00Z"))
                .unwrap_err()
                .to_string();
            assert!(error.contains(expected), "{error}");
        }
        assert!(
            Windows::of(&spec(&[], None), at("2026-11-30T00:00:00Z"))
                .unwrap()
                .is_none()
        );
    }
}
