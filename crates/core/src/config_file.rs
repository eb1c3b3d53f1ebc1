//! Reading a program's YAML config file (KubeletConfiguration-style field names): one error
//! type that names the file, an empty file reads as all defaults, and the header a kubelet
//! config carries (`apiVersion`, `kind`) is accepted and ignored, so lines copied from one
//! read as they are.

use std::path::Path;

use serde::de::DeserializeOwned;

#[derive(Debug, thiserror::Error)]
pub enum ConfigFileError {
    #[error("cannot read the config file {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("config file {path}: {source}")]
    Parse {
        path: String,
        #[source]
        source: serde_yaml_ng::Error,
    },
    #[error("config file {path}: {field}: {problem}")]
    Invalid {
        path: String,
        field: &'static str,
        problem: String,
    },
}

/// Reads and parses `path`; serde's message names a misspelt or mistyped field.
pub fn read_yaml<T: DeserializeOwned + Default>(path: &Path) -> Result<T, ConfigFileError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| ConfigFileError::Read {
        path: shown.clone(),
        source,
    })?;
    parse_yaml(&text).map_err(|source| ConfigFileError::Parse {
        path: shown,
        source,
    })
}

/// Parses `text`; blank text is `T::default()`. `T` can deny unknown fields: the header is
/// taken off first.
pub fn parse_yaml<T: DeserializeOwned + Default>(text: &str) -> Result<T, serde_yaml_ng::Error> {
    if text.trim().is_empty() {
        return Ok(T::default());
    }
    let mut value: serde_yaml_ng::Value = serde_yaml_ng::from_str(text)?;
    if let Some(fields) = value.as_mapping_mut() {
        fields.remove("apiVersion");
        fields.remove("kind");
    }
    serde_yaml_ng::from_value(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Default, serde::Deserialize)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    struct Settings {
        grace_period: Option<String>,
    }

    #[test]
    fn the_header_is_ignored_and_other_unknown_fields_are_named() {
        let settings: Settings = parse_yaml(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
             gracePeriod: 30s\n",
        )
        .unwrap();
        assert_eq!(settings.grace_period.as_deref(), Some("30s"));
        let error = parse_yaml::<Settings>("gracePeriodd: 30s\n").unwrap_err();
        assert!(
            error.to_string().contains("unknown field `gracePeriodd`"),
            "{error}"
        );
        assert!(
            parse_yaml::<Settings>("  \n")
                .unwrap()
                .grace_period
                .is_none()
        );
    }
}
