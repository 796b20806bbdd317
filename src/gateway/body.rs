//! Reading a generation request's JSON body, with messages that say what is wrong. Pure.

use serde_json::{Map, Value};

/// The body as a JSON object, or a one-line message for the 400 and its error code.
pub fn request_object(body: &[u8]) -> Result<Map<String, Value>, (String, &'static str)> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(other) => Err((
            format!(
                "request body is a JSON {}, not an object: send one object such as {{\"model\": \"…\", \"messages\": […]}}",
                kind(&other)
            ),
            "invalid_json",
        )),
        Err(e) => Err(match lone_surrogate(body) {
            Some((esc, at)) => {
                let (line, col) = line_col(body, at);
                (
                    format!(
                        "request body is not valid JSON: the escape {esc} at line {line} column {col} is a lone UTF-16 \
                         surrogate (half of a pair, no character): send the text as UTF-8, or both halves of the pair \
                         (e.g. \\ud83d\\ude00)"
                    ),
                    "invalid_json",
                )
            }
            None => (format!("request body is not JSON: {e}"), "invalid_json"),
        }),
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Array(_) => "array",
        Value::String(_) => "string",
        Value::Number(_) => "number",
        Value::Bool(_) => "boolean",
        Value::Null | Value::Object(_) => "null",
    }
}

/// The first `\uD800`–`\uDFFF` escape that is not part of a high-low pair: its text and byte offset.
#[must_use]
pub fn lone_surrogate(body: &[u8]) -> Option<(String, usize)> {
    let escape = |i: usize| -> Option<u16> {
        let hex = body.get(i..i + 6)?;
        if hex[0] != b'\\' || hex[1] != b'u' || !hex[2..].iter().all(u8::is_ascii_hexdigit) {
            return None;
        }
        u16::from_str_radix(std::str::from_utf8(&hex[2..]).ok()?, 16).ok()
    };
    let mut i = 0;
    while i < body.len() {
        if body[i] != b'\\' {
            i += 1;
            continue;
        }
        match escape(i) {
            Some(hi @ 0xD800..=0xDBFF) => {
                if matches!(escape(i + 6), Some(0xDC00..=0xDFFF)) {
                    i += 12;
                    continue;
                }
                return Some((format!("\\u{hi:04x}"), i));
            }
            Some(lo @ 0xDC00..=0xDFFF) => return Some((format!("\\u{lo:04x}"), i)),
            Some(_) => i += 6,
            // Any other escape (`\\`, `\"`, `\n`): two bytes.
            None => i += 2,
        }
    }
    None
}

/// 1-based line and column (in bytes) of a byte offset.
fn line_col(body: &[u8], at: usize) -> (usize, usize) {
    let before = &body[..at.min(body.len())];
    let line = before.iter().filter(|b| **b == b'\n').count() + 1;
    let col = at - before.iter().rposition(|b| *b == b'\n').map_or(0, |p| p + 1) + 1;
    (line, col)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_object_is_read() {
        assert_eq!(request_object(br#"{"a": 1}"#).unwrap()["a"], 1);
    }

    #[test]
    fn an_array_is_named_as_such() {
        let (msg, code) = request_object(br#"[{"prompt": "x"}]"#).unwrap_err();
        assert!(msg.starts_with("request body is a JSON array, not an object"), "{msg}");
        assert!(!msg.contains("prompt must be"), "{msg}");
        assert_eq!(code, "invalid_json");
    }

    #[test]
    fn a_lone_surrogate_is_named_with_its_place() {
        for (body, esc, col) in [
            (r#"{"prompt": "\ud800"}"#, "\\ud800", 13),
            (r#"{"prompt": "a\ud800b"}"#, "\\ud800", 14),
            (r#"{"prompt": "\udc00 x"}"#, "\\udc00", 13),
            (r#"{"prompt": "\uD800\u0041"}"#, "\\ud800", 13),
        ] {
            let (msg, _) = request_object(body.as_bytes()).unwrap_err();
            assert!(
                msg.contains(&format!("the escape {esc} at line 1 column {col} is a lone UTF-16 surrogate")),
                "{msg}"
            );
            assert!(!msg.contains("hex escape"), "{msg}");
        }
        // A pair is a character, and `\\u` is an escaped backslash, not an escape.
        assert!(request_object(br#"{"prompt": "\ud83d\ude00 \\ud800"}"#).is_ok());
        assert_eq!(lone_surrogate(br#""\\ud800""#), None);
    }

    #[test]
    fn other_syntax_errors_keep_serde_s_message() {
        let (msg, _) = request_object(b"{\"a\": ").unwrap_err();
        assert!(msg.starts_with("request body is not JSON: EOF"), "{msg}");
    }
}
