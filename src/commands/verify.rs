//! `spark-kit verify [--fast] [--json]`: the downloaded files against `spark-kit.lock` (sizes and
//! SHA-256); `spark-kit verify --structure [--json]`: the header-only EXL3 structural audit.

use std::fmt::Write as _;
use std::path::PathBuf;

use super::{io_failure, load, Context};
use crate::checkpoint::exl3_audit::{audit, AuditOptions, AuditReport, Severity};
use crate::checkpoint::virtual_ckpt::{deepseek_v41_flash_exl3, DeepSeekV41Dims};
use crate::checkpoint::Checkpoint;
use crate::cli::VerifyArgs;
use crate::error::Failure;
use crate::kit::bytes::{GIB, KIB, MIB};
use crate::kit::schema::Kit;

/// Findings printed in the human report before "… and N more".
const MAX_FINDINGS_SHOWN: usize = 40;

/// Whether the kit serves the checkpoint the virtual model describes.
pub(super) fn is_dsv41_flash_exl3(kit: &Kit) -> bool {
    kit.model.repo.to_ascii_lowercase().contains("deepseek-v4.1-flash-exl3")
}

/// The snapshot directory `download` put the kit's model in, from `spark-kit.lock`.
fn downloaded_model(kit: &Kit, env: &[(String, String)]) -> Option<PathBuf> {
    let dirs = crate::dirs::Dirs::from_env(env);
    let lock = crate::hub::lockfile::LockFile::load(&super::download::lock_path(kit, &dirs)).ok()?;
    let entry = lock.files.iter().find(|e| e.repo == kit.model.repo)?;
    let cache = super::download::kit_hf_cache(kit, env, &dirs);
    let dir = crate::hub::cache::RepoCache::new(&cache, &kit.model.repo).snapshot(&entry.commit, "");
    dir.is_dir().then_some(dir)
}

/// The checkpoint a command works on: `--model`, else the kit's `model.path`, else the snapshot
/// `spark-kit download` recorded in `spark-kit.lock`, else (when `allow_virtual`) the modelled
/// DeepSeek V4.1 Flash for kits that serve it. Returns it with a label saying where it came from.
pub(super) fn checkpoint_for(
    kit: &Kit,
    model: Option<&PathBuf>,
    use_virtual: bool,
    allow_virtual: bool,
) -> Result<(Checkpoint, String), Failure> {
    checkpoint_in(kit, &[], model, use_virtual, allow_virtual)
}

/// [`checkpoint_for`] with the process environment, which locates the HF cache and data dir of a
/// downloaded model.
pub(super) fn checkpoint_in(
    kit: &Kit,
    env: &[(String, String)],
    model: Option<&PathBuf>,
    use_virtual: bool,
    allow_virtual: bool,
) -> Result<(Checkpoint, String), Failure> {
    let modelled = || {
        deepseek_v41_flash_exl3(&DeepSeekV41Dims::default())
            .map(|c| (c, "virtual DeepSeek V4.1 Flash EXL3 (modelled shapes, no files)".to_string()))
            .map_err(|e| Failure::runtime(e.to_string()))
    };
    if use_virtual {
        return modelled();
    }
    let path =
        model.cloned().or_else(|| kit.model.path.as_ref().map(PathBuf::from)).or_else(|| downloaded_model(kit, env));
    match path {
        Some(p) => {
            let ckpt = Checkpoint::open(&p).map_err(|e| Failure::runtime(e.to_string()))?;
            Ok((ckpt, format!("checkpoint headers in {}", p.display())))
        }
        None if allow_virtual && is_dsv41_flash_exl3(kit) => modelled(),
        None => Err(Failure::usage(format!("kit `{}` names no local checkpoint directory", kit.name)).with_hint(
            "run `spark-kit download`, or pass --model DIR (a directory of *.safetensors shards), or --virtual for the modelled DeepSeek V4.1 Flash",
        )),
    }
}

/// `812.0 KiB`, `3.4 MiB`, `182.571 GiB`.
#[allow(clippy::cast_precision_loss)]
pub(super) fn size(bytes: u64) -> String {
    let b = bytes as f64;
    if bytes >= GIB {
        format!("{:.3} GiB", b / GIB as f64)
    } else if bytes >= MIB {
        format!("{:.1} MiB", b / MIB as f64)
    } else {
        format!("{:.1} KiB", b / KIB as f64)
    }
}

