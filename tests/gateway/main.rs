//! The gateway in front of the engine: proxying, counting, admission, front-door behaviour.
//! One test binary per area (fewer link steps): each module was a test binary of its own.
#![allow(clippy::expect_used, clippy::unwrap_used)]

#[path = "../fake_sse/mod.rs"]
mod fake_sse;
#[path = "../gateway_fake/mod.rs"]
mod gateway_fake;

mod gateway_count;
mod gateway_front;
mod gateway_plan;
mod gateway_proxy;
mod gateway_queue;
