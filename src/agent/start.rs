//! Starting this node's engine without holding up the agent's command loop: the runtime's
//! [`Runtime::prepare`] (the venv build, the overlay, the tiny model maker: minutes) runs on a
//! worker thread of its own ([`Preparing`]), which reports its phases and its end on a channel
//! the loop reads; the engine itself is launched on the loop's thread once the files are ready
//! ([`launch`]), so the engine's PDEATHSIG follows the agent, not the worker. A stop during the
//! preparation cancels it ([`Preparing::cancel`]): what it runs is killed as process groups and
//! nothing half-made is left in place.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::hang;
use crate::cancel::Cancel;
use crate::cluster::protocol::Event;
use crate::deploy::Deployment;
use crate::engine::log_watch::LogWatch;
use crate::engine::process::{Engine, LineSink};
use crate::kit::schema::{Kit, Role};
use crate::runtime::venv::build::SetupReporter;
use crate::runtime::{self, check_port, LaunchEnv, Prepared, Runtime, UpReporter};

/// What the worker tells the loop.
enum Said {
    Event(Event),
    Done(Result<Prepared, String>),
}

/// Milliseconds since `clock` (the agent's progress clock).
pub fn ms(clock: Instant) -> u64 {
    u64::try_from(clock.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// The worker's reporter: each phase is an event for the loop, and counts as progress.
struct Phases {
    tx: Sender<Said>,
    last_line: Arc<AtomicU64>,
    clock: Instant,
}

impl Phases {
    fn say(&self, name: &str, detail: String) {
        self.last_line.store(ms(self.clock), Ordering::Relaxed);
        let _ = self.tx.send(Said::Event(Event::Phase { name: name.into(), detail }));
    }
}

impl SetupReporter for Phases {
    fn step(&self, index: usize, total: usize, label: &str) {
        self.say("setup", format!("[{index}/{total}] {label}"));
    }
    fn step_done(&self, _: &str, _: f64) {}
    fn still(&self, label: &str, secs: f64) {
        self.say("setup", format!("{label}: still running, {secs:.0} s"));
    }
}

impl UpReporter for Phases {
    fn phase(&self, name: &str, detail: &str) {
        self.say(name, detail.into());
    }
    fn phase_done(&self, _: &str, _: f64) {}
}

/// An engine start whose files are being prepared on the worker thread.
pub struct Preparing {
    pub kit: Box<Kit>,
    pub node: usize,
    pub deploy: Deployment,
    cancel: Cancel,
    rx: Receiver<Said>,
    thread: Option<JoinHandle<()>>,
}

/// What [`Preparing::poll`] found.
pub enum Poll {
    /// Still preparing.
    Busy,
    /// Done: launch with these files, or report the error.
    Done(Result<Prepared, String>),
}

impl Preparing {
    /// Begin preparing node `node`'s engine of `kit` on a worker thread.
    #[must_use]
    pub fn begin(kit: Box<Kit>, node: usize, deploy: Deployment, last_line: &Arc<AtomicU64>, clock: Instant) -> Self {
        let (tx, rx) = mpsc::channel();
        let cancel = Cancel::default();
        let (k, d, c) = (kit.clone(), deploy.clone(), cancel.clone());
        let rep = Phases { tx: tx.clone(), last_line: Arc::clone(last_line), clock };
        let thread = std::thread::spawn(move || {
            let done = runtime::of(&k).prepare(&k, &d, &rep, &c).map_err(|e| one_line(&e));
            let _ = tx.send(Said::Done(done));
        });
        Self { kit, node, deploy, cancel, rx, thread: Some(thread) }
    }

    /// Pass on what the worker said since the last look (`emit`); whether it is done.
    pub fn poll(&mut self, emit: &mut dyn FnMut(&Event)) -> Poll {
        loop {
            match self.rx.try_recv() {
                Ok(Said::Event(ev)) => emit(&ev),
                Ok(Said::Done(r)) => {
                    self.join();
                    return Poll::Done(r);
                }
                Err(TryRecvError::Empty) => return Poll::Busy,
                Err(TryRecvError::Disconnected) => {
                    self.join();
                    return Poll::Done(Err("the engine's preparation ended without a word".into()));
                }
            }
        }
    }

    /// Stop preparing: kill what the worker runs (its process groups) and wait up to `wait` for
    /// it to end, passing on what it says. What did not end in time, for `Stopped`'s survivors.
    pub fn cancel(mut self, wait: Duration, emit: &mut dyn FnMut(&Event)) -> Vec<String> {
        self.cancel.cancel();
        let deadline = Instant::now() + wait;
        loop {
            match self.rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(Said::Event(ev)) => emit(&ev),
                Ok(Said::Done(_)) | Err(RecvTimeoutError::Disconnected) => {
                    self.join();
                    return Vec::new();
                }
                Err(RecvTimeoutError::Timeout) => {
                    return vec![format!("the engine's preparation did not end within {:.1} s", wait.as_secs_f64())]
                }
            }
        }
    }

    fn join(&mut self) {
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Launch the prepared engine of `p` (on the loop's thread); `env` is the agent's environment.
/// Its lines feed the hang clock `last_line` and the boot watch `watch`.
pub fn launch(
    p: &Preparing,
    prep: &Prepared,
    env: &[(String, String)],
    (last_line, watch): (&Arc<AtomicU64>, &Arc<Mutex<LogWatch>>),
    clock: Instant,
) -> Result<(Engine, Box<dyn Runtime>), String> {
    let (kit, node, deploy) = (&*p.kit, p.node, &p.deploy);
    let runtime = runtime::of(kit);
    if kit.nodes[node].role == Role::Head {
        let (host, port) = deploy.ports.internal_addr();
        check_port(host, port)
            .map_err(|e| format!("engine.internal_port: {e}: set engine.internal_port to a free port"))?;
    }
    let ll = Arc::clone(last_line);
    let w = Arc::clone(watch);
    let sink: LineSink = Arc::new(move |line: &str| {
        if hang::counts_as_progress(line) {
            ll.store(ms(clock), Ordering::Relaxed);
        }
        if let Ok(mut w) = w.lock() {
            w.observe(line);
        }
    });
    // Only the head serves the API: a worker whose environment lacks engine.api_keys.env's
    // variable starts without the key (`up` on the head refused a missing one before this).
    let key = match deploy.api_key() {
        Err(e) if e.is_unset_var() && kit.nodes[node].role != Role::Head => None,
        r => r.map_err(ToString::to_string)?,
    };
    let extra: Vec<(String, String)> = key.into_iter().map(|k| ("VLLM_API_KEY".to_string(), k.to_string())).collect();
    let engine = runtime
        .launch(kit, node, prep, &LaunchEnv { base: env, home: &deploy.dirs.home, extra: &extra, sink: Some(sink) })
        .map_err(|e| one_line(&e))?;
    Ok((engine, runtime))
}

/// An error and its fix on one line.
pub fn one_line(e: &runtime::UpError) -> String {
    e.hint().map_or_else(|| e.to_string(), |h| format!("{e} (fix: {h})"))
}
