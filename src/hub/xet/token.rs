//! The CAS token, known to spark-kit: fetched from the Hub's `xet-auth` route by our own HTTP
//! client (so its status is a typed `StatusCode`, not text inside an hf-xet error), handed to
//! hf-xet with its expiry, and judged when a Xet request fails. hf-xet flattens a CAS `401`
//! into `Network(String)` (its `XetError` keeps typed variants only for 429, 5xx, timeouts,
//! integrity and its own refresh failures), so a failure of that class is settled by asking the
//! CAS once with the same token: `401` means refused. See docs/decisions.md.

use std::time::Duration;

use reqwest::header::{AUTHORIZATION, RANGE};
use reqwest::StatusCode;
use serde::Deserialize;
use xet::xet_session::SessionError;

/// Seconds before `exp` at which hf-xet fetches a new token by itself (xet-client's
/// `REFRESH_BUFFER_SEC`); from then on the token it uses is no longer ours.
pub const REFRESH_BUFFER_S: u64 = 30;

/// How long the token check may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// The `xet-auth` route's answer.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct CasToken {
    #[serde(rename = "accessToken")]
    pub token: String,
    pub exp: u64,
    #[serde(rename = "casUrl")]
    pub cas_url: String,
}

/// What an hf-xet failure says about the token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// hf-xet could not get a token (its refresh from the `xet-auth` route failed).
    Refused,
    /// A failure that is not about the token (5xx, 429, timeout, corrupt data, I/O…).
    NotToken,
    /// A class hf-xet also files a CAS `401` under: ask the CAS.
    Ask,
}

/// The verdict from hf-xet's error variant (never from its text).
#[must_use]
pub fn verdict(e: &SessionError) -> Verdict {
    match e {
        SessionError::Authentication(_) => Verdict::Refused,
        SessionError::Network(_)
        | SessionError::TaskError(_)
        | SessionError::PreviousTaskError(_)
        | SessionError::Internal(_) => Verdict::Ask,
        _ => Verdict::NotToken,
    }
}

/// Whether hf-xet has (or is about to have) replaced `t` with a token of its own at `now`.
#[must_use]
pub fn superseded(t: &CasToken, now: u64) -> bool {
    now.saturating_add(REFRESH_BUFFER_S) >= t.exp
}

/// Why no token came.
#[derive(Debug)]
pub enum TokenError {
    /// The route answered this status.
    Status(StatusCode),
    /// No answer, or not the JSON the route sends.
    Other(String),
}

impl TokenError {
    /// The status, when the route refused the request outright (401/403: the Hub token is
    /// missing, wrong or lacks access): asking again cannot help.
    #[must_use]
    pub fn refusal(&self) -> Option<u16> {
        match self {
            Self::Status(s) if *s == StatusCode::UNAUTHORIZED || *s == StatusCode::FORBIDDEN => Some(s.as_u16()),
            _ => None,
        }
    }
}

impl std::fmt::Display for TokenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Status(s) => write!(f, "HTTP {}", s.as_u16()),
            Self::Other(s) => f.write_str(s),
        }
    }
}

/// A fresh token from the `xet-auth` route (`auth`: the Hub's `Authorization`, if any).
pub async fn fetch(http: &reqwest::Client, url: &str, auth: Option<&str>) -> Result<CasToken, TokenError> {
    let mut rb = http.get(url).timeout(PROBE_TIMEOUT);
    if let Some(a) = auth {
        rb = rb.header(AUTHORIZATION, a);
    }
    let resp = rb.send().await.map_err(|e| TokenError::Other(format!("request failed: {e}")))?;
    if !resp.status().is_success() {
        return Err(TokenError::Status(resp.status()));
    }
    resp.json().await.map_err(|e| TokenError::Other(format!("not a token answer: {e}")))
}

/// Whether the CAS refuses `t` (`401`), asked with a one-byte reconstruction of `hash`.
/// Anything else (an answer, another status, no answer) is not a refusal.
pub async fn refused_by_cas(http: &reqwest::Client, t: &CasToken, hash: &str) -> bool {
    let url = format!("{}/v1/reconstructions/{hash}", t.cas_url.trim_end_matches('/'));
    let rb = http
        .get(url)
        .timeout(PROBE_TIMEOUT)
        .header(AUTHORIZATION, format!("Bearer {}", t.token))
        .header(RANGE, "bytes=0-0");
    rb.send().await.is_ok_and(|r| r.status() == StatusCode::UNAUTHORIZED)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_401_and_403_from_the_token_route_are_refusals() {
        assert_eq!(TokenError::Status(StatusCode::UNAUTHORIZED).refusal(), Some(401));
        assert_eq!(TokenError::Status(StatusCode::FORBIDDEN).refusal(), Some(403));
        assert_eq!(TokenError::Status(StatusCode::INTERNAL_SERVER_ERROR).refusal(), None);
        assert_eq!(TokenError::Status(StatusCode::TOO_MANY_REQUESTS).refusal(), None);
        assert_eq!(TokenError::Other("connection reset".into()).refusal(), None);
    }

    #[test]
    fn verdicts_follow_the_variant_not_the_text() {
        assert_eq!(verdict(&SessionError::Authentication("x".into())), Verdict::Refused);
        // The text of a 5xx may well contain "401" (a URL, a hash): the variant decides.
        assert_eq!(verdict(&SessionError::ServerError("401 in a hash".into())), Verdict::NotToken);
        assert_eq!(verdict(&SessionError::RateLimited("429".into())), Verdict::NotToken);
        assert_eq!(verdict(&SessionError::DataIntegrity("bad chunk".into())), Verdict::NotToken);
        assert_eq!(verdict(&SessionError::Network("HTTP status client error (401 Unauthorized)".into())), Verdict::Ask);
        assert_eq!(verdict(&SessionError::Network("connection reset".into())), Verdict::Ask);
    }

    #[test]
    fn a_token_is_ours_until_hf_xet_refreshes_it() {
        let t = CasToken { token: "t".into(), exp: 1000, cas_url: "http://c".into() };
        assert!(!superseded(&t, 969));
        assert!(superseded(&t, 970));
        let j: CasToken = serde_json::from_str(r#"{"accessToken":"a","exp":5,"casUrl":"http://c"}"#).unwrap();
        assert_eq!(j, CasToken { token: "a".into(), exp: 5, cas_url: "http://c".into() });
    }
}
