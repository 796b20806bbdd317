//! What an engine error response means for the gateway. Pure.
//!
//! vLLM answers `500 EngineCore encountered an issue…` (its `EngineDeadError`) in the moment
//! after its engine core died, before the supervisor has noticed: that is a restart, not a
//! server error. Released vLLM also refuses work itself when its own queue is full
//! (`--max-num-queued-reqs`, `--max-num-queued-tokens`: 503 with `QueueOverflowError` /
//! `MaxQueuedTokensError`'s message): that is overload, not a restart.

/// vLLM's `EngineDeadError` message (vllm/v1/engine/exceptions.py).
pub const ENGINE_DEAD: &str = "EngineCore encountered an issue";
/// vLLM's `QueueOverflowError` message start (vllm/exceptions.py), reason `max_num_queued_reqs`.
pub const QUEUE_OVERFLOW: &str = "The engine is currently busy and cannot accept new requests";
/// vLLM's `MaxQueuedTokensError` message start, reason `max_num_queued_tokens`.
pub const QUEUED_TOKENS: &str = "The engine has reached its prefill token backlog limit";

/// An engine error the gateway answers for itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The engine core died: the deployment is restarting (503 + Retry-After).
    EngineDead,
    /// vLLM's own admission refused the request (429 + Retry-After); the reason as vLLM's
    /// `vllm:admission_rejections_total{reason}` labels it.
    Overloaded(&'static str),
}

/// Error bodies are small; a longer one is not read for a verdict.
pub const MAX_ERROR_BODY: usize = 64 << 10;

/// The verdict on an engine response of `status` with `body`, when it is one of those shapes.
#[must_use]
pub fn classify(status: u16, body: &[u8]) -> Option<Verdict> {
    let message = serde_json::from_slice::<serde_json::Value>(body).ok().and_then(|v| {
        let e = v.get("error")?;
        e.get("message").or(Some(e))?.as_str().map(str::to_string)
    });
    let text = message.unwrap_or_else(|| String::from_utf8_lossy(body).into_owned());
    match status {
        500..=599 if text.contains(ENGINE_DEAD) || text.contains("EngineDeadError") => Some(Verdict::EngineDead),
        503 if text.contains(QUEUE_OVERFLOW) => Some(Verdict::Overloaded("max_num_queued_reqs")),
        503 if text.contains(QUEUED_TOKENS) => Some(Verdict::Overloaded("max_num_queued_tokens")),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vllm_error(message: &str, kind: &str, code: u16) -> Vec<u8> {
        serde_json::json!({"error": {"message": message, "type": kind, "param": null, "code": code}})
            .to_string()
            .into_bytes()
    }

    #[test]
    fn engine_death_is_a_restart() {
        let b = vllm_error(
            "EngineCore encountered an issue. See stack trace (above) for the root cause.",
            "InternalServerError",
            500,
        );
        assert_eq!(classify(500, &b), Some(Verdict::EngineDead));
        assert_eq!(classify(500, b"{\"detail\": \"EngineDeadError\"}"), Some(Verdict::EngineDead));
        assert_eq!(classify(500, &vllm_error("Internal server error", "InternalServerError", 500)), None);
    }

    #[test]
    fn vllm_admission_refusals_are_overload_with_their_reason() {
        let reqs = vllm_error(
            "The engine is currently busy and cannot accept new requests. Please try again later or on a different instance.",
            "Service Unavailable",
            503,
        );
        assert_eq!(classify(503, &reqs), Some(Verdict::Overloaded("max_num_queued_reqs")));
        let toks = vllm_error(
            "The engine has reached its prefill token backlog limit. Please try again later or on a different instance.",
            "Service Unavailable",
            503,
        );
        assert_eq!(classify(503, &toks), Some(Verdict::Overloaded("max_num_queued_tokens")));
        assert_eq!(classify(400, &toks), None);
        assert_eq!(classify(503, b"busy"), None);
    }
}
