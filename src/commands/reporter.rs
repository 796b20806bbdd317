//! The terminal for progress: the one place command files write progress lines to the process's
//! stderr from worker threads (where the command's `ctx.err` cannot go), plain lines that read
//! well in logs and CI. Setup and bring-up phases ([`Lines`]), `pack-engram` ([`PackLines`]), and
//! [`line`] / [`is_terminal`] for the others (`verify`, `engine`, the download bars).

use std::io::{IsTerminal, Write};
use std::sync::Mutex;

use crate::agent::runtime::UpReporter;
use crate::engine::venv::SetupReporter;

/// One progress line on stderr (a line at a time, so threads do not interleave within a line).
pub fn line(text: &str) {
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "{}", text.trim_end_matches('\n'));
}

/// Whether stderr is a terminal (progress bars) or a log / pipe (plain lines).
#[must_use]
pub fn is_terminal() -> bool {
    std::io::stderr().is_terminal()
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
