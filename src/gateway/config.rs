//! Gateway settings and their validation (pure).

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::admission::Limits;
use super::count::{Counter, LoadError};
use super::keys::ApiKey;
use crate::kit::schema::{Kit, SchedulingPolicy};
use crate::plan::Plan;

/// Everything the gateway needs to run. Its `Debug` shows how many keys there are, never a key.
#[derive(Clone)]
pub struct GatewayConfig {
    /// Where clients connect (`engine.host:engine.port`).
    pub bind: SocketAddr,
    /// The engine's base URL on loopback, e.g. `http://127.0.0.1:18000`.
    pub upstream: String,
    /// Accepted API keys, as digests with their limits (empty = no key required).
    pub keys: Vec<ApiKey>,
    /// The key the gateway sends to the engine (`Authorization: Bearer`), when the engine
    /// itself is keyed (`VLLM_API_KEY`, the first of `engine.api_keys`). Never logged.
    pub upstream_key: Option<String>,
    /// Largest request body accepted, bytes (413 above).
    pub max_body_bytes: usize,
    /// Generation requests in flight at once (`engine.max_num_seqs`).
    pub max_in_flight: usize,
    /// Requests that may wait for a slot; one more gets 429.
    pub queue_len: usize,
    /// Longest wait in the queue: then 503 + Retry-After (`queue_timeout`).
    pub queue_wait: Duration,
    /// The engine runs with `--scheduling-policy priority` (`engine.scheduling_policy`): each
    /// request's `priority` is passed on, raised to its key's; otherwise a `priority` other
    /// than 0 is refused with the fix.
    pub priority: bool,
    /// `Retry-After` seconds on 429 and 503.
    pub retry_after_s: u64,
    /// Longest wait for in-flight requests when draining.
    pub drain_timeout: Duration,
    /// Longest time a connection may take to send a request's head, from the accept or the end
    /// of the previous response (so it also closes idle keep-alive connections).
    pub header_timeout: Duration,
    /// Largest request head (start line and headers), bytes: 431 above.
    pub max_header_bytes: usize,
    pub limits: Limits,
    /// The served checkpoint's `tokenizer.json`, for counting completion prompts in process
    /// (loaded when the engine is first ready if `counter` is not already loaded).
    pub tokenizer: Option<PathBuf>,
    /// `up`'s load of `tokenizer` before the gateway starts (None: not tried). A failed load is
    /// tried again when the engine is first ready (the file may not exist before).
    pub counter: Option<Result<Arc<Counter>, LoadError>>,
}

impl std::fmt::Debug for GatewayConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GatewayConfig")
            .field("bind", &self.bind)
            .field("upstream", &self.upstream)
            .field("keys", &format_args!("<{} key(s), not shown>", self.keys.len()))
            .field("key_policies", &self.keys.iter().map(|k| k.policy).collect::<Vec<_>>())
            .field(
                "upstream_key",
                &format_args!("{}", if self.upstream_key.is_some() { "<set, not shown>" } else { "None" }),
            )
            .field("max_body_bytes", &self.max_body_bytes)
            .field("max_in_flight", &self.max_in_flight)
            .field("queue_len", &self.queue_len)
            .field("queue_wait", &self.queue_wait)
            .field("priority", &self.priority)
            .field("retry_after_s", &self.retry_after_s)
            .field("drain_timeout", &self.drain_timeout)
            .field("header_timeout", &self.header_timeout)
            .field("max_header_bytes", &self.max_header_bytes)
            .field("limits", &self.limits)
            .field("tokenizer", &self.tokenizer)
            .field("counter", &self.counter.as_ref().map(|c| c.as_ref().map(|_| "loaded")))
            .finish()
    }
}

/// A setting the gateway refuses to run with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error(
        "engine.host {0} is not loopback and engine.api_keys is empty: anyone who can reach the port could use \
         the engine; set engine.api_keys.env (or engine.api_keys.file), or set engine.host to 127.0.0.1"
    )]
    OpenBind(IpAddr),
    #[error("engine.host {0:?} is not an IP address: set engine.host to an address such as 127.0.0.1 or 0.0.0.0")]
    BadHost(String),
    #[error("engine.max_num_seqs is 0: set engine.max_num_seqs to 1 or more")]
    NoSeqs,
    #[error(
        "the engine's internal address {0} is not loopback: the engine behind the gateway must listen on 127.0.0.1"
    )]
    UpstreamNotLoopback(String),
}

/// The client-facing address from `engine.host` / `engine.port`.
pub fn bind_addr(host: &str, port: u16) -> Result<SocketAddr, ConfigError> {
    let ip: IpAddr = host.parse().map_err(|_| ConfigError::BadHost(host.to_string()))?;
    Ok(SocketAddr::new(ip, port))
}

