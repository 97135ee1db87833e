//! Optional TOML files of tunables. Deployment knobs are flags with `PS_*` environment
//! fallbacks; a file given with `--config` may set them too, and a flag or variable wins.

use std::path::Path;

use serde::de::DeserializeOwned;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("config file {path} is not valid: {source}")]
    Parse {
        path: String,
        source: toml::de::Error,
    },
}

/// Reads and parses a TOML file; the type should use `#[serde(deny_unknown_fields)]` so that a
/// misspelt key is an error, not a silent default.
pub fn load_toml<T: DeserializeOwned>(path: &Path) -> Result<T, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.display().to_string(),
        source,
    })?;
    toml::from_str(&text).map_err(|source| ConfigError::Parse {
        path: path.display().to_string(),
        source,
    })
}
