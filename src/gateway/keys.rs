//! API keys: held as SHA-256 digests (the plaintext is not kept), each with its own limits, and
//! the constant-time check of a bearer token against every one of them. Pure.
//! Keys are never formatted into messages or logs.

use std::hint::black_box;

use sha2::{Digest, Sha256};

/// What one key may do (`engine.api_keys.file`: `KEY priority=N max_in_flight=N`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KeyPolicy {
    /// The most urgent `priority` this key's requests get (vLLM serves lower values first): a
    /// request's own `priority` is raised to it, and a request without one gets it.
    pub priority: Option<i64>,
    /// Requests of this key in the gateway at once (queued or in flight); one more gets 429.
    pub max_in_flight: Option<usize>,
}

/// One accepted key: its digest and its policy. `Debug` shows neither key nor digest.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey {
    digest: [u8; 32],
    pub policy: KeyPolicy,
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiKey").field("digest", &"<not shown>").field("policy", &self.policy).finish()
    }
}

fn digest(token: &[u8]) -> [u8; 32] {
    Sha256::digest(token).into()
}

impl ApiKey {
    /// The key `secret` with `policy`; only its digest is kept.
    #[must_use]
    pub fn new(secret: &str, policy: KeyPolicy) -> Self {
        Self { digest: digest(secret.as_bytes()), policy }
    }

    /// Whether `token` is this key (constant time over the digests).
    #[must_use]
    pub fn opens(&self, token: &str) -> bool {
        ct_eq(&self.digest, &digest(token.as_bytes()))
    }
}

impl From<&str> for ApiKey {
    fn from(secret: &str) -> Self {
        Self::new(secret, KeyPolicy::default())
    }
}

/// Constant-time equality over the longer of the two lengths (a length difference still fails,
/// without an early return on the first differing byte).
#[must_use]
pub fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    let n = a.len().max(b.len());
    let mut diff = u8::from(a.len() != b.len());
    for i in 0..n {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= black_box(x ^ y);
    }
    diff == 0
}

/// The token of an `Authorization: Bearer <token>` header value.
#[must_use]
pub fn bearer(header: Option<&str>) -> Option<&str> {
    let h = header?.trim();
    let (scheme, token) = h.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// Who is calling: `Some(None)` when no keys are configured (anyone), `Some(Some(i))` for the
/// key at index `i`, `None` when the header carries no configured key. Every key is compared
/// (no short-circuit), so the time does not say which key matched.
#[must_use]
pub fn caller(keys: &[ApiKey], header: Option<&str>) -> Option<Option<usize>> {
    if keys.is_empty() {
        return Some(None);
    }
    let token = bearer(header)?;
    let found = keys.iter().enumerate().fold(None, |hit, (i, k)| if k.opens(token) { Some(i) } else { hit });
    found.map(Some)
}

/// Whether the header carries one of `keys` (always, when none are configured).
#[must_use]
pub fn authorized(keys: &[ApiKey], header: Option<&str>) -> bool {
    caller(keys, header).is_some()
}

/// A key file line's options after the key (`priority=N`, `max_in_flight=N`), or what is wrong.
pub fn parse_policy(fields: &str) -> Result<KeyPolicy, String> {
    let mut p = KeyPolicy::default();
    for f in fields.split_whitespace() {
        match f.split_once('=') {
            Some(("priority", v)) => {
                p.priority = Some(v.parse().map_err(|_| format!("priority={v} is not an integer"))?);
            }
            Some(("max_in_flight", v)) => {
                let n = v.parse::<usize>().ok().filter(|n| *n > 0);
                p.max_in_flight = Some(n.ok_or_else(|| format!("max_in_flight={v} is not a whole number above 0"))?);
            }
            _ => return Err(format!("unknown option {f:?} (the options are priority=N and max_in_flight=N)")),
        }
    }
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_and_unequal() {
        assert!(ct_eq(b"abc", b"abc"));
        assert!(!ct_eq(b"abc", b"abd"));
        assert!(!ct_eq(b"abc", b"abcd"));
        assert!(!ct_eq(b"", b"a"));
        assert!(ct_eq(b"", b""));
    }

    #[test]
    fn bearer_parsing() {
        assert_eq!(bearer(Some("Bearer sk-1")), Some("sk-1"));
        assert_eq!(bearer(Some("bearer  sk-1 ")), Some("sk-1"));
        assert_eq!(bearer(Some("Basic abc")), None);
        assert_eq!(bearer(Some("sk-1")), None);
        assert_eq!(bearer(None), None);
    }

    #[test]
    fn any_configured_key_opens_and_names_itself() {
        let keys: Vec<ApiKey> = vec!["k1".into(), "k2".into()];
        assert_eq!(caller(&keys, Some("Bearer k2")), Some(Some(1)));
        assert_eq!(caller(&keys, Some("Bearer k1")), Some(Some(0)));
        assert!(!authorized(&keys, Some("Bearer k3")));
        assert!(!authorized(&keys, None));
        assert_eq!(caller(&[], None), Some(None));
    }

    #[test]
    fn only_the_digest_is_held() {
        let k = ApiKey::new("sk-plain-secret", KeyPolicy::default());
        assert_eq!(k.digest, <[u8; 32]>::from(Sha256::digest(b"sk-plain-secret")));
        assert!(!k.digest.windows(6).any(|w| w == b"sk-pla"));
        assert!(!format!("{k:?}").contains("sk-plain"));
        assert!(k.opens("sk-plain-secret") && !k.opens("sk-plain-secreT"));
    }

    #[test]
    fn key_file_options() {
        assert_eq!(parse_policy(""), Ok(KeyPolicy::default()));
        assert_eq!(
            parse_policy(" priority=5  max_in_flight=2"),
            Ok(KeyPolicy { priority: Some(5), max_in_flight: Some(2) })
        );
        assert_eq!(parse_policy("priority=-3").unwrap().priority, Some(-3));
        assert!(parse_policy("priority=x").unwrap_err().contains("priority=x"));
        assert!(parse_policy("max_in_flight=0").unwrap_err().contains("above 0"));
        assert!(parse_policy("team=a").unwrap_err().contains("unknown option"));
    }
}
