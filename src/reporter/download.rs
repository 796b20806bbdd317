//! `download`'s and `verify --repair`'s progress: bars on a terminal (a total bar and one per
//! file in flight), plain lines for logs and CI, nothing with `--quiet`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::hub::report::{Reporter, Silent};
use crate::hub::text::rate;
use crate::kit::bytes::human_size as size;

/// Seconds between plain progress lines when stderr is not a terminal.
const LOG_EVERY: Duration = Duration::from_secs(5);

/// Bars on a terminal, plain lines otherwise, nothing with `quiet`.
#[must_use]
pub fn download(quiet: bool) -> Arc<dyn Reporter> {
    if quiet {
        Arc::new(Silent)
    } else if super::is_terminal() {
        Arc::new(Bars::new())
    } else {
        Arc::new(Lines::new())
    }
}

/// Terminal progress: a total bar (bytes, rate, ETA) and one bar per file in flight.
struct Bars {
    multi: MultiProgress,
    total: ProgressBar,
    files: Mutex<HashMap<String, ProgressBar>>,
}

impl Bars {
    fn new() -> Self {
        let multi = MultiProgress::with_draw_target(ProgressDrawTarget::stderr());
        let total = multi.add(ProgressBar::new(0));
        total.set_style(
            ProgressStyle::with_template("{prefix:>8} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} ETA {eta}")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        total.set_prefix("total");
        Self { multi, total, files: Mutex::new(HashMap::new()) }
    }
}

impl Reporter for Bars {
    fn planned(&self, repo: &str, commit: &str, files: usize, total: u64, to_fetch: u64) {
        self.total.inc_length(to_fetch);
        let _ = self.multi.println(format!(
            "{repo} @ {commit}: {files} files, {}, {} to fetch",
            size(total),
            size(to_fetch)
        ));
    }
    fn file_started(&self, path: &str, size: u64, resumed: u64) {
        let bar = self.multi.add(ProgressBar::new(size));
        bar.set_style(
            ProgressStyle::with_template("  {wide_msg} {bytes:>10}/{total_bytes:<10} {bytes_per_sec:>12}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        bar.set_message(path.to_string());
        bar.set_position(resumed);
        if let Ok(mut f) = self.files.lock() {
            f.insert(path.to_string(), bar);
        }
    }
    fn bytes(&self, path: &str, n: u64) {
        self.total.inc(n);
        if let Some(b) = self.files.lock().ok().and_then(|f| f.get(path).cloned()) {
            b.inc(n);
        }
    }
    fn file_done(&self, path: &str) {
        if let Some(b) = self.files.lock().ok().and_then(|mut f| f.remove(path)) {
            b.finish_and_clear();
            self.multi.remove(&b);
        }
    }
    fn retry(&self, path: &str, attempt: u32, reason: &str, delay: Duration) {
        let _ = self.multi.println(format!("retry {attempt} of {path} in {:.1} s: {reason}", delay.as_secs_f32()));
    }
    fn note(&self, message: &str) {
        let _ = self.multi.println(format!("note: {message}"));
    }
}

impl Drop for Bars {
    fn drop(&mut self) {
        self.total.finish_and_clear();
    }
}

/// Plain lines for logs and CI: the plan, a status line every few seconds, retries and notes.
struct Lines {
    start: Instant,
    state: Mutex<(Instant, u64, u64)>,
}

impl Lines {
    fn new() -> Self {
        let now = Instant::now();
        Self { start: now, state: Mutex::new((now, 0, 0)) }
    }
    fn line(text: &str) {
        super::line(text);
    }
}

impl Reporter for Lines {
    fn planned(&self, repo: &str, commit: &str, files: usize, total: u64, to_fetch: u64) {
        if let Ok(mut s) = self.state.lock() {
            s.2 += to_fetch;
        }
        Self::line(&format!(
            "download: {repo} @ {commit}: {files} files, {}, {} to fetch",
            size(total),
            size(to_fetch)
        ));
    }
    fn bytes(&self, _path: &str, n: u64) {
        let Ok(mut s) = self.state.lock() else { return };
        s.1 += n;
        if s.0.elapsed() >= LOG_EVERY {
            s.0 = Instant::now();
            let secs = self.start.elapsed().as_secs_f64();
            #[allow(clippy::cast_precision_loss)]
            let pct = if s.2 == 0 { 100.0 } else { s.1 as f64 * 100.0 / s.2 as f64 };
            Self::line(&format!("download: {} of {} ({pct:.0}%), {}", size(s.1), size(s.2), rate(s.1, secs)));
        }
    }
    fn file_done(&self, path: &str) {
        Self::line(&format!("download: verified {path}"));
    }
    fn retry(&self, path: &str, attempt: u32, reason: &str, delay: Duration) {
        Self::line(&format!("download: retry {attempt} of {path} in {:.1} s: {reason}", delay.as_secs_f32()));
    }
    fn note(&self, message: &str) {
        Self::line(&format!("download: note: {message}"));
    }
}
