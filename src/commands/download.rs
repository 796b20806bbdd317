//! `spark-kit download`: the kit's model repo (every file) and Engram files into the HF cache,
//! verified, then the slim Engram directory and `spark-kit.lock`.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::verify::size;
use super::{io_failure, load, Context};
use crate::cli::{DownloadArgs, Only};
use crate::dirs::Dirs;
use crate::engine::model::hf_cache;
use crate::error::Failure;
use crate::hub::api::HubClient;
use crate::hub::auth::find_token;
use crate::hub::fetch::Options;
use crate::hub::lockfile::LockFile;
use crate::hub::report::{Reporter, Silent};
use crate::hub::retry::Backoff;
use crate::hub::run::{download, EngramTarget, RepoRequest, Request, Summary, Want};
use crate::hub::{endpoint, HubError};
use crate::kit::bytes::{ByteSize, KIB};
use crate::kit::schema::{Kit, ModelSource};

/// Seconds between plain progress lines when stderr is not a terminal.
const LOG_EVERY: Duration = Duration::from_secs(5);

/// A library error as a command failure (configuration problems exit 2).
pub(super) fn hub_failure(e: &HubError) -> Failure {
    let f = if e.is_config() { Failure::usage(e.to_string()) } else { Failure::runtime(e.to_string()) };
    match e.hint() {
        Some(h) => f.with_hint(h),
        None => f,
    }
}

/// The HF cache of a kit: `paths.hf_cache`, `HF_HUB_CACHE`, `HF_HOME/hub`, `~/.cache/huggingface/hub`.
pub(super) fn kit_hf_cache(kit: &Kit, env: &[(String, String)], dirs: &Dirs) -> PathBuf {
    let configured = kit.paths.hf_cache.as_deref().map(|p| dirs.expand(p));
    hf_cache(configured.as_deref(), env, &dirs.home)
}

/// Where `download` records what it fetched: `<paths.data_dir>/<kit name>/spark-kit.lock`.
pub(super) fn lock_path(kit: &Kit, dirs: &Dirs) -> PathBuf {
    dirs.expand(&kit.paths.data_dir).join(&kit.name).join("spark-kit.lock")
}

fn requests(kit: &Kit, only: Option<Only>, dirs: &Dirs) -> Result<Vec<RepoRequest>, Failure> {
    let mut out = Vec::new();
    if only != Some(Only::Engram) {
        if kit.model.source == ModelSource::Hub {
            out.push(RepoRequest {
                repo: kit.model.repo.clone(),
                revision: kit.model.revision.clone(),
                want: Want::All { required: kit.model.files.clone(), expected_shards: kit.model.expected_shards },
                key: "model.files",
                engram: None,
            });
        } else if only == Some(Only::Model) {
            return Err(Failure::usage(format!(
                "kit `{}` has model.source `{}`, not `hub`: there is no model to download",
                kit.name,
                serde_json::to_value(kit.model.source)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default()
            ))
            .with_hint("use a kit whose model comes from the Hub (spark-kit kits)"));
        }
    }
    if only != Some(Only::Model) {
        match &kit.engram {
            Some(e) => out.push(RepoRequest {
                repo: e.repo.clone(),
                revision: e.revision.clone(),
                want: Want::Only(e.files.clone()),
                key: "engram.files",
                engram: Some(EngramTarget { dir: dirs.expand(&kit.paths.engram_dir), layers: e.layers.clone() }),
            }),
            None if only == Some(Only::Engram) => {
                return Err(Failure::usage(format!("kit `{}` has no `engram` section", kit.name))
                    .with_hint("drop --only engram, or use a kit with Engram tables"))
            }
            None => {}
        }
    }
    if out.is_empty() {
        return Err(Failure::usage(format!("kit `{}` names nothing on the Hub to download", kit.name))
            .with_hint("its model is made locally (`spark-kit up` does that); `download` is for Hub kits"));
    }
    Ok(out)
}