impl GatewayConfig {
    /// Defaults for everything but the addresses, keys, slots and limits.
    #[must_use]
    pub fn new(bind: SocketAddr, upstream: String, keys: Vec<String>, max_in_flight: usize, limits: Limits) -> Self {
        Self {
            bind,
            upstream,
            upstream_key: keys.first().cloned(),
            keys: keys.iter().map(|k| ApiKey::from(k.as_str())).collect(),
            max_body_bytes: 8 << 20,
            max_in_flight,
            queue_len: max_in_flight.saturating_mul(4),
            queue_wait: Duration::from_secs(30),
            priority: false,
            retry_after_s: 5,
            drain_timeout: Duration::from_secs(30),
            header_timeout: Duration::from_secs(15),
            max_header_bytes: 32 << 10,
            limits,
            tokenizer: None,
            counter: None,
        }
    }

    /// The gateway of a kit: clients on `engine.host:engine.port`, the engine on
    /// `127.0.0.1:engine_port`, `engine.max_num_seqs` slots, the plan's limits, `keys` as read
    /// from `engine.api_keys` (the first is also sent to the engine, which `up` starts with
    /// it), `engine.drain_timeout_s`, `engine.header_timeout_s`, `engine.queue_wait_s`. Validated.
    pub fn from_kit(kit: &Kit, plan: &Plan, keys: Vec<String>, engine_port: u16) -> Result<Self, ConfigError> {
        let bind = bind_addr(&kit.engine.host, kit.engine.port)?;
        let slots = usize::try_from(kit.engine.max_num_seqs).unwrap_or(usize::MAX);
        let mut cfg = Self::new(bind, format!("http://127.0.0.1:{engine_port}"), keys, slots, Limits::from_plan(plan));
        cfg.drain_timeout = Duration::from_secs(u64::from(kit.engine.drain_timeout_s));
        cfg.header_timeout = Duration::from_secs(u64::from(kit.engine.header_timeout_s));
        cfg.queue_wait = Duration::from_secs(u64::from(kit.engine.queue_wait_s));
        cfg.priority = kit.engine.scheduling_policy == SchedulingPolicy::Priority;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Refuse settings that would expose the engine or cannot work.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !self.bind.ip().is_loopback() && self.keys.is_empty() {
            return Err(ConfigError::OpenBind(self.bind.ip()));
        }
        if self.max_in_flight == 0 {
            return Err(ConfigError::NoSeqs);
        }
        let host = self.upstream.strip_prefix("http://").unwrap_or("").split(['/', ':']).next().unwrap_or("");
        let loopback = host == "localhost" || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback());
        if !loopback {
            return Err(ConfigError::UpstreamNotLoopback(self.upstream.clone()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const L: Limits = Limits { max_model_len: 4096, kv_pool_tokens: None, safe_max_prompt: None };

    fn cfg(host: &str, keys: &[&str]) -> GatewayConfig {
        let bind = bind_addr(host, 8000).unwrap();
        GatewayConfig::new(bind, "http://127.0.0.1:18000".into(), keys.iter().map(|k| (*k).to_string()).collect(), 2, L)
    }

    #[test]
    fn open_bind_without_keys_is_refused_with_the_fix() {
        let e = cfg("0.0.0.0", &[]).validate().unwrap_err();
        assert_eq!(e, ConfigError::OpenBind("0.0.0.0".parse().unwrap()));
        assert!(e.to_string().contains("set engine.api_keys.env"), "{e}");
        assert_eq!(cfg("0.0.0.0", &["k"]).validate(), Ok(()));
        assert_eq!(cfg("127.0.0.1", &[]).validate(), Ok(()));
        assert_eq!(cfg("::1", &[]).validate(), Ok(()));
    }

    #[test]
    fn debug_output_never_shows_a_key() {
        let c = cfg("0.0.0.0", &["sk-secret-one", "sk-secret-two"]);
        for text in [format!("{c:?}"), format!("{c:#?}")] {
            assert!(!text.contains("sk-secret"), "{text}");
            assert!(text.contains("<2 key(s), not shown>") && text.contains("<set, not shown>"), "{text}");
            assert!(text.contains("max_in_flight: 2"), "{text}");
        }
        // Through everything that holds the config (the gateway, as the supervisor's handles do).
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let _g = rt.enter();
        let gw = super::super::Gateway::new(c, super::super::EngineState::Ready).unwrap();
        assert!(!format!("{gw:?}").contains("sk-secret"), "{gw:?}");
    }

    #[test]
    fn bad_host_and_port() {
        assert_eq!(bind_addr("example.com", 80), Err(ConfigError::BadHost("example.com".into())));
    }

    #[test]
    fn upstream_must_be_loopback_and_slots_nonzero() {
        let mut c = cfg("127.0.0.1", &[]);
        c.upstream = "http://10.0.0.2:8000".into();
        assert!(matches!(c.validate(), Err(ConfigError::UpstreamNotLoopback(_))));
        c.upstream = "http://localhost:8000".into();
        assert_eq!(c.validate(), Ok(()));
        c.max_in_flight = 0;
        assert_eq!(c.validate(), Err(ConfigError::NoSeqs));
    }
}
