//! Server-sent events of an OpenAI-compatible streaming response: the one SSE parser of the crate,
//! shared by `bench` (which times the events) and `gateway` (which passes them on and times them).
//!
//! A leaf: pure functions, no I/O, no import from the crate (tests/rules/import_rules.rs).
//! [`SseParser`] turns arbitrary byte slices (as they arrive from the socket) into complete event
//! payloads; [`Aligner`] cuts the raw bytes at event boundaries for a pass-through that never
//! forwards half an event; [`parse_event`] decodes one payload into what the metrics need: whether
//! it carried generated text (content or reasoning), the usage block, and a server error if the
//! stream reports one.

/// Splits a byte stream into SSE event payloads (the `data:` lines of one event, joined by `\n`).
///
/// Lines end with `\n` or `\r\n`; an empty line ends an event; lines starting with `:` are
/// comments; fields other than `data` (`event`, `id`, `retry`) are ignored.
#[derive(Debug, Default)]
pub struct SseParser {
    line: Vec<u8>,
    data: Vec<String>,
}

impl SseParser {
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Feed the next bytes; returns the payloads of the events they complete, in order.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<String> {
        let mut events = Vec::new();
        for &b in bytes {
            if b == b'\n' {
                if self.line.last() == Some(&b'\r') {
                    self.line.pop();
                }
                let line = std::mem::take(&mut self.line);
                if let Some(ev) = self.end_line(&line) {
                    events.push(ev);
                }
            } else {
                self.line.push(b);
            }
        }
        events
    }

    /// The stream ended: the payload of an event that was not terminated by an empty line.
    pub fn finish(&mut self) -> Option<String> {
        let line = std::mem::take(&mut self.line);
        if !line.is_empty() {
            // A last line without its newline still counts as a line.
            let _ = self.end_line(&line);
        }
        self.dispatch()
    }

    fn end_line(&mut self, line: &[u8]) -> Option<String> {
        if line.is_empty() {
            return self.dispatch();
        }
        if line.starts_with(b":") {
            return None;
        }
        let text = String::from_utf8_lossy(line);
        let (field, value) = match text.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (text.as_ref(), ""),
        };
        if field == "data" {
            self.data.push(value.to_string());
        }
        None
    }

    fn dispatch(&mut self) -> Option<String> {
        if self.data.is_empty() {
            return None;
        }
        Some(std::mem::take(&mut self.data).join("\n"))
    }
}

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

/// Token counts from the `usage` block of a stream's final chunk.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    /// `usage.prompt_tokens_details.cached_tokens` (prefix-cache hits), 0 when absent.
    pub cached_tokens: u64,
}

/// What one event payload means for the measurement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// `data: [DONE]`: the stream is complete.
    Done,
    /// A `chat.completion.chunk` (or legacy `text_completion`) object.
    Chunk(Chunk),
}

/// The parts of one chunk the metrics use.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Chunk {
    /// Characters of `delta.content` (or legacy `text`) in this chunk.
    pub content_chars: usize,
    /// Characters of `delta.reasoning_content` / `delta.reasoning` in this chunk.
    pub reasoning_chars: usize,
    pub usage: Option<Usage>,
    pub finish_reason: Option<String>,
    /// An `{"error": …}` object sent inside the stream.
    pub error: Option<String>,
}

impl Chunk {
    /// Whether this chunk carries generated text (content or reasoning): the TTFT event.
    #[must_use]
    pub fn has_text(&self) -> bool {
        self.content_chars > 0 || self.reasoning_chars > 0
    }
}

/// A malformed event payload (clipped to 160 bytes in the message).
#[derive(Debug, thiserror::Error)]
pub enum EventError {
    #[error("stream event is not JSON ({source}): {data}")]
    NotJson {
        data: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("stream event is not a JSON object: {0}")]
    NotObject(String),
    #[error("usage block without prompt_tokens/completion_tokens: {0}")]
    Usage(String),
}

