//! SSE pass-through framing and OpenAI-style error bodies. Pure.
//!
//! [`Aligner`] forwards a streamed body event by event: bytes are handed on as soon as the event
//! they belong to is complete (the blank line that ends it has arrived), so a stream cut by the
//! upstream never leaves half an event at the client; the gateway then appends
//! [`terminal_error`] — an `{"error": …}` event and `data: [DONE]`.

/// Held bytes of one unfinished event beyond which they are passed on anyway (a stream that is
/// not SSE-conformant must not grow the gateway's memory without bound).
pub const MAX_PENDING: usize = 1 << 20;

/// Splits arriving bytes at SSE event boundaries.
#[derive(Debug, Default)]
pub struct Aligner {
    pending: Vec<u8>,
    /// Length of the current line so far, `\r` not counted.
    line_len: usize,
}

impl Aligner {
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Feed bytes; returns the complete events they finish (possibly empty), in one slice.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<u8> {
        let mut cut = None;
        let base = self.pending.len();
        for (i, &b) in bytes.iter().enumerate() {
            match b {
                b'\n' => {
                    if self.line_len == 0 {
                        cut = Some(base + i + 1);
                    }
                    self.line_len = 0;
                }
                b'\r' => {}
                _ => self.line_len += 1,
            }
        }
        self.pending.extend_from_slice(bytes);
        match cut {
            Some(n) => {
                let rest = self.pending.split_off(n);
                std::mem::replace(&mut self.pending, rest)
            }
            None if self.pending.len() > MAX_PENDING => std::mem::take(&mut self.pending),
            None => Vec::new(),
        }
    }

    /// Bytes of an event that has not been completed (dropped when the stream is cut).
    #[must_use]
    pub fn pending(&self) -> &[u8] {
        &self.pending
    }
}

/// An OpenAI-style error object: `{"error": {"message", "type", "param", "code"}}`.
#[must_use]
pub fn error_body(message: &str, kind: &str, code: &str) -> serde_json::Value {
    serde_json::json!({"error": {"message": message, "type": kind, "param": null, "code": code}})
}

/// The events that end a stream the upstream cut: an error event, then `data: [DONE]`.
#[must_use]
pub fn terminal_error(message: &str) -> Vec<u8> {
    let body = error_body(message, "server_error", "upstream_stream_cut");
    format!("data: {body}\n\ndata: [DONE]\n\n").into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::sse::{parse_event, Event, SseParser};

    #[test]
    fn whole_events_pass_at_once() {
        let mut a = Aligner::new();
        assert_eq!(a.feed(b"data: 1\n\ndata: 2\n\n"), b"data: 1\n\ndata: 2\n\n");
        assert!(a.pending().is_empty());
    }

    #[test]
    fn split_events_are_held_until_complete() {
        let mut a = Aligner::new();
        assert_eq!(a.feed(b"data: {\"a\""), b"");
        assert_eq!(a.feed(b":1}\n"), b"");
        assert_eq!(a.feed(b"\ndata: 2"), b"data: {\"a\":1}\n\n");
        assert_eq!(a.pending(), b"data: 2");
        assert_eq!(a.feed(b"\r\n\r\n"), b"data: 2\r\n\r\n");
    }

    #[test]
    fn an_endless_event_is_passed_on_past_the_cap() {
        let mut a = Aligner::new();
        let big = vec![b'x'; MAX_PENDING];
        assert!(a.feed(&big).is_empty());
        assert_eq!(a.feed(b"y").len(), MAX_PENDING + 1);
        assert!(a.pending().is_empty());
    }

    #[test]
    fn multi_line_events_stay_whole() {
        let mut a = Aligner::new();
        assert_eq!(a.feed(b"event: x\ndata: 1\n"), b"");
        assert_eq!(a.feed(b"\n"), b"event: x\ndata: 1\n\n");
    }

    #[test]
    fn terminal_error_is_an_error_event_then_done() {
        let mut p = SseParser::new();
        let events = p.feed(&terminal_error("engine died"));
        assert_eq!(events.len(), 2);
        match parse_event(&events[0]).unwrap() {
            Event::Chunk(c) => assert_eq!(c.error.as_deref(), Some("engine died")),
            Event::Done => panic!("first event must be the error"),
        }
        assert_eq!(parse_event(&events[1]).unwrap(), Event::Done);
    }

    #[test]
    fn error_body_is_openai_shaped() {
        let b = error_body("m", "invalid_request_error", "c");
        assert_eq!(b["error"]["message"], "m");
        assert_eq!(b["error"]["type"], "invalid_request_error");
        assert_eq!(b["error"]["code"], "c");
        assert!(b["error"]["param"].is_null());
    }
}
