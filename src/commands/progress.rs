//! Progress lines on stderr for setup and bring-up (plain lines: readable in logs and CI).

use std::io::Write;
use std::sync::Mutex;

use crate::agent::runtime::UpReporter;
use crate::engine::venv::SetupReporter;

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
