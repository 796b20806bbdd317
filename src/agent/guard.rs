//! The node's memory guard, hosted by the agent on its own thread; its events travel to the
//! supervisor as `Guard` events.

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::Arc;

use crate::cluster::protocol::Event;
use crate::dirs::Dirs;
use crate::kit::schema::Kit;

/// The node's memory guard, hosted by the agent on its own thread; it follows the engine's
/// process group across restarts (`pgid` 0 = no engine).
pub struct HostedGuard {
    pub pgid: Arc<AtomicI32>,
    pub stop: Arc<AtomicBool>,
    pub thread: std::thread::JoinHandle<()>,
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
    dirs: &Dirs,
    events: std::sync::mpsc::Sender<Event>,
) -> Result<HostedGuard, String> {
    let cfg = crate::memguard::GuardConfig::from_kit(kit, &kit.nodes[node].name);
    let pgid = Arc::new(AtomicI32::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let p = Arc::clone(&pgid);
    let provider = move || Some(p.load(Ordering::Relaxed)).filter(|g| *g > 0);
    let receipts = dirs.expand(&kit.paths.logs).join("receipts");
    let mut guard = crate::memguard::Guard::new(cfg, Box::new(provider), &receipts, Arc::new(GuardToEvents(events)))
        .map_err(|e| format!("memory guard: {e}"))?;
    let s = Arc::clone(&stop);
    let thread = std::thread::Builder::new()
        .name("memguard".into())
        .spawn(move || guard.run(&s))
        .map_err(|e| format!("memory guard thread: {e}"))?;
    Ok(HostedGuard { pgid, stop, thread })
}

impl HostedGuard {
    /// Stop the guard thread and wait for it.
    pub fn shut_down(self) {
        self.pgid.store(0, Ordering::Relaxed);
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.thread.join();
    }
}
