//! Parsers for the response headers the downloader relies on. Pure.

use std::time::Duration;

/// Strip `W/` and quotes from an ETag: the cache names blobs by the bare value.
#[must_use]
pub fn bare_etag(v: &str) -> String {
    v.trim().trim_start_matches("W/").trim_matches('"').to_string()
}

/// The `rel="next"` target of a `Link` header.
#[must_use]
pub fn next_link(link: &str) -> Option<String> {
    link_rel(link, "next")
}

/// The target of the `Link` header's entry with relation `rel` (`next`, `xet-auth`).
#[must_use]
pub fn link_rel(link: &str, rel: &str) -> Option<String> {
    link.split(',').find_map(|part| {
        let mut pieces = part.split(';');
        let target = pieces.next()?.trim();
        let matches = pieces.any(|p| {
            let p = p.trim();
            p.strip_prefix("rel=").is_some_and(|v| v.trim_matches('"') == rel)
        });
        (matches && target.starts_with('<') && target.ends_with('>')).then(|| target[1..target.len() - 1].to_string())
    })
}

/// `Content-Range: bytes a-b/total` → `(a, b inclusive, total)`; total `*` → `None`.
#[must_use]
pub fn content_range(v: &str) -> Option<(u64, u64, Option<u64>)> {
    let rest = v.trim().strip_prefix("bytes ")?;
    let (span, total) = rest.split_once('/')?;
    let (a, b) = span.split_once('-')?;
    let total = if total.trim() == "*" { None } else { Some(total.trim().parse().ok()?) };
    Some((a.trim().parse().ok()?, b.trim().parse().ok()?, total))
}

/// `Retry-After` in delta-seconds (HTTP dates are not honoured: the caller's backoff applies).
#[must_use]
pub fn retry_after(v: &str) -> Option<Duration> {
    v.trim().parse::<f64>().ok().filter(|s| s.is_finite() && *s >= 0.0).map(Duration::from_secs_f64)
}

/// `RateLimit: "resolvers";r=0;t=12` → the wait when nothing remains (`r=0`), else `None`.
#[must_use]
pub fn ratelimit_wait(v: &str) -> Option<Duration> {
    let mut r = None;
    let mut t = None;
    for p in v.split(';') {
        if let Some((k, val)) = p.trim().split_once('=') {
            match k.trim() {
                "r" => r = val.trim().parse::<u64>().ok(),
                "t" => t = val.trim().parse::<u64>().ok(),
                _ => {}
            }
        }
    }
    (r == Some(0)).then(|| Duration::from_secs(t.unwrap_or(1)))
}

/// A URL without its query string (signed URLs carry signatures that must not reach logs).
#[must_use]
pub fn redact_query(url: &str) -> &str {
    url.split_once('?').map_or(url, |(a, _)| a)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etags() {
        assert_eq!(bare_etag("W/\"abc\""), "abc");
        assert_eq!(bare_etag("\"abc\""), "abc");
    }

    #[test]
    fn links() {
        let h = "<https://h/api/models/a/b/tree/c?recursive=true&cursor=xyz>; rel=\"next\"";
        assert_eq!(next_link(h).as_deref(), Some("https://h/api/models/a/b/tree/c?recursive=true&cursor=xyz"));
        assert_eq!(next_link("<x>; rel=\"prev\""), None);
        assert_eq!(next_link("<a>; rel=\"prev\", </b>; rel=\"next\"").as_deref(), Some("/b"));
        // The Hub's resolve: the token route of a Xet-backed file.
        let x = "<https://huggingface.co/api/models/o/n/xet-read-token/abc>; rel=\"xet-auth\", <https://cas-server.xethub.hf.co/v1/reconstructions/h>; rel=\"xet-reconstruction-info\"";
        assert_eq!(
            link_rel(x, "xet-auth").as_deref(),
            Some("https://huggingface.co/api/models/o/n/xet-read-token/abc")
        );
        assert_eq!(link_rel(x, "next"), None);
        assert_eq!(link_rel("<t>; rel=xet-auth", "xet-auth").as_deref(), Some("t"));
    }

    #[test]
    fn ranges() {
        assert_eq!(content_range("bytes 0-63/16464440224"), Some((0, 63, Some(16_464_440_224))));
        assert_eq!(content_range("bytes */100"), None);
        assert_eq!(content_range("bytes 5-9/*"), Some((5, 9, None)));
        assert_eq!(content_range("items 0-1/2"), None);
    }

    #[test]
    fn waits() {
        assert_eq!(retry_after("2"), Some(Duration::from_secs(2)));
        assert_eq!(retry_after("Wed, 21 Oct 2015 07:28:00 GMT"), None);
        assert_eq!(ratelimit_wait("\"resolvers\";r=0;t=12"), Some(Duration::from_secs(12)));
        assert_eq!(ratelimit_wait("\"resolvers\";r=5;t=12"), None);
        assert_eq!(redact_query("http://x/y?Signature=s"), "http://x/y");
    }
}
