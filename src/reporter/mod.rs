//! The terminal for progress: the one module that writes progress to the process's stderr from
//! worker threads (where a command's `ctx.err` cannot go), plain lines that read well in logs
//! and CI, bars on a terminal. Setup and bring-up phases ([`Lines`]), `pack-engram`
//! ([`PackLines`]), `download` and `verify --repair` ([`download`]), a line every few seconds
//! ([`Every`], `verify`'s hashing and decoding), [`line`] / [`is_terminal`] for the others
//! (`engine`'s child exits), and `up`'s terminal: its lines ([`UpLines`]), the boot progress line
//! ([`BootProgress`]), the ready banner and the `--verbose` engine log tails ([`watch_ready`]).
//! Commands hand these to the library through its reporter traits; nothing below `commands`
//! imports this module.

pub mod download;

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::engine::boot_phase::{progress_line, Pacer, CLEAR_LINE};
use crate::runtime::venv::build::SetupReporter;
use crate::runtime::UpReporter;
use crate::supervisor::state::State;
use crate::supervisor::{ClusterReporter, Snapshot};

/// One progress line on stderr, written with its newline in one `write` (so neither another
/// thread nor another writer of the same descriptor — the embedded Python's `sys.stderr` —
/// lands inside it; a pipe keeps writes of up to 4 KiB whole).
pub fn line(text: &str) {
    let mut buf = String::with_capacity(text.len() + 1);
    buf.push_str(text.trim_end_matches('\n'));
    buf.push('\n');
    let _ = std::io::stderr().lock().write_all(buf.as_bytes());
}

/// Whether stderr is a terminal (progress bars) or a log / pipe (plain lines).
#[must_use]
pub fn is_terminal() -> bool {
    std::io::stderr().is_terminal()
}

/// At most one progress line per period, from any thread (the first after `period` has passed
/// since the start or the last line).
pub struct Every {
    period: Duration,
    last: Mutex<Instant>,
}

impl Every {
    #[must_use]
    pub fn new(period: Duration) -> Self {
        Self { period, last: Mutex::new(Instant::now()) }
    }

    /// Print `text()` as a [`line`] if the period has passed.
    pub fn tick(&self, text: impl FnOnce() -> String) {
        if let Ok(mut t) = self.last.lock() {
            if t.elapsed() >= self.period {
                *t = Instant::now();
                line(&text());
            }
        }
    }
}

/// Lines on a command's writer (its `ctx.err`) from `image sync` / `image build` and the venv
/// build `image build` may need first (`setup [i/n] label`).
pub struct WriterLines<'a>(Mutex<&'a mut dyn Write>);

impl<'a> WriterLines<'a> {
    #[must_use]
    pub fn new(out: &'a mut dyn Write) -> Self {
        Self(Mutex::new(out))
    }

    fn write(&self, text: &str) {
        if let Ok(mut w) = self.0.lock() {
            let _ = writeln!(w, "{text}");
        }
    }
}

impl crate::image_sync::SyncReporter for WriterLines<'_> {
    fn line(&self, text: &str) {
        self.write(text);
    }
}

impl crate::runtime::docker::image_build::BuildReporter for WriterLines<'_> {
    fn line(&self, text: &str) {
        self.write(text);
    }
}

impl SetupReporter for WriterLines<'_> {
    fn step(&self, index: usize, total: usize, label: &str) {
        self.write(&format!("setup [{index}/{total}] {label}"));
    }
    fn step_done(&self, _: &str, _: f64) {}
    fn still(&self, label: &str, secs: f64) {
        self.write(&format!("setup {label}: still running, {secs:.0} s"));
    }
}

/// Writes `[i/n] label …` and `done in X s` lines to stderr.
pub struct Lines {
    quiet: bool,
    out: Mutex<std::io::Stderr>,
}

impl Lines {
    #[must_use]
    pub fn new(quiet: bool) -> Self {
        Self { quiet, out: Mutex::new(std::io::stderr()) }
    }

    fn line(&self, text: &str) {
        if self.quiet {
            return;
        }
        if let Ok(mut o) = self.out.lock() {
            let _ = writeln!(o, "{text}");
        }
    }
}

impl SetupReporter for Lines {
    fn step(&self, index: usize, total: usize, label: &str) {
        self.line(&format!("  setup [{index}/{total}] {label} …"));
    }
    fn step_done(&self, label: &str, secs: f64) {
        self.line(&format!("  setup {label}: done in {secs:.1} s"));
    }
    fn still(&self, label: &str, secs: f64) {
        self.line(&format!("  setup {label}: still running, {secs:.0} s"));
    }
}

impl UpReporter for Lines {
    fn phase(&self, name: &str, detail: &str) {
        self.line(&format!("==> {name}: {detail}"));
    }
    fn phase_done(&self, name: &str, secs: f64) {
        self.line(&format!("    {name} done in {secs:.1} s"));
    }
}

/// Packing progress for `pack-engram`: one line per shard, a status line every 5 s.
pub struct PackLines {
    lines: Lines,
    state: Mutex<(std::time::Instant, u64, u64)>,
}

impl PackLines {
    #[must_use]
    pub fn new(quiet: bool) -> Self {
        Self { lines: Lines::new(quiet), state: Mutex::new((std::time::Instant::now(), 0, 0)) }
    }
}

