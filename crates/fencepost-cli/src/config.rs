//! The config file (`<config dir>/fencepost/config.toml`, or `--config FILE`): its decoder, and
//! how a coordinator URL is shown. No I/O here: the fuzz target `config_file` (`fuzz/`) and the
//! CLI's fuzz regression test include this file as it is.

use anyhow::{Context, Result};
use serde::Deserialize;

/// What a config file may set; every key is optional, and an unknown key is an error.
#[derive(Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    /// The coordinator spec (`sqlite:PATH`, `postgres://…`).
    pub coordinator: Option<String>,
    /// The ledger: a folder, `sqlite:PATH` or `postgres://…`.
    pub ledger: Option<std::path::PathBuf>,
    /// This host's device id.
    pub device: Option<String>,
    /// The fingerprint of the protected ledger the ledger must be (`ledger init` prints it).
    pub protected: Option<String>,
}

impl ConfigFile {
    /// Decodes a config file's bytes (read from `path`, named in errors): UTF-8 TOML with at
    /// most the four keys; a device id must be a valid id (rule L8), a fingerprint one that
    /// `ledger init` prints.
    pub fn parse(bytes: &[u8], path: &std::path::Path) -> Result<Self> {
        let text = std::str::from_utf8(bytes)
            .with_context(|| format!("config file {} is not UTF-8 text", path.display()))?;
        let config: ConfigFile =
            toml::from_str(text).with_context(|| format!("config file {} is not valid", path.display()))?;
        if let Some(device) = &config.device {
            fencepost::id::validate_id(fencepost::id::IdKind::Device, device)
                .with_context(|| format!("config file {}: device", path.display()))?;
        }
        if let Some(fingerprint) = &config.protected {
            fingerprint
                .parse::<fencepost::genesis::Fingerprint>()
                .with_context(|| format!("config file {}: protected", path.display()))?;
        }
        Ok(config)
    }
}

/// Whether `spec` is a PostgreSQL URL.
pub fn is_postgres_url(spec: &str) -> bool {
    spec.starts_with("postgres://") || spec.starts_with("postgresql://")
}

/// A PostgreSQL URL without its password, to be shown.
pub fn without_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((credentials, host)) => match credentials.split_once(':') {
            Some((user, _password)) => format!("{scheme}://{user}:***@{host}{tail}"),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

/// What the fuzz target and the regression test check: any bytes are decoded or refused, never
/// a panic; a spec read from a config file is shown without its password without a panic, and
/// showing it again changes nothing.
#[cfg(any(test, fuzzing))]
#[allow(dead_code)]
pub fn check_decoder(bytes: &[u8]) {
    let Ok(config) = ConfigFile::parse(bytes, std::path::Path::new("fuzzed.toml")) else {
        return;
    };
    for spec in config
        .coordinator
        .iter()
        .map(String::as_str)
        .chain(config.ledger.iter().filter_map(|ledger| ledger.to_str()))
    {
        let _ = is_postgres_url(spec);
        let shown = without_password(spec);
        assert_eq!(
            without_password(&shown),
            shown,
            "showing a URL twice changes nothing"
        );
    }
}
