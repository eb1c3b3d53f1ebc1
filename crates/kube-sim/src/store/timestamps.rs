//! Time fields as the API server stores them. Built-in kinds decode into Go structs, so a
//! `metav1.Time` written with fractions comes back in whole seconds (it serialises as RFC 3339,
//! UTC, truncated: apimachinery/pkg/apis/meta/v1/time.go), and a `metav1.MicroTime` must be
//! written with exactly six fractional digits (it parses with RFC3339Micro:
//! micro_time.go). A value that does not parse fails decoding, which the handlers answer with
//! 400 "… cannot be handled as a …" (handlers/rest.go, transformDecodeError).

use jiff::Timestamp;
use serde_json::Value;

use crate::error::ApiError;
use crate::resources::ResourceType;

/// Now, as a `metav1.Time` serialises (whole seconds, truncated).
pub fn now_rfc3339() -> String {
    format_time(Timestamp::now())
}

/// Field names whose values are `metav1.MicroTime` in the kinds we serve.
const MICRO_TIME_FIELDS: &[&str] = &["acquireTime", "renewTime", "eventTime", "lastObservedTime"];

/// Field names whose values are `metav1.Time` in the kinds we serve.
const TIME_FIELDS: &[&str] = &[
    "creationTimestamp",
    "deletionTimestamp",
    "lastTransitionTime",
    "lastHeartbeatTime",
    "lastProbeTime",
    "lastUpdateTime",
    "startTime",
    "startedAt",
    "finishedAt",
    "timeAdded",
    "firstTimestamp",
    "lastTimestamp",
    "completionTime",
    "heartbeatTime",
    "expectedCompletionTime",
    "lastScheduleTime",
    "lastSuccessfulTime",
    "expirationTimestamp",
    "time",
];

/// Maps whose keys and values are the user's, never decoded as times.
const OPAQUE_MAPS: &[&str] = &["labels", "annotations", "data", "binaryData", "stringData"];

/// Whole seconds, UTC: how `metav1.Time` serialises.
pub fn format_time(time: Timestamp) -> String {
    let seconds = Timestamp::from_second(time.as_second()).unwrap_or(time);
    seconds.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// Microseconds, UTC: how `metav1.MicroTime` serialises.
pub fn format_micro_time(time: Timestamp) -> String {
    time.strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()
}

/// Rewrites the time fields of a built-in object as the API server would store them.
pub fn normalize(kind: &ResourceType, object: &mut Value) -> Result<(), ApiError> {
    if kind.custom {
        return Ok(());
    }
    walk(object).map_err(|why| {
        ApiError::bad_request(format!(
            "{kind} in version \"{version}\" cannot be handled as a {kind}: {why}",
            kind = kind.kind,
            version = kind.version
        ))
    })
}

fn walk(value: &mut Value) -> Result<(), String> {
    match value {
        Value::Object(map) => {
            for (key, child) in map.iter_mut() {
                if OPAQUE_MAPS.contains(&key.as_str()) {
                    continue;
                }
                if let Value::String(text) = child {
                    if MICRO_TIME_FIELDS.contains(&key.as_str()) {
                        *text = format_micro_time(parse_micro_time(text)?);
                    } else if TIME_FIELDS.contains(&key.as_str()) {
                        *text = format_time(parse_time(text)?);
                    }
                    continue;
                }
                if key == "disruptedPods"
                    && let Value::Object(pods) = child
                {
                    for time in pods.values_mut() {
                        if let Value::String(text) = time {
                            *text = format_time(parse_time(text)?);
                        }
                    }
                    continue;
                }
                walk(child)?;
            }
            Ok(())
        }
        Value::Array(items) => items.iter_mut().try_for_each(walk),
        _ => Ok(()),
    }
}

fn cannot_parse(text: &str, layout: &str) -> String {
    format!("parsing time \"{text}\" as \"{layout}\": cannot parse \"{text}\" as \"{layout}\"")
}

/// RFC 3339 with optional fractions, as Go's `time.Parse(time.RFC3339, …)` accepts.
fn parse_time(text: &str) -> Result<Timestamp, String> {
    text.parse::<Timestamp>()
        .map_err(|_| cannot_parse(text, "2006-01-02T15:04:05Z07:00"))
}

/// `time.Parse("2006-01-02T15:04:05.000000Z07:00", …)`: exactly six fractional digits.
fn parse_micro_time(text: &str) -> Result<Timestamp, String> {
    const LAYOUT: &str = "2006-01-02T15:04:05.000000Z07:00";
    let fraction = text
        .get(19..)
        .and_then(|rest| rest.strip_prefix('.'))
        .map(|rest| rest.bytes().take_while(u8::is_ascii_digit).count());
    if fraction != Some(6) {
        return Err(cannot_parse(text, LAYOUT));
    }
    text.parse::<Timestamp>()
        .map_err(|_| cannot_parse(text, LAYOUT))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::Registry;
    use serde_json::json;

    fn kind(group: &str, plural: &str) -> std::sync::Arc<ResourceType> {
        Registry::default().find_any_version(group, plural).unwrap()
    }

    #[test]
    fn times_are_truncated_to_seconds_in_utc() {
        let mut pod = json!({"status": {"conditions": [{"type": "Ready", "lastTransitionTime": "2026-01-02T03:04:05.987654+01:00"}]}, "metadata": {"annotations": {"startTime": "not a time"}}});
        normalize(&kind("", "pods"), &mut pod).unwrap();
        assert_eq!(
            pod["status"]["conditions"][0]["lastTransitionTime"],
            "2026-01-02T02:04:05Z"
        );
        assert_eq!(pod["metadata"]["annotations"]["startTime"], "not a time");
    }

    #[test]
    fn micro_times_need_six_fractional_digits() {
        let leases = kind("coordination.k8s.io", "leases");
        let mut good = json!({"spec": {"renewTime": "2026-01-02T03:04:05.123456Z"}});
        normalize(&leases, &mut good).unwrap();
        assert_eq!(good["spec"]["renewTime"], "2026-01-02T03:04:05.123456Z");
        for bad in [
            "2026-01-02T03:04:05Z",
            "2026-01-02T03:04:05.123Z",
            "2026-01-02T03:04:05.1234567Z",
        ] {
            let mut lease = json!({"spec": {"renewTime": bad}});
            let error = normalize(&leases, &mut lease).unwrap_err();
            assert_eq!(error.code, 400, "{bad}");
            assert!(
                error.message.starts_with(
                    "Lease in version \"v1\" cannot be handled as a Lease: parsing time"
                ),
                "{}",
                error.message
            );
        }
    }
}
