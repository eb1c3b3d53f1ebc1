//! The commands the plugin suggests. Each changes only what was read: a JSON patch whose first
//! operation tests the value the answer was based on, so a budget or Lease changed in between
//! makes the command fail instead of acting on a view that is no longer true.

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// One more disruption from a budget bounded in counts: `minAvailable` N → N−1 (N > 0), else
/// `maxUnavailable` N → N+1, as (field, from, to). `None` for percentages.
pub fn widened(
    min_available: Option<&IntOrString>,
    max_unavailable: Option<&IntOrString>,
) -> Option<(&'static str, i32, i32)> {
    match (min_available, max_unavailable) {
        (Some(IntOrString::Int(min)), _) if *min > 0 => Some(("minAvailable", *min, min - 1)),
        (None, Some(IntOrString::Int(max))) => Some(("maxUnavailable", *max, max + 1)),
        _ => None,
    }
}

/// `kubectl patch RESOURCE NAME [-n NS] --type=json -p '[test, replace]'` for `spec.<field>`.
pub fn guarded_patch(
    resource: &str,
    name: &str,
    namespace: Option<&str>,
    (field, from, to): (&str, i32, i32),
) -> String {
    let namespace = namespace.map(|ns| format!(" -n {ns}")).unwrap_or_default();
    format!(
        "kubectl patch {resource} {name}{namespace} --type=json -p \
         '[{{\"op\":\"test\",\"path\":\"/spec/{field}\",\"value\":{from}}},\
         {{\"op\":\"replace\",\"path\":\"/spec/{field}\",\"value\":{to}}}]'"
    )
}

/// Releases Lease `namespace/name` if `holder` still holds it: its holder is removed, which
/// every reader of the Lease takes as free.
pub fn release_lease(name: &str, namespace: &str, holder: &str) -> String {
    let holder = serde_json::Value::from(holder)
        .to_string()
        .replace('\'', "'\\''");
    format!(
        "kubectl patch lease {name} -n {namespace} --type=json -p \
         '[{{\"op\":\"test\",\"path\":\"/spec/holderIdentity\",\"value\":{holder}}},\
         {{\"op\":\"remove\",\"path\":\"/spec/holderIdentity\"}}]'"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_widen_by_one_and_percentages_do_not() {
        let int = IntOrString::Int;
        assert_eq!(widened(Some(&int(3)), None), Some(("minAvailable", 3, 2)));
        assert_eq!(widened(None, Some(&int(0))), Some(("maxUnavailable", 0, 1)));
        assert_eq!(widened(Some(&int(0)), None), None);
        assert_eq!(
            widened(Some(&IntOrString::String("50%".into())), None),
            None
        );
    }

    #[test]
    fn a_holder_with_a_quote_stays_one_shell_word() {
        assert_eq!(
            release_lease("n1", "team-a", "it's"),
            r#"kubectl patch lease n1 -n team-a --type=json -p '[{"op":"test","path":"/spec/holderIdentity","value":"it'\''s"},{"op":"remove","path":"/spec/holderIdentity"}]'"#
        );
    }
}
