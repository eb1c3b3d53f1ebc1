//! What an operator reads on a node that waits: why a budget holds a pod, grouped into a few
//! lines such as "Pods web-1, web-2: PDB shop/web needs 3 healthy and has 3".

use std::collections::BTreeMap;
use std::fmt::Write as _;

use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// Lines in a condition message before the rest is counted instead of listed.
pub const MAX_LINES: usize = 4;
/// Pods named on one line before the rest is counted.
pub const MAX_PODS_PER_LINE: usize = 3;

/// Why a budget lets no pod go, as far as its status tells.
pub fn budget_blocks(pdb: &PodDisruptionBudget) -> String {
    let name = format!(
        "PDB {}/{}",
        pdb.metadata.namespace.as_deref().unwrap_or_default(),
        pdb.metadata.name.as_deref().unwrap_or_default()
    );
    let Some(status) = pdb.status.as_ref() else {
        return format!("{name} has no status yet");
    };
    if status.observed_generation < pdb.metadata.generation {
        return format!(
            "{name} has a status older than its spec (the disruption controller is behind)"
        );
    }
    let (healthy, desired, expected) = (
        status.current_healthy.unwrap_or(0),
        status.desired_healthy.unwrap_or(0),
        status.expected_pods.unwrap_or(0),
    );
    if let Some(never) = never_allows(pdb) {
        return format!("{name} can never allow a disruption: {never}");
    }
    if healthy < desired {
        return format!(
            "{name} needs {desired} healthy and has {healthy} (of {expected}): its pods are not ready"
        );
    }
    let allowed = status.disruptions_allowed.unwrap_or(0);
    if allowed > 0 {
        return format!("{name} allows {allowed} disruption(s) now");
    }
    format!("{name} needs {desired} healthy and has {healthy}")
}

/// Why `pdb` can never allow a disruption, whatever its pods do: `maxUnavailable` 0, or it
/// needs as many healthy pods as it expects. `None` when it can.
pub fn never_allows(pdb: &PodDisruptionBudget) -> Option<String> {
    let zero_unavailable = pdb
        .spec
        .as_ref()
        .and_then(|spec| spec.max_unavailable.as_ref())
        .is_some_and(|max| {
            matches!(max, IntOrString::Int(0)) || max == &IntOrString::String("0%".into())
        });
    if zero_unavailable {
        return Some("maxUnavailable is 0".to_owned());
    }
    let status = pdb.status.as_ref()?;
    let (desired, expected) = (
        status.desired_healthy.unwrap_or(0),
        status.expected_pods.unwrap_or(0),
    );
    (expected > 0 && desired >= expected)
        .then(|| format!("it needs {desired} healthy of {expected} expected pods"))
}

/// Groups `(pod, reason)` pairs into at most [`MAX_LINES`] lines, one per reason.
pub fn grouped(pairs: impl IntoIterator<Item = (String, String)>) -> String {
    let mut by_reason: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (pod, reason) in pairs {
        by_reason.entry(reason).or_default().push(pod);
    }
    let total = by_reason.len();
    let mut lines: Vec<String> = by_reason
        .into_iter()
        .take(MAX_LINES)
        .map(|(reason, mut pods)| {
            pods.sort();
            let more = pods.len().saturating_sub(MAX_PODS_PER_LINE);
            let noun = if pods.len() == 1 { "Pod" } else { "Pods" };
            let mut named = pods
                .into_iter()
                .take(MAX_PODS_PER_LINE)
                .collect::<Vec<_>>()
                .join(", ");
            if more > 0 {
                let _ = write!(named, " and {more} more");
            }
            format!("{noun} {named}: {reason}")
        })
        .collect();
    if total > MAX_LINES {
        lines.push(format!("… and {} more reasons", total - MAX_LINES));
    }
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pdb(spec: &serde_json::Value, status: &serde_json::Value) -> PodDisruptionBudget {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "shop", "generation": 1},
            "spec": spec,
            "status": status,
        }))
        .unwrap()
    }

    fn status(healthy: i32, desired: i32, expected: i32, allowed: i32) -> serde_json::Value {
        json!({"observedGeneration": 1, "currentHealthy": healthy, "desiredHealthy": desired,
               "expectedPods": expected, "disruptionsAllowed": allowed})
    }

    #[test]
    fn budgets_explain_themselves() {
        let min = json!({"minAvailable": 3});
        let cases = [
            (
                min.clone(),
                status(3, 3, 3, 0),
                "PDB shop/web can never allow a disruption: it needs 3 healthy of 3 expected pods",
            ),
            (
                json!({"maxUnavailable": 0}),
                status(3, 3, 3, 0),
                "PDB shop/web can never allow a disruption: maxUnavailable is 0",
            ),
            (
                min.clone(),
                status(2, 3, 4, 0),
                "PDB shop/web needs 3 healthy and has 2 (of 4): its pods are not ready",
            ),
            (
                json!({"maxUnavailable": 1}),
                status(2, 2, 3, 0),
                "PDB shop/web needs 2 healthy and has 2",
            ),
            (
                min.clone(),
                json!({"observedGeneration": 0}),
                "PDB shop/web has a status older than its spec (the disruption controller is behind)",
            ),
        ];
        for (spec, status, expected) in cases {
            assert_eq!(budget_blocks(&pdb(&spec, &status)), expected);
        }
    }

    #[test]
    fn blockers_are_grouped_by_reason_in_a_few_lines() {
        let pairs = [("web-2", "PDB a"), ("web-1", "PDB a"), ("db-0", "PDB b")]
            .map(|(pod, reason)| (pod.to_owned(), reason.to_owned()));
        assert_eq!(grouped(pairs), "Pods web-1, web-2: PDB a\nPod db-0: PDB b");
        let many = (0..5).map(|i| (format!("p{i}"), "same".to_owned()));
        assert_eq!(grouped(many), "Pods p0, p1, p2 and 2 more: same");
        let reasons = (0..6).map(|i| ("p".to_owned(), format!("r{i}")));
        let text = grouped(reasons);
        assert_eq!(text.lines().count(), MAX_LINES + 1);
        assert!(text.ends_with("… and 2 more reasons"), "{text}");
    }
}
