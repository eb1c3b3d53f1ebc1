//! The shutdown settings: a YAML file with KubeletConfiguration's field names, overridden
//! field by field by flags, validated into a [`ShutdownPlan`].

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use nodegrace_core::config_file::{ConfigFileError, parse_yaml, read_yaml};
use nodegrace_core::duration::parse_go_duration;
use serde::Deserialize;

use crate::plan::{PriorityGroup, ShutdownPlan};

/// One entry of `shutdownGracePeriodByPodPriority`, as in KubeletConfiguration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PriorityPeriod {
    pub priority: i32,
    pub shutdown_grace_period_seconds: i64,
}

/// The settings as written, before validation. Field names match KubeletConfiguration, so the
/// lines can be copied from a kubelet config (its `apiVersion` and `kind` are ignored).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ShutdownSettings {
    pub shutdown_grace_period: Option<String>,
    pub shutdown_grace_period_critical_pods: Option<String>,
    pub shutdown_grace_period_by_pod_priority: Option<Vec<PriorityPeriod>>,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(transparent)]
    File(#[from] ConfigFileError),
    #[error("{field}: {problem}")]
    Invalid { field: String, problem: String },
}

fn invalid(field: impl Into<String>, problem: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        field: field.into(),
        problem: problem.into(),
    }
}

impl ShutdownSettings {
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        Ok(read_yaml(path)?)
    }

    pub fn from_yaml(text: &str) -> Result<Self, serde_yaml_ng::Error> {
        parse_yaml(text)
    }

    /// Values set in `overrides` (flags) win over the file's, one field at a time.
    #[must_use]
    pub fn overridden_by(self, overrides: Self) -> Self {
        Self {
            shutdown_grace_period: overrides
                .shutdown_grace_period
                .or(self.shutdown_grace_period),
            shutdown_grace_period_critical_pods: overrides
                .shutdown_grace_period_critical_pods
                .or(self.shutdown_grace_period_critical_pods),
            shutdown_grace_period_by_pod_priority: overrides
                .shutdown_grace_period_by_pod_priority
                .or(self.shutdown_grace_period_by_pod_priority),
        }
    }

    /// Builds settings from flag values (`None` = flag not given).
    pub fn from_flags(
        total: Option<String>,
        critical: Option<String>,
        by_priority: Option<Vec<PriorityPeriod>>,
    ) -> Self {
        Self {
            shutdown_grace_period: total,
            shutdown_grace_period_critical_pods: critical,
            shutdown_grace_period_by_pod_priority: by_priority,
        }
    }

    /// Checks the settings and turns them into the groups to run, as the kubelet would.
    pub fn plan(&self) -> Result<ShutdownPlan, ConfigError> {
        let total = duration_field("shutdownGracePeriod", self.shutdown_grace_period.as_deref())?;
        let critical = duration_field(
            "shutdownGracePeriodCriticalPods",
            self.shutdown_grace_period_critical_pods.as_deref(),
        )?;
        let by_priority = self
            .shutdown_grace_period_by_pod_priority
            .as_deref()
            .unwrap_or_default();
        let legacy_used = !total.is_zero() || !critical.is_zero();
        if legacy_used && !by_priority.is_empty() {
            return Err(invalid(
                "shutdownGracePeriodByPodPriority",
                "cannot be combined with shutdownGracePeriod/shutdownGracePeriodCriticalPods; \
                 use either the priority list or the pair, as in KubeletConfiguration",
            ));
        }
        if !by_priority.is_empty() {
            return priority_plan(by_priority);
        }
        if critical > total {
            return Err(invalid(
                "shutdownGracePeriodCriticalPods",
                format!(
                    "{critical:?} is longer than shutdownGracePeriod ({total:?}); the critical \
                     pods' time is part of the total, so it must not exceed it"
                ),
            ));
        }
        Ok(ShutdownPlan::from_legacy(total, critical))
    }
}

fn duration_field(field: &str, value: Option<&str>) -> Result<Duration, ConfigError> {
    value.map_or(Ok(Duration::ZERO), |text| {
        parse_go_duration(text).map_err(|error| invalid(field, error.to_string()))
    })
}

fn priority_plan(entries: &[PriorityPeriod]) -> Result<ShutdownPlan, ConfigError> {
    let mut seen = BTreeSet::new();
    let mut groups = Vec::with_capacity(entries.len());
    for (index, entry) in entries.iter().enumerate() {
        let field = format!("shutdownGracePeriodByPodPriority[{index}]");
        if !seen.insert(entry.priority) {
            return Err(invalid(
                format!("{field}.priority"),
                format!(
                    "priority {} appears more than once; give each priority one period",
                    entry.priority
                ),
            ));
        }
        let seconds = u64::try_from(entry.shutdown_grace_period_seconds).map_err(|_| {
            invalid(
                format!("{field}.shutdownGracePeriodSeconds"),
                format!(
                    "{} is negative; use 0 or more seconds",
                    entry.shutdown_grace_period_seconds
                ),
            )
        })?;
        groups.push(PriorityGroup {
            priority: entry.priority,
            period: Duration::from_secs(seconds),
        });
    }
    Ok(ShutdownPlan::new(groups))
}

