//! The API keys of a deployment (`engine.api_keys`): the one env-then-file rule. Read once per
//! node and bring-up by [`super::Deployment::resolve`]; the gateway, the engine's own key and the
//! node's probes take them from there.

use crate::dirs::Dirs;
use crate::kit::schema::{ApiKeys, Kit};

/// Why `engine.api_keys` yields no usable key set. Each is a configuration error naming the key,
/// the variable or file, and the fix: a kit that names a key source which gives nothing is
/// refused (fail closed) rather than run with no keys. Never carries a key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeysError {
    /// `engine.api_keys.env` names a variable that is unset, empty, or holds only commas.
    #[error(
        "engine.api_keys.env names the variable {var}, which is {how}: the deployment would run without API keys; \
         export {var}=<key> (comma-separated for several), or remove engine.api_keys.env from the kit"
    )]
    Unset { var: String, how: &'static str },
    /// `engine.api_keys.file` cannot be read.
    #[error("engine.api_keys.file {path}: {why}: create it with one key per line, or unset engine.api_keys.file")]
    File { path: String, why: String },
    /// `engine.api_keys.file` holds no key (only blank lines).
    #[error(
        "engine.api_keys.file {path} holds no key: the deployment would run without API keys; \
         put one key per line in it, or unset engine.api_keys.file"
    )]
    EmptyFile { path: String },
}

impl KeysError {
    /// The variable `engine.api_keys.env` names is not set (on this machine).
    #[must_use]
    pub const fn is_unset_var(&self) -> bool {
        matches!(self, KeysError::Unset { .. })
    }
}

/// Every API key of `engine.api_keys`: the environment variable's comma-separated keys, then the
/// first field of each of the file's non-blank lines. Empty only when the kit names neither; a
/// named variable that is unset or empty, or a named file that is missing or empty, is an error
/// (the deployment must not silently run open).
pub fn api_keys(kit: &Kit, env: &[(String, String)], dirs: &Dirs) -> Result<Vec<String>, KeysError> {
    let mut keys: Vec<String> = Vec::new();
    if let Some(name) = &kit.engine.api_keys.env {
        keys = env_keys(name, env)?;
    }
    if let Some(f) = &kit.engine.api_keys.file {
        let path = dirs.expand(f);
        let text = std::fs::read_to_string(&path)
            .map_err(|e| KeysError::File { path: path.display().to_string(), why: e.to_string() })?;
        // The first field of each non-blank line (what the printed `curl` hint's awk reads).
        let before = keys.len();
        keys.extend(text.lines().filter_map(|l| l.split_whitespace().next()).map(str::to_string));
        if keys.len() == before {
            return Err(KeysError::EmptyFile { path: path.display().to_string() });
        }
    }
    keys.dedup();
    Ok(keys)
}

/// The options after the key on each line of `engine.api_keys.file` that has any
/// (`KEY priority=N max_in_flight=N`, read by the gateway): (line number, key, options).
/// Empty when the kit names no file or the file cannot be read ([`api_keys`] says why).
#[must_use]
pub fn key_file_options(kit: &Kit, dirs: &Dirs) -> Vec<(usize, String, String)> {
    let Some(f) = &kit.engine.api_keys.file else { return Vec::new() };
    let text = std::fs::read_to_string(dirs.expand(f)).unwrap_or_default();
    text.lines()
        .enumerate()
        .filter_map(|(i, l)| {
            let (key, rest) = l.trim().split_once(char::is_whitespace)?;
            Some((i + 1, key.to_string(), rest.trim().to_string()))
        })
        .collect()
}

/// The keys in the variable `name`: its comma-separated values; none is an error.
fn env_keys(name: &str, env: &[(String, String)]) -> Result<Vec<String>, KeysError> {
    let value = env.iter().rev().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
    let keys: Vec<String> =
        value.unwrap_or_default().split(',').map(str::trim).filter(|k| !k.is_empty()).map(str::to_string).collect();
    if keys.is_empty() {
        let how = match value {
            None => "not set",
            Some(v) if v.trim().is_empty() => "empty",
            Some(_) => "only commas (no key)",
        };
        return Err(KeysError::Unset { var: name.to_string(), how });
    }
    Ok(keys)
}

/// Where the first key of `engine.api_keys` comes from under [`api_keys`]' rule (the key the
/// engine gets and a printed `curl` sends): never the key itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FirstKey {
    /// The variable `engine.api_keys.env`; `list`: it holds several comma-separated keys.
    Env { var: String, list: bool },
    /// The file `engine.api_keys.file` (the first field of its first non-blank line), as written in the kit.
    File(String),
}

