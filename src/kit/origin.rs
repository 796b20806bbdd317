//! Where an effective setting came from.

use std::fmt;

/// The layer (and place in it) that set a value. Lowest precedence first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// Built-in default of the schema.
    Default,
    /// A kit file, at a 1-based line and column.
    Kit { file: String, line: usize, col: usize },
    /// A `SPARK_KIT_*` environment variable.
    Env(String),
    /// A command-line flag, as written (`--port`, `--set engine.port`).
    Flag(String),
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Default => f.write_str("default"),
            Self::Kit { file, line, col } => write!(f, "{file}:{line}:{col}"),
            Self::Env(name) => write!(f, "env {name}"),
            Self::Flag(flag) => write!(f, "flag {flag}"),
        }
    }
}
