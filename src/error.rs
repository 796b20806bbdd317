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

/// The error a command returns to `main`: what failed, the causes below it, an optional fix,
/// and the class. `main` prints it once with [`Failure::render`].
#[derive(Debug)]
pub struct Failure {
    pub code: ExitCode,
    pub message: String,
    /// The `#[source]` chain below `message`, outermost first.
    pub causes: Vec<String>,
    pub hint: Option<String>,
}

impl Failure {
    pub fn usage(message: impl Into<String>) -> Self {
        Self { code: ExitCode::Usage, message: message.into(), causes: Vec::new(), hint: None }
    }
    pub fn runtime(message: impl Into<String>) -> Self {
        Self { code: ExitCode::Runtime, message: message.into(), causes: Vec::new(), hint: None }
    }
    /// A runtime failure from a typed error: its message, and its `source()` chain as causes.
    pub fn runtime_error(e: &(dyn std::error::Error + 'static)) -> Self {
        Self::runtime(e.to_string()).caused_by_chain_of(e)
    }
    /// A usage / configuration failure from a typed error (see [`Failure::runtime_error`]).
    pub fn usage_error(e: &(dyn std::error::Error + 'static)) -> Self {
        Self::usage(e.to_string()).caused_by_chain_of(e)
    }
    /// The exit of a command that a signal stopped cleanly: nothing more to print.
    #[must_use]
    pub fn signalled(sig: i32) -> Self {
        let code = if sig == 15 { ExitCode::Terminated } else { ExitCode::Interrupted };
        Self { code, message: String::new(), causes: Vec::new(), hint: None }
    }
    #[must_use]
    pub fn with_hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }
    /// `hint` if there is one (for the `hint()` methods of typed errors).
    #[must_use]
    pub fn with_hint_opt(mut self, hint: Option<String>) -> Self {
        if hint.is_some() {
            self.hint = hint;
        }
        self
    }
    /// Add the `source()` chain below `e` (not `e` itself) as causes.
    #[must_use]
    pub fn caused_by_chain_of(mut self, e: &(dyn std::error::Error + 'static)) -> Self {
        self.causes.extend(chain(e));
        self
    }
    /// The text `main` prints: one `error:` line per line of the message, one `caused by:` line
    /// per cause (a cause whose text the lines above already say is left out: many messages name
    /// their cause inline), then `hint:`. Empty for [`Failure::signalled`].
    #[must_use]
    pub fn render(&self) -> String {
        let mut out = String::new();
        for line in self.message.lines() {
            out.push_str("error: ");
            out.push_str(line);
            out.push('\n');
        }
        let mut said = self.message.clone();
        for cause in &self.causes {
            if cause.is_empty() || said.contains(cause.as_str()) {
                continue;
            }
            for line in cause.lines() {
                out.push_str("caused by: ");
                out.push_str(line);
                out.push('\n');
            }
            said.push('\n');
            said.push_str(cause);
        }
        if let Some(h) = &self.hint {
            out.push_str("hint: ");
            out.push_str(h);
            out.push('\n');
        }
        out
    }
}

/// What a library error tells `main` about itself: its class (exit code) and a one-line fix.
/// Every error a command meets implements it (`commands/classes.rs`, one table), so a command
/// ends a fallible call in `?`: [`Failure`]'s `From` keeps the message, the whole `source()`
/// chain (`caused by:`), the class and the hint.
pub trait Classified: std::error::Error + 'static {
    /// The exit class: a runtime failure unless the error says the input was wrong.
    fn exit_code(&self) -> ExitCode {
        ExitCode::Runtime
    }
    /// A one-line fix, where there is one.
    fn hint(&self) -> Option<String> {
        None
    }
}

impl<E: Classified> From<E> for Failure {
    fn from(e: E) -> Self {
        Self { code: e.exit_code(), message: e.to_string(), causes: chain(&e), hint: Classified::hint(&e) }
    }
}

/// The messages of the errors below `e` (its `source()`, that one's source, …), outermost first.
#[must_use]
pub fn chain(e: &(dyn std::error::Error + 'static)) -> Vec<String> {
    let mut out = Vec::new();
    let mut next = e.source();
    while let Some(s) = next {
        out.push(s.to_string());
        next = s.source();
    }
    out
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Failure {}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    enum Outer {
        #[error("cannot load the kit")]
        Load(#[source] Middle),
    }
    #[derive(Debug, thiserror::Error)]
    #[error("cannot read kit.yaml")]
    struct Middle(#[source] std::io::Error);

    #[test]
    fn renders_error_causes_and_hint_once() {
        let e = Outer::Load(Middle(std::io::Error::other("permission denied")));
        let f = Failure::usage_error(&e).with_hint("check the file's permissions");
        assert_eq!(f.code, ExitCode::Usage);
        assert_eq!(
            f.render(),
            "error: cannot load the kit\ncaused by: cannot read kit.yaml\ncaused by: permission denied\nhint: check the file's permissions\n"
        );
    }

    #[test]
    fn a_cause_the_message_already_names_is_not_repeated() {
        #[derive(Debug, thiserror::Error)]
        #[error("cannot read kit.yaml: {0}")]
        struct Inline(#[source] std::io::Error);
        let f = Failure::runtime_error(&Inline(std::io::Error::other("permission denied")));
        assert_eq!(f.render(), "error: cannot read kit.yaml: permission denied\n");
    }

    impl Classified for Outer {
        fn exit_code(&self) -> ExitCode {
            ExitCode::Usage
        }
        fn hint(&self) -> Option<String> {
            Some("check the file's permissions".into())
        }
    }

    fn load() -> Result<(), Outer> {
        Err(Outer::Load(Middle(std::io::Error::other("permission denied"))))
    }

    fn command() -> Result<(), Failure> {
        load()?;
        Ok(())
    }

    #[test]
    fn a_classified_error_ends_in_a_question_mark_with_its_class_chain_and_hint() {
        let f = command().unwrap_err();
        assert_eq!(f.code, ExitCode::Usage);
        assert_eq!(
            f.render(),
            "error: cannot load the kit\ncaused by: cannot read kit.yaml\ncaused by: permission denied\nhint: check the file's permissions\n"
        );
    }

    #[test]
    fn multi_line_messages_and_signals() {
        assert_eq!(Failure::runtime("a\nb").render(), "error: a\nerror: b\n");
        assert_eq!(Failure::signalled(2).render(), "");
        assert_eq!(Failure::signalled(15).code, ExitCode::Terminated);
    }
}
