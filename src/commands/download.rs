//! `spark-kit download`: the kit's model repo (every file) and Engram files into the HF cache,
//! verified, then the slim Engram directory and `spark-kit.lock`.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use super::hub_output::{hub_failure, rate, reporter, run_download};
use super::{io_failure, load, Context};
use crate::cli::{DownloadArgs, Only};
use crate::dirs::Dirs;
use crate::error::Failure;
use crate::hub::fetch::{Options, DEFAULT_JOURNAL_EVERY};
use crate::hub::kit_files::{kit_hf_cache, lock_path};
use crate::hub::lockfile::LockFile;
use crate::hub::retry::Backoff;
use crate::hub::run::{EngramTarget, RepoRequest, Request, Summary, Want};
use crate::kit::bytes::human_size as size;

use crate::kit::schema::{Kit, ModelSource};

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
    // --jobs, --range-size, --idle-timeout and --retries are checked by their value parsers (src/cli/values.rs).
    let resolved = load::resolve_for(&args.kit, &ctx.env, crate::kit::validate::MODEL_ONLY)?;
    let kit = &resolved.kit;
    let dirs = Dirs::from_env(&ctx.env);
    let repos = requests(kit, args.only, &dirs)?;
    let cache = kit_hf_cache(kit, &ctx.env, &dirs);
    let opts = Options {
        jobs: args.jobs,
        range_size: args.range_size.bytes(),
        idle: Duration::from_secs(args.idle_timeout),
        backoff: Backoff { max_attempts: args.retries, ..Backoff::default() },
        journal_every: DEFAULT_JOURNAL_EVERY,
    };
    let req = Request { hf_cache: cache, repos, opts, dry_run: args.dry_run, verify_cached: args.verify_cached };
    let reporter = reporter(args.quiet);
    let summary = run_download(&req, &ctx.env, &dirs, reporter.clone())?;
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
    let mut parts = Vec::new();
    if s.downloaded_files > 0 {
        parts.push(format!("{} downloaded and verified", s.downloaded_files));
    }
    if s.cached_files > 0 {
        let how = if s.verify_cached {
            format!("re-hashed: {} ok", s.verified_cached)
        } else {
            "size checked, not re-hashed; --verify-cached re-hashes them".to_string()
        };
        parts.push(format!("{} already cached ({how})", s.cached_files));
    }
    if s.repaired_files > 0 {
        parts.push(format!("{} cached file(s) failed the re-hash, moved aside and fetched again", s.repaired_files));
    }
    let _ = writeln!(
        t,
        "{} files in {}: {}; fetched {} in {:.1} s ({}), resumed {}, {} retries",
        s.files,
        s.hf_cache.display(),
        parts.join(", "),
        size(s.fetched_bytes),
        s.seconds,
        rate(s.fetched_bytes, s.seconds),
        size(s.resumed_bytes),
        s.retries
    );
    let _ = writeln!(t, "lock file: {}", lock.display());
    t
}
