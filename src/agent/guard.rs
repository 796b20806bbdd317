//! The node's memory guard, hosted by the agent on its own thread; its events travel to the
//! supervisor as `Guard` events.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crate::cluster::protocol::Event;
use crate::deploy::Deployment;
use crate::kit::schema::Kit;
use crate::memguard::{EngineRef, EngineSource, GuardError};

/// The node's memory guard, hosted by the agent on its own thread; it follows the engine
/// across restarts — its process group, or its container (what the runtime's `guard_target`
/// says; None = no engine).
pub struct HostedGuard {
    target: Arc<Mutex<Option<EngineRef>>>,
    pub stop: Arc<AtomicBool>,
    pub thread: std::thread::JoinHandle<()>,
}

/// What the agent last set (copied out under the lock: no allocation in the guard's loop).
struct Follow(Arc<Mutex<Option<EngineRef>>>);
impl EngineSource for Follow {
    fn engine(&self) -> Option<EngineRef> {
        self.0.lock().ok().and_then(|t| *t)
    }
}

/// Why the hosted guard did not start (the agent reports it as a non-fatal `Error` event).
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error("memory guard: {0}")]
    Guard(#[source] GuardError),
    #[error("memory guard thread: {0}")]
    Thread(#[source] std::io::Error),
}

/// Guard events go to the supervisor through the agent's event channel.
struct GuardToEvents(std::sync::mpsc::Sender<Event>);
impl crate::memguard::GuardReporter for GuardToEvents {
    fn event(&self, event: &crate::memguard::GuardEvent) {
        if let Ok(v) = serde_json::to_value(event) {
            let _ = self.0.send(Event::Guard { event: v });
        }
    }
}

/// Start the guard of node `node` of `kit`; its receipts go under the kit's logs dir.
pub fn start(
    kit: &Kit,
    node: usize,
    deploy: &Deployment,
    events: std::sync::mpsc::Sender<Event>,
) -> Result<HostedGuard, HostError> {
    let cfg = crate::memguard::GuardConfig::from_kit(kit, &kit.nodes[node].name);
    let target = Arc::new(Mutex::new(None));
    let stop = Arc::new(AtomicBool::new(false));
    let provider = Follow(Arc::clone(&target));
    let receipts = deploy.logs.join("receipts");
    let mut guard = crate::memguard::Guard::new(cfg, Box::new(provider), &receipts, Arc::new(GuardToEvents(events)))
        .map_err(HostError::Guard)?;
    let s = Arc::clone(&stop);
    let thread =
        std::thread::Builder::new().name("memguard".into()).spawn(move || guard.run(&s)).map_err(HostError::Thread)?;
    Ok(HostedGuard { target, stop, thread })
}

impl HostedGuard {
    /// Follow `engine` from now on (None: no engine to watch).
    pub fn follow(&self, engine: Option<EngineRef>) {
        if let Ok(mut t) = self.target.lock() {
            *t = engine;
        }
    }

    /// Stop the guard thread and wait for it.
    pub fn shut_down(self) {
        self.follow(None);
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.thread.join();
    }
}
