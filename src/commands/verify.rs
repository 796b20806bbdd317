//! `spark-kit verify [--fast] [--json]`: the downloaded files against `spark-kit.lock` (sizes and
//! SHA-256); `spark-kit verify --structure [--json]`: the header-only EXL3 structural audit.

use std::fmt::Write as _;

use super::{io_failure, load, Context};
use crate::checkpoint::exl3_audit::{audit, AuditOptions};
use crate::cli::VerifyArgs;
use crate::error::Failure;
use crate::kit::schema::Kit;

use super::checkpoint_source::checkpoint_in;
use crate::kit::bytes::human_size as size;

pub fn run(args: &VerifyArgs, ctx: &mut Context<'_>) -> Result<(), Failure> {
    if !args.structure && !args.decode {
        return lock_check(args, ctx);
    }
    let resolved = load::resolve_for(&args.kit, &ctx.env, crate::kit::validate::MODEL_ONLY)?;
    let kit = &resolved.kit;
    let (ckpt, label) = checkpoint_in(kit, &ctx.env, args.model.as_ref(), args.r#virtual, false)?;
    let report =
        audit(&ckpt, &AuditOptions { k_map: kit.model.k_map.clone() }).map_err(|e| Failure::runtime(e.to_string()))?;
    if args.decode {
        return super::verify_decode::run(args, &kit.model.k_map, &ckpt, &label, &report, ctx);
    }
    let text = if args.json {
        serde_json::to_string_pretty(&report).map_err(|e| Failure::runtime(e.to_string()))?
    } else {
        super::audit_text::human(&report, &label)
    };
    writeln!(ctx.out, "{}", text.trim_end()).map_err(|e| io_failure(&e))?;
    match report.errors() {
        0 => Ok(()),
        n => Err(Failure::runtime(format!("{n} structural error(s) in the checkpoint ({label})"))
            .with_hint("a checkpoint with structural errors will not load; re-download the named shards")),
    }
}

/// `verify` / `verify --fast`: every file of the kit's `spark-kit.lock` — present, right size,
/// and (unless `--fast`) right SHA-256 — hashed in parallel without flooding the page cache.
fn lock_check(args: &VerifyArgs, ctx: &mut Context<'_>) -> Result<(), Failure> {
    use crate::hub::verify::{verify, Status};
    let resolved = load::resolve_for(&args.kit, &ctx.env, crate::kit::validate::MODEL_ONLY)?;
    let kit = &resolved.kit;
    let dirs = crate::dirs::Dirs::from_env(&ctx.env);
    let lock = crate::hub::kit_files::lock_path(kit, &dirs);
    if !lock.exists() {
        return Err(Failure::usage(format!("no lock file {} for kit `{}`", lock.display(), kit.name)).with_hint(
            "run `spark-kit download` first (it writes the lock file); `verify --structure` audits headers",
        ));
    }
    let lf = crate::hub::lockfile::LockFile::load(&lock).map_err(|e| super::hub_output::hub_failure(&e))?;
    let cache = crate::hub::kit_files::kit_hf_cache(kit, &ctx.env, &dirs);
    let threads = match args.jobs {
        Some(0) => return Err(Failure::usage("--jobs 0: nothing would run").with_hint("use --jobs 1 or more")),
        Some(n) => n,
        None => std::thread::available_parallelism().map_or(2, |n| n.get().min(8)),
    };
    let started = std::time::Instant::now();
    let total: u64 = lf.files.iter().map(|e| e.size).sum();
    let hashed = std::sync::atomic::AtomicU64::new(0);
    let last = std::sync::Mutex::new(started);
    // A status line on stderr every 5 s while hashing (hundreds of GiB take minutes).
    let progress = |n: u64| {
        let done = hashed.fetch_add(n, std::sync::atomic::Ordering::Relaxed) + n;
        if let Ok(mut t) = last.lock() {
            if t.elapsed() >= std::time::Duration::from_secs(5) {
                *t = std::time::Instant::now();
                let line = format!("verify: hashed {} of {}\n", size(done), size(total));
                super::reporter::line(&line);
            }
        }
    };
    let results = verify(&cache, &lf.files, args.fast, threads, &progress);
    let seconds = started.elapsed().as_secs_f64();
    let bad: Vec<_> = results.iter().filter(|c| c.status != Status::Ok).collect();
    let bytes: u64 = results.iter().map(|c| c.size).sum();
    let mode = if args.fast { "sizes" } else { "sha256" };
    let text = if args.json {
        let v = serde_json::json!({
            "lock_file": lock, "hf_cache": cache, "mode": mode, "files": results.len(),
            "ok": results.len() - bad.len(), "failed": bad.len(), "bytes": bytes, "seconds": seconds,
            "results": results,
        });
        serde_json::to_string_pretty(&v).map_err(|e| Failure::runtime(e.to_string()))?
    } else {
        let mut s = String::new();
        for c in &bad {
            let what = match &c.status {
                Status::Ok => continue,
                Status::Missing { reason } => format!("missing ({reason})"),
                Status::Size { expected, actual } => format!("size {actual}, expected {expected}"),
                Status::Sha256 { expected, actual } => format!("sha256 {actual}, expected {expected}"),
            };
            let _ = writeln!(s, "FAILED {} {}: {what} ({})", c.repo, c.path, c.file.display());
        }
        let _ = writeln!(
            s,
            "{} of {} files ok ({mode}, {}) in {seconds:.1} s against {}",
            results.len() - bad.len(),
            results.len(),
            size(bytes),
            lock.display()
        );
        s
    };
    writeln!(ctx.out, "{}", text.trim_end()).map_err(|e| io_failure(&e))?;
    if bad.is_empty() {
        return Ok(());
    }
    if args.repair {
        let bad: Vec<&crate::hub::lockfile::LockEntry> =
            lf.files.iter().filter(|e| bad.iter().any(|c| c.repo == e.repo && c.path == e.path)).collect();
        return repair(kit, &bad, &cache, threads, &dirs, ctx);
    }
    let kit_flag = args.kit.kit.as_deref().map(|k| format!(" --kit {k}")).unwrap_or_default();
    Err(Failure::runtime(format!("{} of {} files failed verification ({mode})", bad.len(), results.len())).with_hint(
        format!("run `spark-kit verify --repair{kit_flag}`: it moves the bad files aside and fetches them again"),
    ))
}

/// `verify --repair`: move each bad blob aside, fetch exactly those files again at their locked
/// commit, and check them once more.
fn repair(
    kit: &Kit,
    bad: &[&crate::hub::lockfile::LockEntry],
    cache: &std::path::Path,
    threads: usize,
    dirs: &crate::dirs::Dirs,
    ctx: &mut Context<'_>,
) -> Result<(), Failure> {
    use crate::hub::repair::{move_aside, requests};
    use crate::hub::run::Request;
    for e in bad {
        if let Some((blob, aside)) = move_aside(cache, e).map_err(|e| super::hub_output::hub_failure(&e))? {
            writeln!(ctx.out, "moved {} aside to {}", blob.display(), aside.display()).map_err(|e| io_failure(&e))?;
        }
    }
    let mut repos = requests(bad);
    // The slim Engram directory hardlinks the shards' blobs: a repaired shard is a new inode, so
    // the directory is rebuilt from the kit's Engram files (the good ones are cached).
    for r in &mut repos {
        if let Some(e) = kit.engram.as_ref().filter(|e| e.repo == r.repo) {
            r.want = crate::hub::run::Want::Only(e.files.clone());
            r.engram = Some(crate::hub::run::EngramTarget {
                dir: dirs.expand(&kit.paths.engram_dir),
                layers: e.layers.clone(),
            });
        }
    }
    let req = Request {
        hf_cache: cache.to_path_buf(),
        repos,
        opts: crate::hub::fetch::Options::default(),
        dry_run: false,
        verify_cached: false,
    };
    super::hub_output::run_download(&req, &ctx.env, dirs, super::hub_output::reporter(false))?;
    let entries: Vec<crate::hub::lockfile::LockEntry> = bad.iter().map(|e| (*e).clone()).collect();
    let again = crate::hub::verify::verify(cache, &entries, false, threads, &|_| {});
    let still: Vec<_> = again.iter().filter(|c| c.status != crate::hub::verify::Status::Ok).collect();
    writeln!(ctx.out, "repaired {} of {} file(s)", again.len() - still.len(), again.len())
        .map_err(|e| io_failure(&e))?;
    match still.first() {
        None => Ok(()),
        Some(c) => Err(Failure::runtime(format!(
            "{} file(s) still fail after the repair, e.g. {} {}: {:?}",
            still.len(),
            c.repo,
            c.path,
            c.status
        ))
        .with_hint(
            "the Hub serves other bytes than the lock file recorded; run `spark-kit download` to refresh the lock",
        )),
    }
}
