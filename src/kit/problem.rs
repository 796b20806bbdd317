//! One configuration problem: where, which key, what is wrong, how to fix it.

use std::fmt;

use super::origin::Origin;

/// Rendered as one line: `<origin>: <key>: <message>; fix: <fix>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub origin: Origin,
    pub key: String,
    pub message: String,
    pub fix: String,
}

impl Problem {
    pub fn new(origin: Origin, key: impl Into<String>, message: impl Into<String>, fix: impl Into<String>) -> Self {
        Self { origin, key: key.into(), message: message.into(), fix: fix.into() }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let key = if self.key.is_empty() { "(top level)" } else { &self.key };
        write!(f, "{}: {key}: {}; fix: {}", self.origin, self.message, self.fix)
    }
}
