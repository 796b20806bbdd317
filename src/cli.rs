//! clap definitions.
