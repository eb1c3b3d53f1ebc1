//! Toleration matching with Kubernetes' exact semantics (`Toleration.ToleratesTaint` in
//! k8s.io/api/core/v1).

use std::time::Duration;

use k8s_openapi::api::core::v1::{Taint, Toleration};

/// Whether `toleration` tolerates `taint`:
/// - an empty effect matches every effect;
/// - an empty key with operator `Exists` matches every taint;
/// - `Exists` matches any value; `Equal` (also the default, empty operator) needs equal values.
pub fn tolerates(toleration: &Toleration, taint: &Taint) -> bool {
    let effect = toleration.effect.as_deref().unwrap_or_default();
    if !effect.is_empty() && effect != taint.effect {
        return false;
    }
    let key = toleration.key.as_deref().unwrap_or_default();
    if !key.is_empty() && key != taint.key {
        return false;
    }
    match toleration.operator.as_deref().unwrap_or_default() {
        "Exists" => true,
        // API validation rejects an empty key with Equal, so that case never reaches here.
        "" | "Equal" => {
            toleration.value.as_deref().unwrap_or_default()
                == taint.value.as_deref().unwrap_or_default()
        }
        _ => false,
    }
}

/// Whether any of `tolerations` tolerates `taint`.
pub fn tolerated(tolerations: &[Toleration], taint: &Taint) -> bool {
    tolerations
        .iter()
        .any(|toleration| tolerates(toleration, taint))
}

/// The taints among `taints` that no toleration tolerates.
pub fn untolerated<'a>(tolerations: &[Toleration], taints: &'a [Taint]) -> Vec<&'a Taint> {
    taints
        .iter()
        .filter(|taint| !tolerated(tolerations, taint))
        .collect()
}

/// How long a pod may stay on a node with a NoExecute `taint`: `None` if it is not tolerated
/// (evict now), `Some(None)` if tolerated forever, else the shortest matching
/// `tolerationSeconds` (negative counts as zero, as in the taint manager).
pub fn toleration_time(tolerations: &[Toleration], taint: &Taint) -> Option<Option<Duration>> {
    let matching: Vec<&Toleration> = tolerations
        .iter()
        .filter(|toleration| tolerates(toleration, taint))
        .collect();
    if matching.is_empty() {
        return None;
    }
    let seconds = matching
        .iter()
        .filter_map(|toleration| toleration.toleration_seconds)
        .min();
    Some(seconds.map(|seconds| Duration::from_secs(u64::try_from(seconds).unwrap_or(0))))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toleration(key: &str, operator: &str, value: &str, effect: &str) -> Toleration {
        let some = |s: &str| (!s.is_empty()).then(|| s.to_owned());
        Toleration {
            key: some(key),
            operator: some(operator),
            value: some(value),
            effect: some(effect),
            toleration_seconds: None,
        }
    }

    fn taint(key: &str, value: &str, effect: &str) -> Taint {
        Taint {
            key: key.to_owned(),
            value: (!value.is_empty()).then(|| value.to_owned()),
            effect: effect.to_owned(),
            time_added: None,
        }
    }

    #[test]
    fn matches_the_upstream_table() {
        // The cases of k8s.io/api/core/v1 TestTolerationToleratesTaint.
        let cases = [
            (
                "empty effect matches all",
                toleration("foo", "Exists", "", ""),
                taint("foo", "", "NoExecute"),
                true,
            ),
            (
                "effects differ",
                toleration("foo", "Exists", "", "NoSchedule"),
                taint("foo", "", "NoExecute"),
                false,
            ),
            (
                "keys differ",
                toleration("foo", "Exists", "", "NoSchedule"),
                taint("bar", "", "NoSchedule"),
                false,
            ),
            (
                "Exists ignores value",
                toleration("foo", "Exists", "", "NoSchedule"),
                taint("foo", "bar", "NoSchedule"),
                true,
            ),
            (
                "Equal same value",
                toleration("foo", "Equal", "bar", "NoSchedule"),
                taint("foo", "bar", "NoSchedule"),
                true,
            ),
            (
                "Equal other value",
                toleration("foo", "Equal", "bar", "NoSchedule"),
                taint("foo", "baz", "NoSchedule"),
                false,
            ),
            (
                "empty operator is Equal",
                toleration("foo", "", "bar", "NoSchedule"),
                taint("foo", "bar", "NoSchedule"),
                true,
            ),
            (
                "empty key Exists matches all",
                toleration("", "Exists", "", ""),
                taint("anything", "v", "NoExecute"),
                true,
            ),
            (
                "empty key Exists with effect",
                toleration("", "Exists", "", "NoSchedule"),
                taint("anything", "", "NoExecute"),
                false,
            ),
            (
                "Equal without values",
                toleration("foo", "Equal", "", ""),
                taint("foo", "", "NoSchedule"),
                true,
            ),
            (
                "unknown operator",
                toleration("foo", "Gt", "1", ""),
                taint("foo", "1", "NoSchedule"),
                false,
            ),
        ];
        for (name, toleration, taint, expected) in cases {
            assert_eq!(tolerates(&toleration, &taint), expected, "{name}");
        }
    }

    #[test]
    fn finds_untolerated_taints() {
        let taints = [taint("a", "", "NoSchedule"), taint("b", "", "NoExecute")];
        let tolerations = [toleration("a", "Exists", "", "")];
        let left: Vec<_> = untolerated(&tolerations, &taints)
            .iter()
            .map(|t| t.key.as_str())
            .collect();
        assert_eq!(left, vec!["b"]);
        assert!(untolerated(&[toleration("", "Exists", "", "")], &taints).is_empty());
    }

    #[test]
    fn toleration_seconds_takes_the_shortest_match() {
        let taint = taint("node.kubernetes.io/unreachable", "", "NoExecute");
        let with_seconds = |seconds| Toleration {
            toleration_seconds: Some(seconds),
            ..toleration("node.kubernetes.io/unreachable", "Exists", "", "NoExecute")
        };
        assert_eq!(toleration_time(&[], &taint), None);
        assert_eq!(
            toleration_time(&[toleration("", "Exists", "", "")], &taint),
            Some(None)
        );
        assert_eq!(
            toleration_time(&[with_seconds(300), with_seconds(60)], &taint),
            Some(Some(Duration::from_secs(60)))
        );
        assert_eq!(
            toleration_time(&[with_seconds(-5)], &taint),
            Some(Some(Duration::ZERO))
        );
    }
}
