//! The Hub token: `HF_TOKEN`, then the file at `HF_TOKEN_PATH`, then `$HF_HOME/token`.
//! It is sent to the Hub's API and `resolve` only — never to the CDN — and never printed.

use std::fmt;
use std::path::{Path, PathBuf};

/// A bearer token whose `Debug` and `Display` never show the value.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(String);

impl Token {
    /// The `Authorization` header value.
    #[must_use]
    pub fn bearer(&self) -> String {
        format!("Bearer {}", self.0)
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

/// Where the token came from, for messages (never the value).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenSource {
    Env,
    File(PathBuf),
}

fn get<'a>(env: &'a [(String, String)], key: &str) -> Option<&'a str> {
    env.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v.as_str()).filter(|v| !v.trim().is_empty())
}

pub use crate::deploy::hf::hf_home;

/// Find the token. `read` reads a token file (injected so the lookup order is testable).
pub fn find_token(
    env: &[(String, String)],
    home: &Path,
    read: impl Fn(&Path) -> Option<String>,
) -> Option<(Token, TokenSource)> {
    let disabled = get(env, "HF_HUB_DISABLE_IMPLICIT_TOKEN")
        .is_some_and(|v| matches!(v.to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "on"));
    if disabled {
        return None;
    }
    if let Some(t) = get(env, "HF_TOKEN") {
        return Some((Token(t.trim().to_string()), TokenSource::Env));
    }
    let file = get(env, "HF_TOKEN_PATH").map_or_else(|| hf_home(env, home).join("token"), PathBuf::from);
    let t = read(&file)?;
    let t = t.trim();
    (!t.is_empty()).then(|| (Token(t.to_string()), TokenSource::File(file)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(p: &[(&str, &str)]) -> Vec<(String, String)> {
        p.iter().map(|(a, b)| ((*a).to_string(), (*b).to_string())).collect()
    }

    #[test]
    fn order() {
        let home = Path::new("/h");
        let files = |p: &Path| match p.to_str() {
            Some("/h/.cache/huggingface/token") => Some("default\n".to_string()),
            Some("/t/tok") => Some("frompath".to_string()),
            Some("/hh/token") => Some("fromhome".to_string()),
            _ => None,
        };
        let t = |e: &[(&str, &str)]| find_token(&env(e), home, files).map(|(t, _)| t.bearer());
        assert_eq!(t(&[]).as_deref(), Some("Bearer default"));
        assert_eq!(t(&[("HF_HOME", "/hh")]).as_deref(), Some("Bearer fromhome"));
        assert_eq!(t(&[("HF_TOKEN_PATH", "/t/tok"), ("HF_HOME", "/hh")]).as_deref(), Some("Bearer frompath"));
        assert_eq!(t(&[("HF_TOKEN", "x"), ("HF_TOKEN_PATH", "/t/tok")]).as_deref(), Some("Bearer x"));
        assert_eq!(t(&[("HF_TOKEN", "x"), ("HF_HUB_DISABLE_IMPLICIT_TOKEN", "1")]), None);
        assert_eq!(t(&[("HF_TOKEN_PATH", "/nope")]), None);
    }

    #[test]
    fn never_shown() {
        let (tok, _) = find_token(&env(&[("HF_TOKEN", "hf_secret")]), Path::new("/h"), |_| None).unwrap();
        assert!(!format!("{tok:?}").contains("hf_secret"));
    }
}
