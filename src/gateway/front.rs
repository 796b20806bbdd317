//! The gateway run beside synchronous code (the supervisor): its own tokio runtime on a thread,
//! the listener bound up front (so a taken port fails before anything starts), a drain that is
//! started once and polled.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use super::config::GatewayConfig;
use super::state::{DrainOutcome, EngineState, Gateway};

/// Why the gateway could not start.
#[derive(Debug, thiserror::Error)]
pub enum FrontError {
    #[error(
        "engine.port {port} on {host} is already in use: stop what listens there (`ss -ltnp 'sport = :{port}'`) \
         or pick another port with --port"
    )]
    PortInUse { host: String, port: u16 },
    #[error("cannot listen on engine.host:engine.port {addr}: {why}: set engine.host to an address of this machine")]
    Bind { addr: SocketAddr, why: String },
    #[error("cannot start the gateway: {0}")]
    Runtime(String),
}

/// Why the gateway stopped serving on its own (its accept loop failed); cloned to every reader.
#[derive(Debug, Clone, thiserror::Error)]
#[error(transparent)]
pub struct ServeError(Arc<std::io::Error>);

impl PartialEq for ServeError {
    fn eq(&self, other: &Self) -> bool {
        self.0.kind() == other.0.kind() && self.0.to_string() == other.0.to_string()
    }
}

/// How the gateway's serving ended.
type Finished = Option<Result<DrainOutcome, ServeError>>;

/// A running gateway: serving until [`Front::begin_drain`], then draining, then closed.
#[derive(Debug)]
pub struct Front {
    gw: Arc<Gateway>,
    stop: Mutex<Option<oneshot::Sender<()>>>,
    finished: Arc<Mutex<Finished>>,
}

impl Front {
    /// Bind `cfg.bind` and serve on a thread of its own, the engine state `Unavailable` until
    /// told otherwise.
    pub fn start(cfg: GatewayConfig) -> Result<Arc<Self>, FrontError> {
        let addr = cfg.bind;
        let std_listener = std::net::TcpListener::bind(addr).map_err(|e| {
            if e.kind() == std::io::ErrorKind::AddrInUse {
                FrontError::PortInUse { host: addr.ip().to_string(), port: addr.port() }
            } else {
                FrontError::Bind { addr, why: e.to_string() }
            }
        })?;
        std_listener.set_nonblocking(true).map_err(|e| FrontError::Runtime(e.to_string()))?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("gateway")
            .enable_all()
            .build()
            .map_err(|e| FrontError::Runtime(e.to_string()))?;
        let (gw, listener) = {
            let _entered = rt.enter();
            let gw = Gateway::new(cfg, EngineState::Unavailable).map_err(|e| FrontError::Runtime(e.to_string()))?;
            let listener =
                tokio::net::TcpListener::from_std(std_listener).map_err(|e| FrontError::Runtime(e.to_string()))?;
            (gw, listener)
        };
        let (tx, rx) = oneshot::channel::<()>();
        let finished: Arc<Mutex<Finished>> = Arc::new(Mutex::new(None));
        let (g, f) = (gw.clone(), finished.clone());
        std::thread::Builder::new()
            .name("gateway".into())
            .spawn(move || {
                let stop = async move {
                    // A dropped sender (the front gone) stops the gateway too.
                    let _ = rx.await;
                };
                let out = rt.block_on(super::serve::serve(listener, g, stop)).map_err(|e| ServeError(Arc::new(e)));
                if let Ok(mut slot) = f.lock() {
                    *slot = Some(out);
                }
                // In-flight responses were drained or cut; nothing left worth waiting for.
                rt.shutdown_background();
            })
            .map_err(|e| FrontError::Runtime(e.to_string()))?;
        Ok(Arc::new(Self { gw, stop: Mutex::new(Some(tx)), finished }))
    }

    /// The gateway (state, counts).
    #[must_use]
    pub fn gateway(&self) -> &Arc<Gateway> {
        &self.gw
    }

    /// Stop admitting and start draining (idempotent): new requests get 503, in-flight ones run
    /// on up to the drain timeout, then the listener closes.
    pub fn begin_drain(&self) {
        // Draining at once, before the serve task sees the stop: no request slips in between.
        self.gw.set_engine_state(EngineState::Draining);
        if let Some(tx) = self.stop.lock().ok().and_then(|mut s| s.take()) {
            let _ = tx.send(());
        }
    }

    /// How the drain ended, once it has (`None` while serving or draining).
    #[must_use]
    pub fn finished(&self) -> Finished {
        self.finished.lock().ok().and_then(|f| f.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::admission::Limits;

    fn cfg(port: u16) -> GatewayConfig {
        let limits = Limits { max_model_len: 512, kv_pool_tokens: None, safe_max_prompt: None };
        let bind = SocketAddr::from(([127, 0, 0, 1], port));
        GatewayConfig::new(bind, "http://127.0.0.1:9".into(), vec![], 1, limits)
    }

    #[test]
    fn a_taken_port_is_named_with_the_fix() {
        let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = held.local_addr().unwrap().port();
        let e = Front::start(cfg(port)).unwrap_err();
        assert!(matches!(e, FrontError::PortInUse { port: p, .. } if p == port), "{e}");
        assert!(e.to_string().contains(&format!("engine.port {port} on 127.0.0.1 is already in use")), "{e}");
        assert!(e.to_string().contains("--port"), "{e}");
    }

    #[test]
    fn serves_503_until_ready_and_drains_when_idle() {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let f = Front::start(cfg(port)).unwrap();
        let get = || {
            use std::io::{Read, Write};
            let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
            s.write_all(b"GET /v1/models HTTP/1.0\r\nHost: x\r\n\r\n").ok()?;
            let mut out = String::new();
            s.read_to_string(&mut out).ok()?;
            out.split_whitespace().nth(1).map(str::to_string)
        };
        assert_eq!(get().as_deref(), Some("503"));
        assert_eq!(f.finished(), None);
        f.begin_drain();
        f.begin_drain();
        let t = std::time::Instant::now();
        while f.finished().is_none() {
            assert!(t.elapsed() < std::time::Duration::from_secs(10), "drain never finished");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert_eq!(f.finished(), Some(Ok(DrainOutcome::Idle)));
        assert_eq!(f.gateway().engine_state(), EngineState::Draining);
        // The listener is closed once drained.
        let t = std::time::Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            assert!(t.elapsed() < std::time::Duration::from_secs(10), "still listening after the drain");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}
