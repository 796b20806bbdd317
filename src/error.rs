//! Error classes and their exit codes.
//!
//! | code | meaning |
//! |------|---------|
//! | 0 | success |
//! | 1 | runtime failure (network, I/O, engine, a check that failed) |
//! | 2 | usage or configuration error (bad flag, bad kit, bad `--set`) |
//! | 130 / 143 | a foreground `up` stopped by Ctrl-C / SIGTERM (everything was stopped) |

use std::fmt;

/// Process exit codes, documented in `docs/cli.md`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitCode {
    Ok = 0,
    Runtime = 1,
    Usage = 2,
    /// Stopped by Ctrl-C (128 + SIGINT), as shells expect.
    Interrupted = 130,
    /// Stopped by SIGTERM (128 + 15).
    Terminated = 143,
}

/// The error a command returns to `main`: one line of text, an optional fix, and the class.
#[derive(Debug)]
pub struct Failure {
    pub code: ExitCode,
    pub message: String,
    pub hint: Option<String>,
}

impl Failure {
    pub fn usage(message: impl Into<String>) -> Self {
        Self { code: ExitCode::Usage, message: message.into(), hint: None }
    }
    pub fn runtime(message: impl Into<String>) -> Self {
        Self { code: ExitCode::Runtime, message: message.into(), hint: None }
    }
    /// The exit of a command that a signal stopped cleanly: nothing more to print.
    #[must_use]
    pub fn signalled(sig: i32) -> Self {
        let code = if sig == 15 { ExitCode::Terminated } else { ExitCode::Interrupted };
        Self { code, message: String::new(), hint: None }
    }
    #[must_use]
    pub fn with_hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Failure {}
