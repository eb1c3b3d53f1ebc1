//! The agent's config file: KubeletConfiguration's field name for the one setting the KEP gives
//! it, so the line can be copied from a kubelet config. The flag overrides the file.

use std::path::Path;
use std::time::Duration;

use nodegrace_core::config_file::{ConfigFileError, read_yaml};
use nodegrace_core::duration::parse_go_duration;
use serde::Deserialize;

/// The file as written (a kubelet config's `apiVersion` and `kind` are ignored).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct InhibitorConfig {
    shutdown_inhibitor_alert_timeout: Option<String>,
}

/// The alert timeout in force: the flag if given, else the file's field, else 0 (off).
pub fn alert_timeout(
    file: Option<&Path>,
    flag: Option<Duration>,
) -> Result<Duration, ConfigFileError> {
    if let Some(timeout) = flag {
        return Ok(timeout);
    }
    let Some(path) = file else {
        return Ok(Duration::ZERO);
    };
    let config: InhibitorConfig = read_yaml(path)?;
    config
        .shutdown_inhibitor_alert_timeout
        .map_or(Ok(Duration::ZERO), |text| {
            parse_go_duration(&text).map_err(|error| ConfigFileError::Invalid {
                path: path.display().to_string(),
                field: "shutdownInhibitorAlertTimeout",
                problem: error.to_string(),
            })
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(contents: &str) -> tempfile::NamedTempFile {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), contents).unwrap();
        file
    }

    #[test]
    fn the_file_sets_the_timeout_and_the_flag_wins() {
        let config = file(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nshutdownInhibitorAlertTimeout: 90s\n",
        );
        assert_eq!(
            alert_timeout(Some(config.path()), None).unwrap(),
            Duration::from_secs(90)
        );
        assert_eq!(
            alert_timeout(Some(config.path()), Some(Duration::from_secs(5))).unwrap(),
            Duration::from_secs(5)
        );
        assert_eq!(alert_timeout(None, None).unwrap(), Duration::ZERO);
        assert_eq!(
            alert_timeout(Some(file("").path()), None).unwrap(),
            Duration::ZERO
        );
    }

    #[test]
    fn bad_files_name_the_field() {
        let error = alert_timeout(
            Some(file("shutdownInhibitorAlertTimeout: soon\n").path()),
            None,
        )
        .unwrap_err()
        .to_string();
        assert!(error.contains("shutdownInhibitorAlertTimeout: "), "{error}");
        let error = alert_timeout(
            Some(file("shutdownInhibitorAlertTimout: 1m\n").path()),
            None,
        )
        .unwrap_err()
        .to_string();
        assert!(error.contains("shutdownInhibitorAlertTimout"), "{error}");
        let error = alert_timeout(Some(Path::new("/nonexistent/config.yaml")), None)
            .unwrap_err()
            .to_string();
        assert!(error.contains("/nonexistent/config.yaml"), "{error}");
    }
}
