//! Durations as Kubernetes configuration spells them (Go's `time.ParseDuration`: `30s`, `1m30s`,
//! `1.5h`, `500ms`), so values can be copied from a KubeletConfiguration unchanged.

use std::time::Duration;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error("invalid duration {0:?}: expected a number with a unit, such as 30s, 2m or 1h30m")]
    Malformed(String),
    #[error("invalid duration {0:?}: must not be negative")]
    Negative(String),
    #[error("invalid duration {0:?}: unknown unit {1:?} (use ns, us, ms, s, m or h)")]
    UnknownUnit(String, String),
}

/// Parses a Go duration string. Negative values are an error: no nodegrace setting means
/// anything by a negative time.
pub fn parse_go_duration(text: &str) -> Result<Duration, DurationError> {
    let malformed = || DurationError::Malformed(text.to_owned());
    let trimmed = text.trim();
    let (negative, mut rest) = match trimmed.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, trimmed.strip_prefix('+').unwrap_or(trimmed)),
    };
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    if rest.is_empty() {
        return Err(malformed());
    }
    let mut total = 0f64;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(malformed)?;
        let number: f64 = rest[..number_len].parse().map_err(|_| malformed())?;
        rest = &rest[number_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let seconds_per_unit = match unit {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            "" => return Err(malformed()),
            other => {
                return Err(DurationError::UnknownUnit(
                    text.to_owned(),
                    other.to_owned(),
                ));
            }
        };
        total += number * seconds_per_unit;
    }
    if negative && total > 0.0 {
        return Err(DurationError::Negative(text.to_owned()));
    }
    Duration::try_from_secs_f64(total).map_err(|_| malformed())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_what_go_accepts() {
        let cases = [
            ("30s", Duration::from_secs(30)),
            ("0", Duration::ZERO),
            ("0s", Duration::ZERO),
            ("1m30s", Duration::from_secs(90)),
            ("1.5h", Duration::from_secs(5400)),
            ("500ms", Duration::from_millis(500)),
            ("2h45m", Duration::from_secs(9900)),
            ("10us", Duration::from_micros(10)),
            ("+5s", Duration::from_secs(5)),
        ];
        for (text, expected) in cases {
            assert_eq!(parse_go_duration(text), Ok(expected), "{text}");
        }
    }

    #[test]
    fn rejects_malformed_and_negative_values_with_the_reason() {
        assert!(matches!(
            parse_go_duration("30"),
            Err(DurationError::Malformed(_))
        ));
        assert!(matches!(
            parse_go_duration(""),
            Err(DurationError::Malformed(_))
        ));
        assert!(matches!(
            parse_go_duration("s"),
            Err(DurationError::Malformed(_))
        ));
        assert!(matches!(
            parse_go_duration("1..5s"),
            Err(DurationError::Malformed(_))
        ));
        assert!(matches!(
            parse_go_duration("-5s"),
            Err(DurationError::Negative(_))
        ));
        assert!(matches!(
            parse_go_duration("3d"),
            Err(DurationError::UnknownUnit(_, unit)) if unit == "d"
        ));
    }
}
