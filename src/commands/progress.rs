//! Progress lines on stderr for setup and bring-up (plain lines: readable in logs and CI).

use std::io::Write;
use std::sync::Mutex;

use crate::engine::venv::SetupReporter;
use crate::supervisor::local::UpReporter;

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