/// Decode one event payload.
pub fn parse_event(data: &str) -> Result<Event, EventError> {
    let data = data.trim();
    if data == "[DONE]" {
        return Ok(Event::Done);
    }
    let v: serde_json::Value =
        serde_json::from_str(data).map_err(|source| EventError::NotJson { data: clip(data), source })?;
    let mut chunk = Chunk::default();
    if let Some(err) = v.get("error") {
        let msg =
            err.get("message").and_then(serde_json::Value::as_str).map_or_else(|| err.to_string(), str::to_string);
        chunk.error = Some(msg);
        return Ok(Event::Chunk(chunk));
    }
    if !v.is_object() {
        return Err(EventError::NotObject(clip(data)));
    }
    if let Some(choices) = v.get("choices").and_then(serde_json::Value::as_array) {
        for choice in choices {
            let text_len = |x: Option<&serde_json::Value>| x.and_then(serde_json::Value::as_str).map_or(0, str::len);
            if let Some(delta) = choice.get("delta") {
                chunk.content_chars += text_len(delta.get("content"));
                chunk.reasoning_chars += text_len(delta.get("reasoning_content")) + text_len(delta.get("reasoning"));
            }
            chunk.content_chars += text_len(choice.get("text"));
            if let Some(r) = choice.get("finish_reason").and_then(serde_json::Value::as_str) {
                chunk.finish_reason = Some(r.to_string());
            }
        }
    }
    if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
        let n = |x: Option<&serde_json::Value>| x.and_then(serde_json::Value::as_u64);
        let (Some(prompt_tokens), Some(completion_tokens)) = (n(u.get("prompt_tokens")), n(u.get("completion_tokens")))
        else {
            return Err(EventError::Usage(clip(&u.to_string())));
        };
        let cached_tokens = n(u.get("prompt_tokens_details").and_then(|d| d.get("cached_tokens"))).unwrap_or(0);
        chunk.usage = Some(Usage { prompt_tokens, completion_tokens, cached_tokens });
    }
    Ok(Event::Chunk(chunk))
}

fn clip(s: &str) -> String {
    const MAX: usize = 160;
    if s.len() <= MAX {
        return s.to_string();
    }
    let mut end = MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_split_anywhere() {
        let stream = b"data: {\"a\":1}\n\n: keep-alive\n\ndata: [DONE]\n\n";
        for split in 0..stream.len() {
            let mut p = SseParser::new();
            let mut got = p.feed(&stream[..split]);
            got.extend(p.feed(&stream[split..]));
            assert_eq!(got, vec!["{\"a\":1}".to_string(), "[DONE]".to_string()], "split at {split}");
            assert_eq!(p.finish(), None);
        }
    }

    #[test]
    fn crlf_multiline_fields_and_unterminated_tail() {
        let mut p = SseParser::new();
        let got = p.feed(b"event: message\r\nid: 7\r\ndata: one\r\ndata:two\r\n\r\ndata: tail");
        assert_eq!(got, vec!["one\ntwo".to_string()]);
        assert_eq!(p.finish(), Some("tail".to_string()));
    }

    #[test]
    fn content_reasoning_usage_and_done() {
        let c = r#"{"choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":null}]}"#;
        let Event::Chunk(ch) = parse_event(c).unwrap() else { panic!() };
        assert_eq!((ch.content_chars, ch.reasoning_chars, ch.has_text()), (2, 0, true));

        let r = r#"{"choices":[{"delta":{"reasoning_content":"hmm"}}]}"#;
        let Event::Chunk(ch) = parse_event(r).unwrap() else { panic!() };
        assert_eq!((ch.content_chars, ch.reasoning_chars), (0, 3));
        let r = r#"{"choices":[{"delta":{"reasoning":"ok","content":null}}]}"#;
        let Event::Chunk(ch) = parse_event(r).unwrap() else { panic!() };
        assert!(ch.has_text());

        // Role-only first chunk: no text, so it is not the TTFT event.
        let role = r#"{"choices":[{"delta":{"role":"assistant","content":""}}]}"#;
        let Event::Chunk(ch) = parse_event(role).unwrap() else { panic!() };
        assert!(!ch.has_text());

        let u = r#"{"choices":[],"usage":{"prompt_tokens":256,"completion_tokens":31,"total_tokens":287,
                   "prompt_tokens_details":{"cached_tokens":16}}}"#;
        let Event::Chunk(ch) = parse_event(u).unwrap() else { panic!() };
        assert_eq!(ch.usage, Some(Usage { prompt_tokens: 256, completion_tokens: 31, cached_tokens: 16 }));
        let u = r#"{"choices":[{"delta":{},"finish_reason":"length"}],"usage":null}"#;
        let Event::Chunk(ch) = parse_event(u).unwrap() else { panic!() };
        assert_eq!((ch.usage, ch.finish_reason.as_deref()), (None, Some("length")));

        assert_eq!(parse_event(" [DONE] ").unwrap(), Event::Done);
    }

    #[test]
    fn legacy_text_and_errors() {
        let t = r#"{"object":"text_completion","choices":[{"text":"abc"}]}"#;
        let Event::Chunk(ch) = parse_event(t).unwrap() else { panic!() };
        assert_eq!(ch.content_chars, 3);
        let e = r#"{"error":{"message":"out of memory","code":500}}"#;
        let Event::Chunk(ch) = parse_event(e).unwrap() else { panic!() };
        assert_eq!(ch.error.as_deref(), Some("out of memory"));
        assert!(parse_event("not json").unwrap_err().to_string().contains("not JSON"));
        assert!(parse_event("[1,2]").unwrap_err().to_string().contains("not a JSON object"));
        assert!(parse_event(r#"{"usage":{"total_tokens":3}}"#).unwrap_err().to_string().contains("usage block"));
    }

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
}