impl crate::engram::pack::PackReporter for PackLines {
    fn shard_started(&self, path: &std::path::Path, bytes: u64) {
        if let Ok(mut s) = self.state.lock() {
            *s = (std::time::Instant::now(), 0, bytes);
        }
        self.lines.line(&format!(
            "  pack-engram: writing {} ({})",
            path.display(),
            crate::kit::bytes::human_size(bytes)
        ));
    }
    fn bytes(&self, n: u64) {
        let Ok(mut s) = self.state.lock() else { return };
        s.1 += n;
        if s.0.elapsed() >= std::time::Duration::from_secs(5) {
            s.0 = std::time::Instant::now();
            #[allow(clippy::cast_precision_loss)]
            let pct = if s.2 == 0 { 100.0 } else { s.1 as f64 * 100.0 / s.2 as f64 };
            self.lines.line(&format!(
                "  pack-engram: {} of {} ({pct:.0}%)",
                crate::kit::bytes::human_size(s.1),
                crate::kit::bytes::human_size(s.2)
            ));
        }
    }
    fn note(&self, message: &str) {
        self.lines.line(&format!("  pack-engram: note: {message}"));
    }
}

/// A progress line is on the terminal (redrawn in place) and must be erased before other output.
static PROGRESS_SHOWN: AtomicBool = AtomicBool::new(false);

fn clear_progress(err: &mut dyn Write) {
    if PROGRESS_SHOWN.swap(false, Ordering::SeqCst) {
        let _ = write!(err, "{CLEAR_LINE}");
    }
}

/// `up`'s lines on stderr (the supervisor's, the gateway's), erasing the progress line first.
pub struct UpLines;

impl ClusterReporter for UpLines {
    fn line(&self, text: &str) {
        let mut err = std::io::stderr();
        clear_progress(&mut err);
        let _ = writeln!(err, "{text}");
    }
}

/// While the engines boot (some started, `/health` not yet 200): seconds since the first engine
/// started and the progress line with every started node's phase.
fn boot_progress(s: &Snapshot) -> Option<(u64, String)> {
    if s.state != State::Starting {
        return None;
    }
    let started: Vec<_> = s.nodes.iter().filter(|n| n.engine_alive && n.uptime_s.is_some()).collect();
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // whole seconds, >= 0
    let secs = started.iter().filter_map(|n| n.uptime_s).fold(0.0, f64::max) as u64;
    if started.is_empty() {
        return None;
    }
    let phases: Vec<(String, Option<String>)> = started.iter().map(|n| (n.name.clone(), n.phase.clone())).collect();
    Some((secs, progress_line(secs, &phases)))
}

/// The boot progress line of `up`: redrawn in place on a terminal, a line a minute otherwise.
pub struct BootProgress {
    pacer: Pacer,
    tty: bool,
}

impl BootProgress {
    #[must_use]
    pub fn new() -> Self {
        let tty = is_terminal();
        Self { pacer: Pacer::new(tty), tty }
    }

    /// Show the boot progress of `s` on `err` (stderr), or erase it once the boot is over.
    pub fn show(&mut self, s: &Snapshot, err: &mut dyn Write) {
        match boot_progress(s) {
            Some((secs, line)) => {
                if let Some(text) = self.pacer.tick(secs, &line) {
                    let _ = write!(err, "{text}");
                    let _ = err.flush();
                    if self.tty {
                        PROGRESS_SHOWN.store(true, Ordering::SeqCst);
                    }
                }
            }
            None => clear_progress(err),
        }
    }
}

impl Default for BootProgress {
    fn default() -> Self {
        Self::new()
    }
}

/// The ready banner's text for a snapshot and the seconds since the start.
pub type Banner = Box<dyn Fn(&Snapshot, f64) -> String + Send>;

/// A thread that shows the boot progress, prints `banner` on stdout once the deployment is
/// ready, and with `verbose` tails the local engine logs on stderr; it ends with the deployment.
pub fn watch_ready(snap: Arc<Mutex<Snapshot>>, verbose: bool, banner: Banner) -> std::thread::JoinHandle<()> {
    let started = Instant::now();
    std::thread::spawn(move || {
        let mut tails: Vec<String> = Vec::new();
        let mut printed = false;
        let mut progress = BootProgress::new();
        let mut last_tick = Instant::now();
        loop {
            let s = match snap.lock() {
                Ok(s) => s.clone(),
                Err(_) => return,
            };
            if verbose {
                for log in s.nodes.iter().filter_map(|n| n.engine_log.as_ref()) {
                    if !tails.contains(log) && std::path::Path::new(log).exists() {
                        tails.push(log.clone());
                        let log = log.clone();
                        std::thread::spawn(move || tail_file(&log));
                    }
                }
            }
            if last_tick.elapsed() >= Duration::from_secs(1) || boot_progress(&s).is_none() {
                last_tick = Instant::now();
                progress.show(&s, &mut std::io::stderr());
            }
            if !printed && s.state == State::Ready {
                printed = true;
                let mut out = std::io::stdout();
                let _ = writeln!(out, "{}", banner(&s, started.elapsed().as_secs_f64()));
                let _ = out.flush();
            }
            if matches!(s.state, State::Stopped | State::Failed) {
                return;
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    })
}

/// Print new lines of a local engine log (they carry their node and rank tags).
fn tail_file(path: &str) {
    use std::io::{BufRead, Seek};
    let Ok(mut f) = std::fs::File::open(path) else { return };
    let _ = f.seek(std::io::SeekFrom::End(0));
    let mut r = std::io::BufReader::new(f);
    let mut line = String::new();
    loop {
        line.clear();
        match r.read_line(&mut line) {
            Ok(0) => std::thread::sleep(Duration::from_millis(200)),
            Ok(_) => {
                let _ = writeln!(std::io::stderr(), "{}", line.trim_end());
            }
            Err(_) => return,
        }
    }
}
