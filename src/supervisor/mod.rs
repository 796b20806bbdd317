//! Bringing a deployment up and keeping it alive.

pub mod hang;
pub mod health;
pub mod local;
pub mod state;