pub fn run(args: &DownloadArgs, ctx: &mut Context<'_>) -> Result<(), Failure> {
    if !(1..=256).contains(&args.jobs) {
        return Err(
            Failure::usage(format!("--jobs {} is out of range", args.jobs)).with_hint("use 1 to 256 (default 16)")
        );
    }
    let range_size: ByteSize = args.range_size.parse().map_err(|e| Failure::usage(format!("--range-size: {e}")))?;
    if range_size.bytes() < 4 * KIB {
        return Err(Failure::usage("--range-size is below 4KiB").with_hint("use e.g. 32MiB (the default)"));
    }
    if args.idle_timeout == 0 || args.retries == 0 {
        return Err(Failure::usage("--idle-timeout and --retries must be at least 1"));
    }
    let resolved = load::resolve(&args.kit, &ctx.env)?;
    let kit = &resolved.kit;
    let dirs = Dirs::from_env(&ctx.env);
    let repos = requests(kit, args.only, &dirs)?;
    let cache = kit_hf_cache(kit, &ctx.env, &dirs);
    let opts = Options {
        jobs: args.jobs,
        range_size: range_size.bytes(),
        idle: Duration::from_secs(args.idle_timeout),
        backoff: Backoff { max_attempts: args.retries, ..Backoff::default() },
    };
    let token = find_token(&ctx.env, &dirs.home, |p| std::fs::read_to_string(p).ok());
    let req = Request { hf_cache: cache, repos, opts, dry_run: args.dry_run };
    let reporter: Arc<dyn Reporter> = if args.quiet {
        Arc::new(Silent)
    } else if std::io::stderr().is_terminal() {
        Arc::new(Bars::new())
    } else {
        Arc::new(Lines::new())
    };
    let client = HubClient::new(&endpoint(&ctx.env), token, args.jobs, opts.backoff, opts.idle)
        .map_err(|e| hub_failure(&e))?
        .with_reporter(reporter.clone());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(std::thread::available_parallelism().map_or(2, |n| n.get().clamp(2, 8)))
        .enable_all()
        .build()
        .map_err(|e| Failure::runtime(format!("cannot start the async runtime: {e}")))?;
    let summary = rt.block_on(download(Arc::new(client), &req, reporter.clone())).map_err(|e| hub_failure(&e))?;
    drop(rt);
    // Clears the bars before the summary is printed.
    drop(reporter);
    let lock = lock_path(kit, &dirs);
    if !args.dry_run {
        let mut lf = LockFile::load(&lock).unwrap_or(LockFile {
            version: LockFile::VERSION,
            kit: kit.name.clone(),
            files: vec![],
        });
        lf.kit.clone_from(&kit.name);
        let repos: Vec<String> = summary.repos.iter().map(|r| r.repo.clone()).collect();
        lf.merge(&repos, summary.lock.clone());
        lf.save(&lock).map_err(|e| hub_failure(&e))?;
    }
    let text = if args.json {
        let mut v = serde_json::to_value(&summary).map_err(|e| Failure::runtime(e.to_string()))?;
        if !args.dry_run {
            v["lock_file"] = serde_json::Value::String(lock.display().to_string());
        }
        serde_json::to_string_pretty(&v).map_err(|e| Failure::runtime(e.to_string()))?
    } else {
        human(&summary, &lock)
    };
    writeln!(ctx.out, "{}", text.trim_end()).map_err(|e| io_failure(&e))
}

#[allow(clippy::cast_precision_loss)]
fn rate(bytes: u64, secs: f64) -> String {
    format!("{}/s", size((bytes as f64 / secs.max(1e-3)) as u64))
}

fn human(s: &Summary, lock: &Path) -> String {
    let mut t = String::new();
    for r in &s.repos {
        let _ = writeln!(
            t,
            "{} @ {} (commit {}): {} files, {}",
            r.repo,
            r.revision,
            r.commit,
            r.files.len(),
            size(r.bytes)
        );
        if s.dry_run {
            for l in &r.files {
                let state = if l.to_fetch == 0 {
                    "cached".to_string()
                } else if l.to_fetch < l.file.size {
                    format!("resume, {} to fetch", size(l.to_fetch))
                } else {
                    "to fetch".to_string()
                };
                let _ = writeln!(t, "  {:<48} {:>12}  {state}", l.file.path, size(l.file.size));
            }
        }
        if let Some(e) = &r.engram {
            let _ = writeln!(
                t,
                "  engram slim dir {}: {} shards, {} embed tensors{}",
                e.dir.display(),
                e.shards.len(),
                e.tensors,
                if e.copied.is_empty() {
                    String::new()
                } else {
                    format!(" ({} copied, not hardlinked)", e.copied.len())
                }
            );
        }
    }
    if s.dry_run {
        let _ = writeln!(
            t,
            "dry run: {} files, {} total, {} to fetch into {}",
            s.files,
            size(s.bytes),
            size(s.to_fetch),
            s.hf_cache.display()
        );
        return t;
    }
    let _ = writeln!(
        t,
        "{} files verified in {} ({} downloaded, {} already cached); fetched {} in {:.1} s ({}), resumed {}, {} retries",
        s.files,
        s.hf_cache.display(),
        s.downloaded_files,
        s.cached_files,
        size(s.fetched_bytes),
        s.seconds,
        rate(s.fetched_bytes, s.seconds),
        size(s.resumed_bytes),
        s.retries
    );
    let _ = writeln!(t, "lock file: {}", lock.display());
    t
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
        let _ = writeln!(std::io::stderr().lock(), "{text}");
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
