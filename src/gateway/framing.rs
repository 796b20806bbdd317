//! OpenAI-style error bodies and the events that end a cut stream. Pure.
//!
//! The gateway forwards a streamed body event by event with [`crate::sse::Aligner`], so a stream
//! cut by the upstream never leaves half an event at the client; it then appends
//! [`terminal_error`] — an `{"error": …}` event and `data: [DONE]`.

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
    use crate::sse::{parse_event, Event, SseParser};

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
