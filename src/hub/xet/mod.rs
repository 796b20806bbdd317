//! The native Xet path through HF's own client (`hf-xet`, imported as `xet`): one download-stream
//! group per repo download, whose CAS token comes from the Hub's `xet-read-token` route (hf-xet
//! refreshes it 30 s before `exp`; after a `401` the group is dropped here, so the next stream
//! fetches a fresh one), and ranged streams of a file's reconstruction that the range workers
//! write at the file offset (src/hub/fetch/worker.rs). hf-xet asks the CAS for the
//! reconstruction of each requested range only (a range request is at most `--range-size`,
//! far below the 10 GB batches the protocol recommends), fetches the xorb ranges it names and
//! decodes their chunks. Retries stay with the range workers (reported, counted, resumable),
//! so hf-xet's own are turned off. See docs/download.md.

use std::ops::Range;
use std::path::PathBuf;

use xet::xet_session::{
    HeaderMap, HeaderValue, XetConfig, XetDownloadStream, XetDownloadStreamGroup, XetFileInfo, XetSession,
    XetSessionBuilder,
};

/// hf-xet's client settings for spark-kit: one attempt per request (the range workers retry).
const CONFIG: &[(&str, &str)] = &[("client.retry_max_attempts", "1")];

/// A failure of the Xet path, and the token generation it happened under.
#[derive(Debug)]
pub struct XetFailure {
    pub reason: String,
    pub generation: u32,
}

impl XetFailure {
    /// Whether the CAS refused the token (then the group is renewed).
    #[must_use]
    pub fn unauthorized(&self) -> bool {
        is_unauthorized(&self.reason)
    }
}

/// Whether an hf-xet error message reports a refused token.
#[must_use]
pub fn is_unauthorized(reason: &str) -> bool {
    let r = reason.to_ascii_lowercase();
    r.contains("401") || r.contains("unauthorized") || r.contains("authentication")
}

struct Inner {
    session: Option<XetSession>,
    group: Option<XetDownloadStreamGroup>,
    generation: u32,
}

/// The Xet side of one repo download (one token route: repo and commit).
pub struct XetSource {
    token_url: String,
    hub_auth: Option<String>,
    scratch: PathBuf,
    inner: tokio::sync::Mutex<Inner>,
}

impl XetSource {
    /// `token_url`: the `xet-auth` link of the repo's `resolve` answers; `hub_auth`: the
    /// `Authorization` value for it; `scratch`: hf-xet's working directory.
    #[must_use]
    pub fn new(token_url: String, hub_auth: Option<String>, scratch: PathBuf) -> Self {
        Self {
            token_url,
            hub_auth,
            scratch,
            inner: tokio::sync::Mutex::new(Inner { session: None, group: None, generation: 0 }),
        }
    }

    /// The token route this source fetches CAS tokens from.
    #[must_use]
    pub fn token_url(&self) -> &str {
        &self.token_url
    }

    async fn group(&self) -> Result<(XetDownloadStreamGroup, u32), XetFailure> {
        let mut inner = self.inner.lock().await;
        let generation = inner.generation;
        let fail = |reason: String| XetFailure { reason, generation };
        if let Some(g) = &inner.group {
            return Ok((g.clone(), generation));
        }
        if inner.session.is_none() {
            let mut config = XetConfig::new();
            for (k, v) in CONFIG {
                config = config.with_config(k, v).map_err(|e| fail(format!("hf-xet setting {k}: {e}")))?;
            }
            let session = XetSessionBuilder::new_with_config(config)
                .with_cache_dir(self.scratch.clone())
                .build()
                .map_err(|e| fail(format!("cannot start the Xet client: {e}")))?;
            inner.session = Some(session);
        }
        let session = inner.session.as_ref().ok_or_else(|| fail("no Xet session".into()))?;
        let mut headers = HeaderMap::new();
        if let Some(a) = &self.hub_auth {
            let v = HeaderValue::from_str(a).map_err(|_| fail("the Hub token is not a valid header value".into()))?;
            headers.insert("authorization", v);
        }
        let group = session
            .new_download_stream_group()
            .map_err(|e| fail(format!("Xet client: {e}")))?
            .with_token_refresh_url(self.token_url.clone(), headers)
            .build()
            .await
            .map_err(|e| fail(format!("no CAS token from {}: {e}", self.token_url)))?;
        inner.group = Some(group.clone());
        Ok((group, generation))
    }

    /// A started stream of the bytes `range` of the file `hash` (`size` bytes in all), in order.
    pub async fn stream(
        &self,
        hash: &str,
        size: u64,
        range: Range<u64>,
    ) -> Result<(XetDownloadStream, u32), XetFailure> {
        let (group, generation) = self.group().await?;
        let info = XetFileInfo::new(hash.to_string(), size);
        let mut s = group
            .download_stream(info, Some(range))
            .await
            .map_err(|e| XetFailure { reason: format!("reconstruction failed: {e}"), generation })?;
        s.start();
        Ok((s, generation))
    }

    /// Drop the group of `generation` (its token was refused): the next stream builds a new one,
    /// which fetches a fresh token. Later generations are left alone.
    pub async fn renew(&self, generation: u32) {
        let mut inner = self.inner.lock().await;
        if inner.generation == generation {
            inner.group = None;
            inner.generation += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refused_tokens_are_recognised() {
        assert!(is_unauthorized("HTTP status client error (401 Unauthorized) for url (http://x/v1/reconstructions/h)"));
        assert!(!is_unauthorized("HTTP status server error (503 Service Unavailable)"));
        assert!(XetFailure { reason: "Unauthorized".into(), generation: 3 }.unauthorized());
    }
}
