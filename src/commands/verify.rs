//! `spark-kit verify [--fast] [--json]`: the downloaded files against `spark-kit.lock` (sizes and
//! SHA-256); `spark-kit verify --structure [--json]`: the header-only EXL3 structural audit.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::checkpoint_source::checkpoint_in;
use super::{io_failure, load, Context};
use crate::checkpoint::exl3_audit::{audit, AuditOptions};
use crate::cli::VerifyArgs;
use crate::error::Failure;
use crate::hub::kit_files::repair_requests;
use crate::hub::lockfile::{LockEntry, LockFile};
use crate::hub::verify::{verify, Status};
use crate::kit::bytes::human_size as size;
use crate::settings::Settings;

pub fn run(args: &VerifyArgs, ctx: &mut Context<'_>) -> Result<(), Failure> {
    let s = load::settings_for(&args.kit, &ctx.env, crate::kit::validate::MODEL_ONLY)?;
    if !args.structure && !args.decode {
        return lock_check(args, &s, ctx);
    }
    let (ckpt, label) = checkpoint_in(&s, args.model.as_ref(), args.r#virtual, false)?;
    let report = audit(&ckpt, &AuditOptions { k_map: s.kit.model.k_map.clone() })?;
    if args.decode {
        return super::verify_decode::run(args, &s.kit.model.k_map, &ckpt, &label, &report, ctx);
    }
    let text = if args.json {
        serde_json::to_string_pretty(&report)?
    } else {
        crate::checkpoint::text::audit(&report, &label)
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
fn lock_check(args: &VerifyArgs, s: &Settings, ctx: &mut Context<'_>) -> Result<(), Failure> {
    let lock = &s.deploy.lock_file;
    if !lock.exists() {
        return Err(Failure::usage(format!("no lock file {} for kit `{}`", lock.display(), s.kit.name)).with_hint(
            "run `spark-kit download` first (it writes the lock file); `verify --structure` audits headers",
        ));
    }
    let lf = LockFile::load(lock)?;
    let threads = match args.jobs {
        Some(0) => return Err(Failure::usage("--jobs 0: nothing would run").with_hint("use --jobs 1 or more")),
        Some(n) => n,
        None => std::thread::available_parallelism().map_or(2, |n| n.get().min(8)),
    };
    let started = Instant::now();
    let total: u64 = lf.files.iter().map(|e| e.size).sum();
    let hashed = AtomicU64::new(0);
    // A status line on stderr every 5 s while hashing (hundreds of GiB take minutes).
    let every = crate::reporter::Every::new(Duration::from_secs(5));
    let progress = |n: u64| {
        let done = hashed.fetch_add(n, Ordering::Relaxed) + n;
        every.tick(|| format!("verify: hashed {} of {}", size(done), size(total)));
    };
    let results = verify(&s.deploy.hf_cache, &lf.files, args.fast, threads, &progress);
    let seconds = started.elapsed().as_secs_f64();
    let mode = if args.fast { "sizes" } else { "sha256" };
    let text = if args.json {
        let v = crate::hub::text::verify_json(&results, mode, seconds, lock, &s.deploy.hf_cache);
        serde_json::to_string_pretty(&v)?
    } else {
        crate::hub::text::verify_report(&results, mode, seconds, lock)
    };
    writeln!(ctx.out, "{}", text.trim_end()).map_err(|e| io_failure(&e))?;
    let bad: Vec<&LockEntry> = lf
        .files
        .iter()
        .filter(|e| results.iter().any(|c| c.status != Status::Ok && c.repo == e.repo && c.path == e.path))
        .collect();
    if bad.is_empty() {
        Ok(())
    } else if args.repair {
        repair(s, &bad, threads, ctx)
    } else {
        let kit_flag = s.kit_ref.arg.as_deref().map(|k| format!(" --kit {k}")).unwrap_or_default();
        Err(Failure::runtime(format!("{} of {} files failed verification ({mode})", bad.len(), results.len()))
            .with_hint(format!(
                "run `spark-kit verify --repair{kit_flag}`: it moves the bad files aside and fetches them again"
            )))
    }
}

/// `verify --repair`: move each bad blob aside, fetch exactly those files again at their locked
/// commit, and check them once more.
fn repair(s: &Settings, bad: &[&LockEntry], threads: usize, ctx: &mut Context<'_>) -> Result<(), Failure> {
    for e in bad {
        if let Some((blob, aside)) = crate::hub::repair::move_aside(&s.deploy.hf_cache, e)? {
            writeln!(ctx.out, "moved {} aside to {}", blob.display(), aside.display()).map_err(|e| io_failure(&e))?;
        }
    }
    let repos = repair_requests(&s.kit, bad, &s.deploy.engram_dir);
    let reporter = crate::reporter::download::download(false);
    let again = crate::hub::repair::refetch(
        &s.deploy.hf_cache,
        bad,
        repos,
        threads,
        (&ctx.env, &s.deploy.dirs.home),
        reporter,
    )?;
    let still: Vec<_> = again.iter().filter(|c| c.status != Status::Ok).collect();
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