/// The source of the first key [`api_keys`] yields: the variable when the kit names one (an
/// unset one is [`KeysError::Unset`], which fails the deployment), else the file; `None` when
/// the kit names neither.
#[must_use]
pub fn first_key(keys: &ApiKeys, env: &[(String, String)]) -> Option<FirstKey> {
    match (&keys.env, &keys.file) {
        (Some(var), _) => {
            let list = env_keys(var, env).is_ok_and(|k| k.len() > 1);
            Some(FirstKey::Env { var: var.clone(), list })
        }
        (None, Some(f)) => Some(FirstKey::File(f.clone())),
        (None, None) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_from_the_variable_and_the_file() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("keys");
        std::fs::write(&f, "\n  file-a  \nfile-b\n\n").unwrap();
        let mut k = crate::kit::builtin_kit("tiny-cpu");
        k.engine.api_keys.env = Some("K".into());
        k.engine.api_keys.file = Some(f.display().to_string());
        let dirs = Dirs::from_env(&crate::dirs::pairs(&[("HOME", d.path().to_str().unwrap())])).unwrap();
        let env = vec![("K".to_string(), "env-a, env-b,".to_string())];
        assert_eq!(api_keys(&k, &env, &dirs).unwrap(), ["env-a", "env-b", "file-a", "file-b"]);
        k.engine.api_keys.env = None;
        assert_eq!(api_keys(&k, &[], &dirs).unwrap(), ["file-a", "file-b"]);
        k.engine.api_keys.env = Some("K".into());
        k.engine.api_keys.file = Some(d.path().join("missing").display().to_string());
        let e = api_keys(&k, &env, &dirs).unwrap_err();
        assert!(matches!(e, KeysError::File { .. }), "{e}");
        assert!(
            e.to_string().starts_with("engine.api_keys.file ") && e.to_string().contains("one key per line"),
            "{e}"
        );
        k.engine.api_keys = crate::kit::schema::ApiKeys::default();
        assert!(api_keys(&k, &[], &dirs).unwrap().is_empty(), "no key source named: no keys, no error");
    }

    #[test]
    fn a_named_variable_that_is_unset_or_empty_fails_closed() {
        let d = tempfile::tempdir().unwrap();
        let dirs = Dirs::from_env(&crate::dirs::pairs(&[("HOME", d.path().to_str().unwrap())])).unwrap();
        let mut k = crate::kit::builtin_kit("tiny-cpu");
        k.engine.api_keys.env = Some("GW_KEYS".into());
        for (env, how) in [
            (vec![], "not set"),
            (vec![("GW_KEYS".to_string(), "  ".to_string())], "empty"),
            (vec![("GW_KEYS".to_string(), " , ,".to_string())], "only commas (no key)"),
        ] {
            let e = api_keys(&k, &env, &dirs).unwrap_err();
            assert_eq!(e, KeysError::Unset { var: "GW_KEYS".into(), how });
            assert!(e.is_unset_var());
            let msg = e.to_string();
            assert!(!msg.contains('\n'), "one line: {msg}");
            assert!(
                msg.starts_with(&format!("engine.api_keys.env names the variable GW_KEYS, which is {how}:")),
                "{msg}"
            );
            assert!(msg.contains("export GW_KEYS=<key>") && msg.contains("remove engine.api_keys.env"), "{msg}");
        }
        // The variable set: its keys, even with a file beside it that is fine.
        let env = vec![("GW_KEYS".to_string(), "a".to_string())];
        assert_eq!(api_keys(&k, &env, &dirs).unwrap(), ["a"]);
    }

    /// The printed `curl`'s key source and the keys the deployment runs with follow one rule:
    /// the first key [`api_keys`] yields comes from the source [`first_key`] names.
    #[test]
    fn the_first_key_comes_from_the_source_first_key_names() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("keys");
        std::fs::write(&f, "\n file-a x\nfile-b\n").unwrap();
        let dirs = Dirs::from_env(&crate::dirs::pairs(&[("HOME", d.path().to_str().unwrap())])).unwrap();
        let file = Some(f.display().to_string());
        let mut k = crate::kit::builtin_kit("tiny-cpu");
        for (var, value, file) in [
            (Some("K"), Some("env-a"), None),
            (Some("K"), Some(" env-a , env-b"), None),
            (Some("K"), Some("env-a"), file.clone()),
            (Some("K"), Some("env-a,env-b"), file.clone()),
            (Some("K"), None, file.clone()),
            (None, Some("env-a"), file.clone()),
            (None, None, None),
        ] {
            k.engine.api_keys = ApiKeys { env: var.map(str::to_string), file };
            let env: Vec<(String, String)> = value.map(|v| ("K".to_string(), v.to_string())).into_iter().collect();
            let (keys, first) = (api_keys(&k, &env, &dirs), first_key(&k.engine.api_keys, &env));
            let case = format!("{var:?} {value:?}: {keys:?} {first:?}");
            match (keys, first) {
                (Err(KeysError::Unset { .. }), Some(FirstKey::Env { .. })) => assert!(value.is_none(), "{case}"),
                (Ok(keys), None) => assert!(keys.is_empty(), "{case}"),
                (Ok(keys), Some(FirstKey::Env { list, .. })) => {
                    assert_eq!(keys[0], "env-a", "{case}");
                    assert_eq!(list, value.unwrap().contains("env-b"), "{case}");
                }
                (Ok(keys), Some(FirstKey::File(_))) => assert_eq!(keys, ["file-a", "file-b"], "{case}"),
                _ => panic!("{case}"),
            }
        }
    }

    #[test]
    fn a_named_file_without_a_key_fails_closed() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("keys");
        std::fs::write(&f, "\n   \n").unwrap();
        let dirs = Dirs::from_env(&crate::dirs::pairs(&[("HOME", d.path().to_str().unwrap())])).unwrap();
        let mut k = crate::kit::builtin_kit("tiny-cpu");
        k.engine.api_keys.file = Some(f.display().to_string());
        let e = api_keys(&k, &[], &dirs).unwrap_err();
        assert_eq!(e, KeysError::EmptyFile { path: f.display().to_string() });
        assert!(!e.is_unset_var());
        assert!(e.to_string().contains("holds no key") && e.to_string().contains("one key per line"), "{e}");
    }
}
