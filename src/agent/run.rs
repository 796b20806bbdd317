//! The node agent (`spark-kit node --rank N`): owns this node's engine. Commands arrive as JSON
//! lines on stdin, events leave as JSON lines on stdout. When stdin closes (the supervisor is
//! gone, or ssh dropped) the agent stops its engine and exits: no orphans.

use std::io::{BufRead, Read, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::guard::{self, HostedGuard};
use super::hang;
use super::prober::{Prober, Target};
use crate::cluster::protocol::{decode, encode, Command, Event, VERSION};
use crate::deploy::Deployment;
use crate::dirs::Dirs;
use crate::engine::log_watch::LogWatch;
use crate::engine::process::{Engine, LineSink};
use crate::kit::schema::{Kit, Role};
use crate::memguard::EngineRef;
use crate::node::facts::gather;
use crate::node::probe::LocalProbe;
use crate::runtime::venv::build::SetupReporter;
use crate::runtime::{self, check_port, LaunchEnv, Runtime, UpReporter};

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

/// Phases of preparation, reported as events.
struct PhaseEvents<'a> {
    out: std::sync::Mutex<&'a mut dyn Emit>,
}
impl SetupReporter for PhaseEvents<'_> {
    fn step(&self, index: usize, total: usize, label: &str) {
        if let Ok(mut o) = self.out.lock() {
            o.emit(&Event::Phase { name: "setup".into(), detail: format!("[{index}/{total}] {label}") });
        }
    }
    fn step_done(&self, _: &str, _: f64) {}
    fn still(&self, label: &str, secs: f64) {
        if let Ok(mut o) = self.out.lock() {
            o.emit(&Event::Phase { name: "setup".into(), detail: format!("{label}: still running, {secs:.0} s") });
        }
    }
}
impl UpReporter for PhaseEvents<'_> {
    fn phase(&self, name: &str, detail: &str) {
        if let Ok(mut o) = self.out.lock() {
            o.emit(&Event::Phase { name: name.into(), detail: detail.into() });
        }
    }
    fn phase_done(&self, _: &str, _: f64) {}
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
    let mut guard: Option<HostedGuard> = None;
    let (guard_tx, guard_rx) = mpsc::channel::<Event>();
    loop {
        while let Ok(ev) = guard_rx.try_recv() {
            out.emit(&ev);
        }
        if let (Some(g), Some(r)) = (guard.as_ref(), running.as_mut()) {
            g.follow(r.guard_target());
        }
        match rx.recv_timeout(Duration::from_secs(1)) {
            Ok(Some(line)) => match decode::<Command>(&line) {
                Ok(Command::Start { kit, node }) => {
                    if let Some(r) = running.as_mut() {
                        if r.engine.try_wait().is_none() {
                            out.emit(&Event::Error {
                                message: "an engine is already running on this node".into(),
                                fatal: false,
                            });
                            continue;
                        }
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
                    let watch = Arc::new(Mutex::new(LogWatch::default()));
                    match start(&kit, node, &deploy, env, (&last_line, &watch), clock, out) {
                        Ok((engine, runtime)) => {
                            out.emit(&Event::Started { pgid: engine.pgid, log: engine.log.display().to_string() });
                            running = Some(Running {
                                engine,
                                runtime,
                                target: None,
                                watch,
                                prober: (kit.nodes[node].role == Role::Head).then(|| prober(&kit, &deploy)),
                                kit,
                                node,
                                started: Instant::now(),
                                exited_reported: false,
                                ready_reported: false,
                                ids_reported: false,
                            });
                        }
                        Err(message) => out.emit(&Event::Error { message, fatal: false }),
                    }
                }
                Ok(Command::Stop { drain_s }) => {
                    if let Some(g) = guard.as_ref() {
                        g.follow(None);
                    }
                    stop(&mut running, drain_s, out);
                }
                Ok(Command::Clean { kit }) => {
                    let removed = runtime::for_kit(&kit).and_then(|r| r.remove_leftovers(&kit));
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
                stop(&mut running, drain, out);
                if let Some(g) = guard.take() {
                    g.shut_down();
                }
                return 0;
            }
            Err(RecvTimeoutError::Timeout) => heartbeat(&mut running, &last_line, clock, out),
        }
    }
}

fn ms(clock: Instant) -> u64 {
    u64::try_from(clock.elapsed().as_millis()).unwrap_or(u64::MAX)
}

fn start(
    kit: &Kit,
    node: usize,
    deploy: &Deployment,
    env: &[(String, String)],
    (last_line, watch): (&Arc<AtomicU64>, &Arc<Mutex<LogWatch>>),
    clock: Instant,
    out: &mut dyn Emit,
) -> Result<(Engine, Box<dyn Runtime>), String> {
    if node >= kit.nodes.len() {
        return Err(format!("node index {node} is not in the kit ({} nodes)", kit.nodes.len()));
    }
    let runtime = runtime::for_kit(kit).map_err(|e| e.to_string())?;
    let prep = {
        let rep = PhaseEvents { out: std::sync::Mutex::new(out) };
        runtime.prepare(kit, deploy, &rep).map_err(|e| e.to_string())?
    };
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
        .launch(kit, node, &prep, &LaunchEnv { base: env, home: &deploy.dirs.home, extra: &extra, sink: Some(sink) })
        .map_err(|e| one_line(&e))?;
    Ok((engine, runtime))
}

/// The head's probes of its engine: the internal port, the served model, the first API key.
fn prober(kit: &Kit, deploy: &Deployment) -> Prober {
    let (host, port) = deploy.ports.internal_addr();
    let key = deploy.api_key().ok().flatten().map(str::to_string);
    Prober::start(Target { host, port, model: kit.engine.served_model_name.clone(), key })
}

/// An error and its fix on one line.
fn one_line(e: &runtime::UpError) -> String {
    e.hint().map_or_else(|| e.to_string(), |h| format!("{e} (fix: {h})"))
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

fn stop(running: &mut Option<Running>, drain_s: u64, out: &mut dyn Emit) {
    if let Some(mut r) = running.take() {
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
