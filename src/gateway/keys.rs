//! API key check: constant-time comparison of the bearer token with every configured key. Pure.
//! Keys are never formatted into messages or logs.

use std::hint::black_box;

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

/// Whether the header carries one of `keys`. Every key is compared (no short-circuit), so the
/// time does not say which key matched. No keys configured: always authorized.
#[must_use]
pub fn authorized(keys: &[String], header: Option<&str>) -> bool {
    if keys.is_empty() {
        return true;
    }
    let Some(token) = bearer(header) else { return false };
    keys.iter().fold(false, |ok, k| ct_eq(k.as_bytes(), token.as_bytes()) | ok)
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
    fn any_configured_key_opens() {
        let keys = vec!["k1".to_string(), "k2".to_string()];
        assert!(authorized(&keys, Some("Bearer k2")));
        assert!(authorized(&keys, Some("Bearer k1")));
        assert!(!authorized(&keys, Some("Bearer k3")));
        assert!(!authorized(&keys, None));
        assert!(authorized(&[], None));
    }
}
