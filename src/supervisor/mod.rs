//! Bringing a deployment up and keeping it alive.

pub mod bringup;
pub mod cluster;
pub mod control;
pub mod hang;
pub mod health;
pub mod local;
pub mod state;
