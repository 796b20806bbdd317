//! Bringing a deployment up and keeping it alive.

pub mod health;
pub mod local;
