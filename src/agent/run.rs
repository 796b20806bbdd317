//! The node agent (`spark-kit node --rank N`): owns this node's engine. Commands arrive as JSON
//! lines on stdin, events leave as JSON lines on stdout. When stdin closes (the supervisor is
//! gone, or ssh dropped) the agent stops its engine and exits: no orphans.
//!
//! The command loop never blocks on long work: the engine's preparation runs on a worker
//! (`start.rs`), the head's probes on their own thread (`prober.rs`), so a `Stop` is answered
//! within [`STOP_PREPARING`] at any moment (a preparation under way is cancelled).

use std::io::{BufRead, Read, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::guard::{self, HostedGuard};
use super::prober::{Prober, Target};
use super::start::{launch, ms, one_line, Poll, Preparing};
use crate::cluster::protocol::{decode, encode, Command, Event, VERSION};
use crate::deploy::Deployment;
use crate::dirs::Dirs;
use crate::engine::log_watch::LogWatch;
use crate::engine::process::Engine;
use crate::kit::schema::{Kit, Role};
use crate::memguard::EngineRef;
use crate::node::facts::gather;
use crate::node::probe::LocalProbe;
use crate::runtime::{self, Runtime};

/// How long a stop waits for a cancelled preparation to end (its processes are killed at once;
/// what remains is the worker noticing, within 100 ms). The supervisor gives an agent whose
/// engine never started 1.2 s to answer a stop.
pub const STOP_PREPARING: Duration = Duration::from_millis(800);

/// The loop's look at the worker and the guard while nothing arrives; heartbeats go every second.
const TICK: Duration = Duration::from_millis(100);
const BEAT: Duration = Duration::from_secs(1);

/// Where events go (stdout in production, a buffer in tests).
pub trait Emit {
    fn emit(&mut self, ev: &Event);
}

/// JSON lines on a writer; a write error means the supervisor is gone, which stdin EOF reports.
pub struct JsonLines<W: Write>(pub W);
impl<W: Write> Emit for JsonLines<W> {
    fn emit(&mut self, ev: &Event) {
        if let Ok(line) = encode(ev) {
            let _ = writeln!(self.0, "{line}");
            let _ = self.0.flush();
        }
    }
}

struct Running {
    engine: Engine,
    /// The runtime that started it (asked what the guard follows, and to clean up on stop).
    runtime: Box<dyn Runtime>,
    /// What the memory guard follows, once the runtime knows.
    target: Option<EngineRef>,
    /// Boot phase and child exits read from the engine's lines.
    watch: Arc<Mutex<LogWatch>>,
    /// The head's probes of the engine's API, on their own thread (None on a worker).
    prober: Option<Prober>,
    kit: Box<Kit>,
    node: usize,
    started: Instant,
    exited_reported: bool,
    ready_reported: bool,
    ids_reported: bool,
}

/// Run the agent until stdin closes. `env` is the process environment.
pub fn run(rank: usize, env: &[(String, String)], input: impl Read + Send + 'static, out: &mut dyn Emit) -> i32 {
    let (tx, rx) = mpsc::channel::<Option<String>>();
    std::thread::spawn(move || {
        let reader = std::io::BufReader::new(input);
        for line in reader.lines() {
            match line {
                Ok(l) => {
                    if tx.send(Some(l)).is_err() {
                        return;
                    }
                }
                Err(_) => break,
            }
        }
        let _ = tx.send(None);
    });
    let name = format!("rank{rank}");
    out.emit(&Event::Hello {
        version: env!("CARGO_PKG_VERSION").into(),
        protocol: VERSION,
        node: name,
        pid: std::process::id(),
    });
    let dirs = Dirs::from_env(env);
    let clock = Instant::now();
    let last_line = Arc::new(AtomicU64::new(0));
    let mut running: Option<Running> = None;
    let mut preparing: Option<Preparing> = None;
    let mut guard: Option<HostedGuard> = None;
    let (guard_tx, guard_rx) = mpsc::channel::<Event>();
    let mut next_beat = Instant::now() + BEAT;
    loop {
        while let Ok(ev) = guard_rx.try_recv() {
            out.emit(&ev);
        }
        if let Some(p) = preparing.as_mut() {
            if let Poll::Done(prepared) = p.poll(&mut |ev| out.emit(ev)) {
                if let Some(p) = preparing.take() {
                    running = launched(p, prepared, env, (&last_line, clock), out);
                }
            }
        }
        if let (Some(g), Some(r)) = (guard.as_ref(), running.as_mut()) {
            g.follow(r.guard_target());
        }
        if Instant::now() >= next_beat {
            next_beat = Instant::now() + BEAT;
            heartbeat(&mut running, &last_line, clock, out);
        }
        match rx.recv_timeout(TICK) {
            Ok(Some(line)) => match decode::<Command>(&line) {
                Ok(Command::Start { kit, node }) => {
                    let busy = preparing.is_some() || running.as_mut().is_some_and(|r| r.engine.try_wait().is_none());
                    if busy {
                        let message = "an engine is already running on this node".into();
                        out.emit(&Event::Error { message, fatal: false });
                        continue;
                    }
                    if node >= kit.nodes.len() {
                        let message = format!("node index {node} is not in the kit ({} nodes)", kit.nodes.len());
                        out.emit(&Event::Error { message, fatal: false });
                        continue;
                    }
                    last_line.store(ms(clock), Ordering::Relaxed);
                    // This node's paths, ports and API key, against its own HOME and environment.
                    let deploy = match Deployment::resolve(&kit, env) {
                        Ok(d) => d,
                        Err(e) => {
                            out.emit(&Event::Error { message: e.to_string(), fatal: false });
                            continue;
                        }
                    };
                    if guard.is_none() && kit.memory.guard.policy != crate::kit::schema::GuardPolicy::Off {
                        match guard::start(&kit, node, &deploy, guard_tx.clone()) {
                            Ok(g) => guard = Some(g),
                            Err(e) => out.emit(&Event::Error { message: e.to_string(), fatal: false }),
                        }
                    }
                    preparing = Some(Preparing::begin(kit, node, deploy, &last_line, clock));
                }
                Ok(Command::Stop { drain_s }) => {
                    if let Some(g) = guard.as_ref() {
                        g.follow(None);
                    }
                    stop(&mut running, preparing.take(), drain_s, out);
                }
                Ok(Command::Clean { kit }) => {
                    let removed = runtime::of(&kit).remove_leftovers(&kit);
                    match removed {
                        Ok(removed) => out.emit(&Event::Cleaned { removed }),
                        Err(e) => out.emit(&Event::Error { message: one_line(&e), fatal: false }),
                    }
                }
                Ok(Command::CheckFiles { root, files }) => match &dirs {
                    Ok(dirs) => out.emit(&check_files(&dirs.expand(&root), &files)),
                    Err(e) => out.emit(&Event::Error { message: e.to_string(), fatal: false }),
                },
                Ok(Command::Preflight { request }) => {
                    let facts = gather(&LocalProbe { timeout_s: 10 }, &request);
                    out.emit(&Event::Facts { facts: Box::new(facts) });
                }
                Err(e) => out.emit(&Event::Error { message: e.to_string(), fatal: false }),
            },
            Ok(None) | Err(RecvTimeoutError::Disconnected) => {
                let drain = running.as_ref().map_or(0, |r| u64::from(r.kit.engine.shutdown_timeout_s) + 5);
                stop(&mut running, preparing.take(), drain, out);
                if let Some(g) = guard.take() {
                    g.shut_down();
                }
                return 0;
            }
            Err(RecvTimeoutError::Timeout) => {}
        }
    }
}

/// The preparation `p` ended: launch its engine (reported `Started`), or report why not.
fn launched(
    p: Preparing,
    prepared: Result<runtime::Prepared, String>,
    env: &[(String, String)],
    (last_line, clock): (&Arc<AtomicU64>, Instant),
    out: &mut dyn Emit,
) -> Option<Running> {
    let watch = Arc::new(Mutex::new(LogWatch::default()));
    let started = prepared.and_then(|prep| launch(&p, &prep, env, (last_line, &watch), clock));
    match started {
        Ok((engine, runtime)) => {
            out.emit(&Event::Started { pgid: engine.pgid, log: engine.log.display().to_string() });
            let prober = (p.kit.nodes[p.node].role == Role::Head).then(|| prober(&p.kit, &p.deploy));
            Some(Running {
                engine,
                runtime,
                target: None,
                watch,
                prober,
                kit: p.kit,
                node: p.node,
                started: Instant::now(),
                exited_reported: false,
                ready_reported: false,
                ids_reported: false,
            })
        }
        Err(message) => {
            out.emit(&Event::Error { message, fatal: false });
            None
        }
    }
}

/// The head's probes of its engine: the internal port, the served model, the first API key.
fn prober(kit: &Kit, deploy: &Deployment) -> Prober {
    let (host, port) = deploy.ports.internal_addr();
    let key = deploy.api_key().ok().flatten().map(str::to_string);
    Prober::start(Target { host, port, model: kit.engine.served_model_name.clone(), key })
}

impl Running {
    /// What the guard follows now: nothing once the engine has exited.
    fn guard_target(&mut self) -> Option<EngineRef> {
        if self.exited_reported {
            return None;
        }
        if self.target.is_none() {
            self.target = self.runtime.guard_target(&self.kit, self.node, &self.engine);
        }
        self.target
    }
}

/// Stop: a preparation under way is cancelled (its processes killed, nothing half-made left),
/// a running engine is drained for up to `drain_s` then killed; `Stopped` says how it went.
fn stop(running: &mut Option<Running>, preparing: Option<Preparing>, drain_s: u64, out: &mut dyn Emit) {
    if let Some(p) = preparing {
        let t = Instant::now();
        let survivors = p.cancel(STOP_PREPARING, &mut |ev| out.emit(ev));
        let seconds = t.elapsed().as_secs_f64();
        out.emit(&Event::Stopped { graceful: survivors.is_empty(), seconds, survivors });
    } else if let Some(mut r) = running.take() {
        let t = Instant::now();
        // The runtime first (docker: `docker stop -t`, which ends the `docker run` client too),
        // then the engine's process group.
        let cleanup = r.runtime.stop(&r.kit, r.node);
        let mut rep = r.engine.stop(Duration::from_secs(drain_s));
        if let Err(e) = cleanup {
            rep.survivors.push(one_line(&e));
        }
        let seconds = t.elapsed().as_secs_f64();
        out.emit(&Event::Stopped { graceful: rep.graceful, seconds, survivors: rep.survivors });
    } else {
        out.emit(&Event::Stopped { graceful: true, seconds: 0.0, survivors: Vec::new() });
    }
}

fn heartbeat(running: &mut Option<Running>, last_line: &AtomicU64, clock: Instant, out: &mut dyn Emit) {
    let mem_available =
        std::fs::read_to_string("/proc/meminfo").ok().and_then(|t| crate::plan::parse_meminfo(&t)).map(|(_, a)| a);
    let quiet_s = (ms(clock).saturating_sub(last_line.load(Ordering::Relaxed))) as f64 / 1000.0;
    let Some(r) = running.as_mut() else {
        out.emit(&Event::Heartbeat { engine_alive: false, quiet_s: 0.0, mem_available, healthy: None, progress: None });
        return;
    };
    if let Some(status) = r.engine.try_wait() {
        if !r.exited_reported {
            r.exited_reported = true;
            // vLLM exits 0 when its EngineCore died: say what died first.
            let status = r.watch.lock().map_or_else(|_| status.to_string(), |w| w.exit_status(&status.to_string()));
            out.emit(&Event::Exited { status, log_tail: r.engine.log_tail(20) });
            // The engine process is gone; what it ran in goes too (docker: the container).
            if let Err(e) = r.runtime.stop(&r.kit, r.node) {
                out.emit(&Event::Error { message: one_line(&e), fatal: false });
            }
        }
        out.emit(&Event::Heartbeat { engine_alive: false, quiet_s, mem_available, healthy: None, progress: None });
        return;
    }
    if !r.ids_reported {
        if let Some((container_id, image_id)) = r.runtime.engine_ids(&r.kit, r.node) {
            r.ids_reported = true;
            out.emit(&Event::EngineIds { container_id, image_id });
        }
    }
    if !r.ready_reported {
        if let Some(phase) = r.watch.lock().ok().and_then(|mut w| w.phase_update()) {
            out.emit(&Event::Boot { phase });
        }
    }
    // The head's latest probes (their thread never holds up this loop).
    let seen = r.prober.as_ref().map(Prober::seen);
    if let Some(at) = seen.and_then(|s| s.ready_at).filter(|_| !r.ready_reported) {
        r.ready_reported = true;
        out.emit(&Event::Ready { seconds: at.saturating_duration_since(r.started).as_secs_f64() });
    }
    let (healthy, progress) = (seen.map(|s| s.healthy), seen.and_then(|s| s.progress));
    out.emit(&Event::Heartbeat { engine_alive: true, quiet_s, mem_available, healthy, progress });
}

fn check_files(root: &std::path::Path, files: &[String]) -> Event {
    let mut present = Vec::new();
    let mut missing = Vec::new();
    for f in files {
        match std::fs::metadata(root.join(f)) {
            Ok(m) if m.is_file() => present.push((f.clone(), m.len())),
            _ => missing.push(f.clone()),
        }
    }
    Event::Files { present, missing }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Buf(Vec<Event>);
    impl Emit for Buf {
        fn emit(&mut self, ev: &Event) {
            self.0.push(ev.clone());
        }
    }

    #[test]
    fn agent_says_hello_answers_files_and_exits_on_eof() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a"), b"xyz").unwrap();
        // A dangling link (a shared-blob cache copied without its store) is not a weight file.
        std::os::unix::fs::symlink("../../blobs/ab/gone", dir.path().join("c")).unwrap();
        let cmd = encode(&Command::CheckFiles {
            root: dir.path().display().to_string(),
            files: vec!["a".into(), "b".into(), "c".into()],
        })
        .unwrap();
        let input = std::io::Cursor::new(format!("{cmd}\nnot json\n").into_bytes());
        let mut out = Buf(Vec::new());
        assert_eq!(run(1, &crate::dirs::pairs(&[("HOME", "/h")]), input, &mut out), 0);
        assert!(matches!(out.0[0], Event::Hello { .. }));
        assert!(out
            .0
            .contains(&Event::Files { present: vec![("a".into(), 3)], missing: vec!["b".into(), "c".into()] }));
        assert!(out.0.iter().any(|e| matches!(e, Event::Error { fatal: false, .. })));
        assert!(matches!(out.0.last(), Some(Event::Stopped { .. })));
    }
}