/// Parses the flag form of the priority list: `PRIORITY=SECONDS,…`, e.g. `0=10,100000=20`.
pub fn parse_priority_flag(text: &str) -> Result<Vec<PriorityPeriod>, String> {
    text.split(',')
        .filter(|item| !item.trim().is_empty())
        .map(|item| {
            let (priority, seconds) = item.split_once('=').ok_or_else(|| {
                format!("{item:?} is not PRIORITY=SECONDS (example: 0=10,2000000000=20)")
            })?;
            Ok(PriorityPeriod {
                priority: priority
                    .trim()
                    .parse()
                    .map_err(|_| format!("{priority:?} is not a priority (a 32-bit integer)"))?,
                shutdown_grace_period_seconds: seconds
                    .trim()
                    .parse()
                    .map_err(|_| format!("{seconds:?} is not a number of seconds"))?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::SYSTEM_CRITICAL_PRIORITY;

    fn plan(yaml: &str) -> Result<ShutdownPlan, ConfigError> {
        ShutdownSettings::from_yaml(yaml).unwrap().plan()
    }

    fn error(yaml: &str) -> String {
        plan(yaml).unwrap_err().to_string()
    }

    #[test]
    fn legacy_pair_from_a_kubelet_config() {
        let plan = plan(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
             shutdownGracePeriod: 1m\nshutdownGracePeriodCriticalPods: 20s\n",
        )
        .unwrap();
        assert_eq!(plan.total(), Duration::from_secs(60));
        assert_eq!(plan.groups()[0].period, Duration::from_secs(40));
        assert_eq!(plan.groups()[1].priority, SYSTEM_CRITICAL_PRIORITY);
    }

    #[test]
    fn priority_list() {
        let plan = plan(
            "shutdownGracePeriodByPodPriority:\n\
             - {priority: 100000, shutdownGracePeriodSeconds: 10}\n\
             - {priority: 0, shutdownGracePeriodSeconds: 20}\n",
        )
        .unwrap();
        assert_eq!(plan.groups()[0].priority, 0);
        assert_eq!(plan.total(), Duration::from_secs(30));
    }

    #[test]
    fn empty_or_zero_means_disabled_not_an_error() {
        assert!(plan("").unwrap().is_disabled());
        assert!(plan("shutdownGracePeriod: 0s\n").unwrap().is_disabled());
        assert!(
            plan("shutdownGracePeriodByPodPriority: []\n")
                .unwrap()
                .is_disabled()
        );
    }

    #[test]
    fn errors_name_the_field() {
        let both = error(
            "shutdownGracePeriod: 30s\nshutdownGracePeriodByPodPriority:\n\
             - {priority: 0, shutdownGracePeriodSeconds: 5}\n",
        );
        assert!(
            both.contains("shutdownGracePeriodByPodPriority")
                && both.contains("shutdownGracePeriod/"),
            "{both}"
        );
        let critical = error("shutdownGracePeriod: 10s\nshutdownGracePeriodCriticalPods: 20s\n");
        assert!(
            critical.starts_with("shutdownGracePeriodCriticalPods:"),
            "{critical}"
        );
        let negative = error("shutdownGracePeriod: -10s\n");
        assert!(
            negative.starts_with("shutdownGracePeriod:") && negative.contains("negative"),
            "{negative}"
        );
        let malformed = error("shutdownGracePeriod: ten seconds\n");
        assert!(
            malformed.starts_with("shutdownGracePeriod:") && malformed.contains("30s"),
            "{malformed}"
        );
        let duplicate = error(
            "shutdownGracePeriodByPodPriority:\n- {priority: 5, shutdownGracePeriodSeconds: 1}\n\
             - {priority: 5, shutdownGracePeriodSeconds: 2}\n",
        );
        assert!(
            duplicate.starts_with("shutdownGracePeriodByPodPriority[1].priority:"),
            "{duplicate}"
        );
        let negative_seconds = error(
            "shutdownGracePeriodByPodPriority:\n- {priority: 5, shutdownGracePeriodSeconds: -1}\n",
        );
        assert!(
            negative_seconds
                .starts_with("shutdownGracePeriodByPodPriority[0].shutdownGracePeriodSeconds:")
        );
    }

    #[test]
    fn unknown_fields_are_typos_and_rejected() {
        let typo = ShutdownSettings::from_yaml("shutdownGracePeriode: 30s\n").unwrap_err();
        assert!(typo.to_string().contains("shutdownGracePeriode"), "{typo}");
    }

    #[test]
    fn flags_override_the_file_field_by_field() {
        let file = ShutdownSettings::from_yaml(
            "shutdownGracePeriod: 30s\nshutdownGracePeriodCriticalPods: 10s\n",
        )
        .unwrap();
        let flags = ShutdownSettings::from_flags(Some("60s".to_owned()), None, None);
        let plan = file.overridden_by(flags).plan().unwrap();
        assert_eq!(plan.total(), Duration::from_secs(60));
        assert_eq!(plan.groups()[1].period, Duration::from_secs(10));
    }

    #[test]
    fn priority_flag_syntax() {
        assert_eq!(
            parse_priority_flag("0=10, 2000000000=20").unwrap(),
            vec![
                PriorityPeriod {
                    priority: 0,
                    shutdown_grace_period_seconds: 10
                },
                PriorityPeriod {
                    priority: 2_000_000_000,
                    shutdown_grace_period_seconds: 20
                },
            ]
        );
        assert!(
            parse_priority_flag("0:10")
                .unwrap_err()
                .contains("PRIORITY=SECONDS")
        );
        assert!(
            parse_priority_flag("x=10")
                .unwrap_err()
                .contains("priority")
        );
    }
}
