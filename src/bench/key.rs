//! The API key `bench` sends: `--api-key-env NAME`, `--api-key-file PATH`, else the kit's first
//! key (`engine.api_keys`), else none.

use std::path::{Path, PathBuf};

use crate::deploy::keys::KeysError;
use crate::deploy::Deployment;

/// Why the key cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("--api-key-env {0}: the variable is not set or empty")]
    EnvUnset(String),
    #[error("--api-key-file {}: {source}", path.display())]
    File { path: PathBuf, source: std::io::Error },
    #[error("--api-key-file {}: the file is empty", .0.display())]
    EmptyFile(PathBuf),
    #[error("{0}")]
    Kit(KeysError),
}

impl KeyError {
    /// The fix.
    #[must_use]
    pub fn hint(&self) -> String {
        match self {
            Self::EnvUnset(name) => format!("export {name}=<key>, or pass --api-key-file PATH"),
            Self::File { .. } => "check the path and its permissions".into(),
            Self::EmptyFile(_) => "put the key on the first line".into(),
            Self::Kit(_) => "fix the kit's engine.api_keys, or pass --api-key-env NAME".into(),
        }
    }
}

/// Where the key comes from.
pub enum KeyFrom<'a> {
    /// `--api-key-env NAME`: the first of its comma-separated keys.
    Env(&'a str),
    /// `--api-key-file PATH`: its first non-blank line.
    File(&'a Path),
    /// The kit's first `engine.api_keys` key, as its deployment read them.
    Kit(&'a Deployment),
    None,
}

impl<'a> KeyFrom<'a> {
    /// `--api-key-env` wins over `--api-key-file`, which wins over the kit's keys.
    #[must_use]
    pub fn of(env: Option<&'a str>, file: Option<&'a Path>, kit: Option<&'a Deployment>) -> Self {
        match (env, file, kit) {
            (Some(name), _, _) => Self::Env(name),
            (None, Some(path), _) => Self::File(path),
            (None, None, Some(d)) => Self::Kit(d),
            (None, None, None) => Self::None,
        }
    }
}

/// The key, if any.
pub fn api_key(from: &KeyFrom<'_>, env: &[(String, String)]) -> Result<Option<String>, KeyError> {
    match from {
        KeyFrom::Env(name) => {
            let v = env.iter().rev().find(|(k, _)| k == name).map(|(_, v)| v.trim().to_string());
            match v.filter(|v| !v.is_empty()) {
                Some(v) => Ok(Some(first_key(&v))),
                None => Err(KeyError::EnvUnset((*name).to_string())),
            }
        }
        KeyFrom::File(path) => {
            let text =
                std::fs::read_to_string(path).map_err(|source| KeyError::File { path: path.to_path_buf(), source })?;
            match text.lines().map(str::trim).find(|l| !l.is_empty()) {
                Some(k) => Ok(Some(k.to_string())),
                None => Err(KeyError::EmptyFile(path.to_path_buf())),
            }
        }
        KeyFrom::Kit(d) => d.api_key().map(|k| k.map(first_key)).map_err(|e| KeyError::Kit(e.clone())),
        KeyFrom::None => Ok(None),
    }
}

/// The first of comma-separated keys.
fn first_key(v: &str) -> String {
    v.split(',').map(str::trim).find(|k| !k.is_empty()).unwrap_or(v).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_variable_gives_its_first_key_and_an_unset_one_says_how_to_set_it() {
        let env = vec![("K".to_string(), " ,a, b".to_string())];
        assert_eq!(api_key(&KeyFrom::Env("K"), &env).unwrap(), Some("a".into()));
        let e = api_key(&KeyFrom::Env("NOPE"), &env).unwrap_err();
        assert_eq!(e.to_string(), "--api-key-env NOPE: the variable is not set or empty");
        assert_eq!(e.hint(), "export NOPE=<key>, or pass --api-key-file PATH");
        assert_eq!(api_key(&KeyFrom::None, &env).unwrap(), None);
    }

    #[test]
    fn a_file_gives_its_first_non_blank_line() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("k");
        std::fs::write(&p, "\n  sk-1  \nsk-2\n").unwrap();
        assert_eq!(api_key(&KeyFrom::File(&p), &[]).unwrap(), Some("sk-1".into()));
        std::fs::write(&p, "\n").unwrap();
        assert!(api_key(&KeyFrom::File(&p), &[]).unwrap_err().to_string().ends_with(": the file is empty"));
    }
}
