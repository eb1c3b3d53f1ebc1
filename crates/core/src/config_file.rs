//! Reading a program's YAML config file (KubeletConfiguration-style field names): one error
//! type that names the file, and an empty file reads as all defaults.

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

/// Parses `text`; blank text is `T::default()`.
pub fn parse_yaml<T: DeserializeOwned + Default>(text: &str) -> Result<T, serde_yaml_ng::Error> {
    if text.trim().is_empty() {
        return Ok(T::default());
    }
    serde_yaml_ng::from_str(text)
}
