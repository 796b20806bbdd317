//! Response bodies from the engine to the client: SSE event by event with TTFT and inter-token
//! timing, a terminal error event when the engine cuts the stream, and the slot held until the
//! body is done. Dropping the body (client gone) drops the engine request with it.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use axum::body::{Body, Bytes};
use futures_util::{Stream, StreamExt};
use tokio::sync::watch;

use super::framing::terminal_error;
use super::state::{Gateway, InFlight};
use crate::sse::{parse_event, Aligner, Event, SseParser};

type Upstream = Pin<Box<dyn Stream<Item = reqwest::Result<Bytes>> + Send>>;

/// Message of the error event that ends a stream the engine cut.
pub const CUT_MESSAGE: &str =
    "the engine's stream ended before [DONE] (the engine died or restarted); the answer is incomplete: retry the request";
/// Message of the error event that ends a stream still open when the drain timeout passed.
pub const DRAIN_MESSAGE: &str =
    "the gateway is stopping and the drain timeout passed; the answer is incomplete: retry the request later";

struct Sse {
    upstream: Upstream,
    aligner: Aligner,
    parser: SseParser,
    started: Instant,
    last_text: Option<Instant>,
    done: bool,
    finished: bool,
    cut: watch::Receiver<bool>,
    gw: Arc<Gateway>,
    _slot: Option<InFlight>,
}

impl Sse {
    fn observe(&mut self, bytes: &[u8]) {
        for payload in self.parser.feed(bytes) {
            match parse_event(&payload) {
                Ok(Event::Done) => self.done = true,
                Ok(Event::Chunk(c)) if c.has_text() => {
                    let now = Instant::now();
                    match self.last_text {
                        None => self.gw.metrics.ttft(now - self.started),
                        Some(t) => self.gw.metrics.inter_token(now - t),
                    }
                    self.last_text = Some(now);
                }
                Ok(Event::Chunk(_)) | Err(_) => {}
            }
        }
    }

    async fn next_out(&mut self) -> Option<Bytes> {
        loop {
            if self.finished {
                return None;
            }
            let item = tokio::select! {
                item = self.upstream.next() => item,
                changed = async { self.cut.wait_for(|c| *c).await.map(|_| ()) } => {
                    if changed.is_err() {
                        // The gateway is gone; nothing will cut this stream: keep reading.
                        self.upstream.next().await
                    } else {
                        self.finished = true;
                        self.gw.metrics.stream_cut();
                        return Some(Bytes::from(terminal_error(DRAIN_MESSAGE)));
                    }
                }
            };
            match item {
                Some(Ok(bytes)) => {
                    let out = self.aligner.feed(&bytes);
                    if out.is_empty() {
                        continue;
                    }
                    self.observe(&out);
                    return Some(Bytes::from(out));
                }
                Some(Err(_)) | None => {
                    self.finished = true;
                    if self.done {
                        return None;
                    }
                    self.gw.metrics.stream_cut();
                    return Some(Bytes::from(terminal_error(CUT_MESSAGE)));
                }
            }
        }
    }
}

/// An SSE body: whole events passed on as they complete, ended with the error event if cut.
pub(crate) fn sse_body(gw: Arc<Gateway>, resp: reqwest::Response, started: Instant, slot: Option<InFlight>) -> Body {
    let state = Sse {
        upstream: Box::pin(resp.bytes_stream()),
        aligner: Aligner::new(),
        parser: SseParser::new(),
        started,
        last_text: None,
        done: false,
        finished: false,
        cut: gw.cut.subscribe(),
        gw,
        _slot: slot,
    };
    let s = futures_util::stream::unfold(state, |mut st| async move {
        let out = st.next_out().await?;
        Some((Ok::<_, std::io::Error>(out), st))
    });
    Body::from_stream(s)
}

/// Any other body: bytes as they arrive; the slot is held until it ends.
pub(crate) fn plain_body(resp: reqwest::Response, slot: Option<InFlight>) -> Body {
    let s = resp.bytes_stream().map(move |item| {
        let _hold = &slot;
        item.map_err(std::io::Error::other)
    });
    Body::from_stream(s)
}
