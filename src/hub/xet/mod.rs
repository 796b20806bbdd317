//! The native Xet path through HF's own client (`hf-xet`, imported as `xet`): one download-stream
//! group per repo download, seeded with a CAS token spark-kit fetched from the Hub's
//! `xet-read-token` route (`token`; hf-xet refreshes it 30 s before `exp`), and ranged streams
//! of a file's reconstruction that the range workers write at the file offset
//! (src/hub/fetch/worker.rs). Whether a failure was a refused token is judged from hf-xet's
//! error variant and, where that cannot tell, from the CAS's own answer to the token, never from
//! error text; a refused token drops the group, so the next stream fetches a fresh one. hf-xet
//! asks the CAS for the reconstruction of each requested range only (a range request is at most
//! `--range-size`, far below the 10 GB batches the protocol recommends), fetches the xorb ranges
//! it names and decodes their chunks. Retries stay with the range workers (reported, counted,
//! resumable), so hf-xet's own are turned off. hf-xet's working directories: `scratch`. See
//! docs/download.md.

pub mod scratch;
pub mod token;

use std::ops::Range;
use std::path::PathBuf;

use xet::xet_session::{
    HeaderMap, HeaderValue, SessionError, XetConfig, XetDownloadStream, XetDownloadStreamGroup, XetFileInfo,
    XetSession, XetSessionBuilder,
};

use token::{CasToken, Verdict};

/// hf-xet's client settings for spark-kit: one attempt per request (the range workers retry).
const CONFIG: &[(&str, &str)] = &[("client.retry_max_attempts", "1")];

/// A failure of the Xet path, the token generation it happened under, and hf-xet's typed error
/// when it came from hf-xet.
#[derive(Debug)]
pub struct XetFailure {
    pub reason: String,
    pub generation: u32,
    pub cause: Option<SessionError>,
    /// The Hub's token route refused outright (401/403): retrying cannot help.
    pub refused: Option<u16>,
}

struct Inner {
    session: Option<XetSession>,
    group: Option<XetDownloadStreamGroup>,
    generation: u32,
    /// The token the current group was seeded with.
    token: Option<CasToken>,
}

/// The Xet side of one repo download (one token route: repo and commit).
pub struct XetSource {
    http: reqwest::Client,
    token_url: String,
    hub_auth: Option<String>,
    scratch: PathBuf,
    inner: tokio::sync::Mutex<Inner>,
}

impl XetSource {
    /// `token_url`: the `xet-auth` link of the repo's `resolve` answers; `hub_auth`: the
    /// `Authorization` value for it; `scratch`: hf-xet's working directory; `http`: the client
    /// that fetches tokens and asks the CAS about one.
    #[must_use]
    pub fn new(http: reqwest::Client, token_url: String, hub_auth: Option<String>, scratch: PathBuf) -> Self {
        Self {
            http,
            token_url,
            hub_auth,
            scratch,
            inner: tokio::sync::Mutex::new(Inner { session: None, group: None, generation: 0, token: None }),
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
        let fail = |reason: String| XetFailure { reason, generation, cause: None, refused: None };
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
        let t = token::fetch(&self.http, &self.token_url, self.hub_auth.as_deref()).await.map_err(|e| {
            let refused = e.refusal();
            XetFailure { refused, ..fail(format!("no CAS token from {}: {e}", self.token_url)) }
        })?;
        // Seeded with our token; hf-xet refreshes it from the same route before `exp`.
        let group = session
            .new_download_stream_group()
            .map_err(|e| fail(format!("Xet client: {e}")))?
            .with_endpoint(t.cas_url.clone())
            .with_token_info(t.token.clone(), t.exp)
            .with_token_refresh_url(self.token_url.clone(), headers)
            .build()
            .await
            .map_err(|e| fail(format!("Xet client for {}: {e}", t.cas_url)))?;
        inner.group = Some(group.clone());
        inner.token = Some(t);
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
        let mut s = group.download_stream(info, Some(range)).await.map_err(|e| XetFailure {
            reason: format!("reconstruction failed: {e}"),
            generation,
            cause: Some(e),
            refused: None,
        })?;
        s.start();
        Ok((s, generation))
    }

    /// After a failure under `generation` with hf-xet's error `cause` (while fetching `hash`):
    /// whether the CAS token was refused, judged from the error's variant and, where that
    /// cannot tell, from the CAS's own answer to the same token. A refused token drops the group
    /// of `generation`, so the next stream fetches a fresh token. Returns whether it did.
    pub async fn judge(&self, generation: u32, cause: &SessionError, hash: &str) -> bool {
        let refused = match token::verdict(cause) {
            Verdict::NotToken => false,
            Verdict::Refused => true,
            Verdict::Ask => {
                let t = self.inner.lock().await.token.clone();
                match t {
                    // hf-xet holds a token of its own by now: start over with one we know.
                    Some(t) if token::superseded(&t, unix_now()) => true,
                    Some(t) => token::refused_by_cas(&self.http, &t, hash).await,
                    None => false,
                }
            }
        };
        if refused {
            self.renew(generation).await;
        }
        refused
    }

    /// Drop the group of `generation` (its token was refused): the next stream builds a new one,
    /// which fetches a fresh token. Later generations are left alone.
    async fn renew(&self, generation: u32) {
        let mut inner = self.inner.lock().await;
        if inner.generation == generation {
            inner.group = None;
            inner.token = None;
            inner.generation += 1;
        }
    }
}

fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}