pub fn run(args: &VerifyArgs, ctx: &mut Context<'_>) -> Result<(), Failure> {
    if !args.structure && !args.decode {
        return lock_check(args, ctx);
    }
    let resolved = load::resolve(&args.kit, &ctx.env)?;
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
        human(&report, &label)
    };
    writeln!(ctx.out, "{}", text.trim_end()).map_err(|e| io_failure(&e))?;
    match report.errors() {
        0 => Ok(()),
        n => Err(Failure::runtime(format!("{n} structural error(s) in the checkpoint ({label})"))
            .with_hint("a checkpoint with structural errors will not load; re-download the named shards")),
    }
}

pub(super) fn human(r: &AuditReport, label: &str) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "{label}: {} shards, {} tensors, {}", r.shards, r.tensors, size(r.total_bytes));
    let codebooks: Vec<String> = r.codebooks.iter().map(|(c, n)| format!("{} {n}", c.name())).collect();
    let _ = writeln!(
        s,
        "packed matrices {}, native tensors {}, codebooks: {}{}",
        r.packed_matrices,
        r.native_tensors,
        if codebooks.is_empty() { "none".to_string() } else { codebooks.join(", ") },
        if r.markers_checked { "" } else { " (marker bytes not checked)" }
    );
    let _ = writeln!(
        s,
        "\n{:<15} {:>7} {:>7} {:>12} {:>6} {:>8}  K",
        "CLASS", "PACKED", "NATIVE", "SIZE", "BPW", "EFF.BPW"
    );
    for c in &r.classes {
        let ks: Vec<String> = c.k_counts.iter().map(|(k, n)| format!("{k}:{n}")).collect();
        let (bpw, eff) = if c.packed_matrices > 0 {
            (format!("{:.3}", c.bpw), format!("{:.3}", c.effective_bpw))
        } else {
            ("-".into(), "-".into())
        };
        let line = format!(
            "{:<15} {:>7} {:>7} {:>12} {:>6} {:>8}  {}",
            c.class.name(),
            c.packed_matrices,
            c.native_tensors,
            size(c.bytes),
            bpw,
            eff,
            ks.join(" ")
        );
        let _ = writeln!(s, "{}", line.trim_end());
    }
    if !r.k_map_disagreements.is_empty() {
        let _ = writeln!(s, "\nK map disagreements (the trellis wins, as at load):");
        for d in &r.k_map_disagreements {
            let layer = d.layer.map(|l| format!(" layer {l}")).unwrap_or_default();
            let _ = writeln!(
                s,
                "  {}{layer}: k_map `{}` = {}, trellis K = {} ({} matrices, e.g. `{}`)",
                d.class.name(),
                d.key,
                d.expected,
                d.trellis,
                d.matrices,
                d.example
            );
        }
    }
    if r.findings.is_empty() {
        let _ = writeln!(s, "\nno structural problems");
    } else {
        let _ = writeln!(s);
        for f in r.findings.iter().take(MAX_FINDINGS_SHOWN) {
            let sev = if f.severity == Severity::Error { "error" } else { "warning" };
            let _ = writeln!(s, "{sev}: {}", f.message);
        }
        if r.findings.len() > MAX_FINDINGS_SHOWN {
            let _ = writeln!(s, "… and {} more (see --json)", r.findings.len() - MAX_FINDINGS_SHOWN);
        }
    }
    s
}

/// `verify` / `verify --fast`: every file of the kit's `spark-kit.lock` — present, right size,
/// and (unless `--fast`) right SHA-256 — hashed in parallel without flooding the page cache.
fn lock_check(args: &VerifyArgs, ctx: &mut Context<'_>) -> Result<(), Failure> {
    use crate::hub::verify::{verify, Status};
    let resolved = load::resolve(&args.kit, &ctx.env)?;
    let kit = &resolved.kit;
    let dirs = crate::dirs::Dirs::from_env(&ctx.env);
    let lock = super::download::lock_path(kit, &dirs);
    if !lock.exists() {
        return Err(Failure::usage(format!("no lock file {} for kit `{}`", lock.display(), kit.name)).with_hint(
            "run `spark-kit download` first (it writes the lock file); `verify --structure` audits headers",
        ));
    }
    let lf = crate::hub::lockfile::LockFile::load(&lock).map_err(|e| super::download::hub_failure(&e))?;
    let cache = super::download::kit_hf_cache(kit, &ctx.env, &dirs);
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
                let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
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
        Ok(())
    } else {
        Err(Failure::runtime(format!("{} of {} files failed verification ({mode})", bad.len(), results.len()))
            .with_hint("rerun `spark-kit download`: it refetches what is missing; delete a corrupt blob first"))
    }
}
