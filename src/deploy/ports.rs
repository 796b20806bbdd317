//! The ports of a deployment and how clients reach them: the public API port (`engine.port`,
//! where `up`'s gateway listens), the engine's own API behind it — called "the internal port"
//! everywhere (`engine.internal_port`, or `engine.port ± 10000` when 0, `Engine::effective_internal_port`)
//! on loopback — the address to probe for a bind address, and the base URL.

use crate::kit::schema::Kit;

/// The loopback address the internal port listens on.
pub const INTERNAL_HOST: &str = "127.0.0.1";

/// The address clients on this machine use for a bind address (`0.0.0.0` → loopback).
#[must_use]
pub fn probe_host(bind: &str) -> &str {
    match bind {
        "0.0.0.0" => "127.0.0.1",
        "::" => "::1",
        other => other,
    }
}

/// `http://host:port` with IPv6 hosts bracketed.
#[must_use]
pub fn base_url(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("http://[{host}]:{port}")
    } else {
        format!("http://{host}:{port}")
    }
}

/// The ports of a deployment: the public API (`engine.host:engine.port`, the gateway's in `up`)
/// and the internal port (the engine's own API on loopback behind it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ports {
    /// `engine.host`: where clients connect.
    pub host: String,
    pub api: u16,
    pub internal: u16,
}

impl Ports {
    /// The ports `kit` names.
    #[must_use]
    pub fn of(kit: &Kit) -> Self {
        Self { host: kit.engine.host.clone(), api: kit.engine.port, internal: kit.engine.effective_internal_port() }
    }

    /// The engine's own API: [`INTERNAL_HOST`] and the internal port. The node's probes
    /// (`/health`, `/metrics`, the one-token completion) use this, clients [`Self::base_url`].
    #[must_use]
    pub fn internal_addr(&self) -> (&'static str, u16) {
        (INTERNAL_HOST, self.internal)
    }

    /// The client-facing base URL, `http://host:port` (the host as a client reaches it).
    #[must_use]
    pub fn base_url(&self) -> String {
        base_url(probe_host(&self.host), self.api)
    }

    /// The client-facing endpoint, `http://host:port/v1`.
    #[must_use]
    pub fn endpoint(&self) -> String {
        format!("{}/v1", self.base_url())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(base_url(probe_host("0.0.0.0"), 8000), "http://127.0.0.1:8000");
        assert_eq!(base_url(probe_host("::"), 8000), "http://[::1]:8000");
        assert_eq!(base_url("::1", 8000), "http://[::1]:8000");
        assert_eq!(probe_host("10.0.0.1"), "10.0.0.1");
    }

    fn kit_with(port: u16, internal: u16) -> Kit {
        let mut k = crate::kit::builtin_kit("tiny-cpu");
        k.engine.port = port;
        k.engine.internal_port = internal;
        k
    }

    #[test]
    fn the_internal_port_defaults_beside_the_public_one() {
        assert_eq!(Ports::of(&kit_with(8000, 0)).internal, 18000);
        assert_eq!(Ports::of(&kit_with(60000, 0)).internal, 50000);
        assert_eq!(Ports::of(&kit_with(8000, 9123)).internal, 9123);
        assert_eq!(Ports::of(&kit_with(8000, 0)).internal_addr(), ("127.0.0.1", 18000));
        assert!(Ports::of(&kit_with(8000, 0)).endpoint().ends_with(":8000/v1"));
    }
}
