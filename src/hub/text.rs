//! What `download` and `verify` print: the download summary and the lock check's verdict.

use std::fmt::Write as _;
use std::path::Path;

use super::run::Summary;
use super::verify::{Checked, Status};
use crate::kit::bytes::human_size as size;

/// Bytes over seconds as a human rate (`12.0 MiB/s`).
#[allow(clippy::cast_precision_loss)]
#[must_use]
pub fn rate(bytes: u64, secs: f64) -> String {
    format!("{}/s", size((bytes as f64 / secs.max(1e-3)) as u64))
}

/// `download`'s summary: per repo, its files when `--dry-run`, the slim Engram directory, then
/// the totals and the lock file.
#[must_use]
pub fn summary(s: &Summary, lock: &Path) -> String {
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
    if s.xet_files > 0 {
        parts.push(format!("{} through the Xet protocol", s.xet_files));
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

/// `verify`'s verdict: one `FAILED` line per bad file, then the count against the lock file;
/// `mode` is `sizes` (`--fast`) or `sha256`.
#[must_use]
pub fn verify_report(results: &[Checked], mode: &str, seconds: f64, lock: &Path) -> String {
    let mut s = String::new();
    let mut ok = 0;
    for c in results {
        let what = match &c.status {
            Status::Ok => {
                ok += 1;
                continue;
            }
            Status::Missing { reason } => format!("missing ({reason})"),
            Status::Size { expected, actual } => format!("size {actual}, expected {expected}"),
            Status::Sha256 { expected, actual } => format!("sha256 {actual}, expected {expected}"),
        };
        let _ = writeln!(s, "FAILED {} {}: {what} ({})", c.repo, c.path, c.file.display());
    }
    let bytes: u64 = results.iter().map(|c| c.size).sum();
    let _ = writeln!(
        s,
        "{ok} of {} files ok ({mode}, {}) in {seconds:.1} s against {}",
        results.len(),
        size(bytes),
        lock.display()
    );
    s
}

/// `verify --json`: the lock check as one object.
#[must_use]
pub fn verify_json(results: &[Checked], mode: &str, seconds: f64, lock: &Path, hf_cache: &Path) -> serde_json::Value {
    let failed = results.iter().filter(|c| c.status != Status::Ok).count();
    let bytes: u64 = results.iter().map(|c| c.size).sum();
    serde_json::json!({
        "lock_file": lock, "hf_cache": hf_cache, "mode": mode, "files": results.len(),
        "ok": results.len() - failed, "failed": failed, "bytes": bytes, "seconds": seconds,
        "results": results,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn checked(path: &str, status: Status) -> Checked {
        Checked { repo: "o/r".into(), path: path.into(), size: 1024, file: format!("/c/{path}").into(), status }
    }

    #[test]
    fn the_verify_report_names_each_bad_file_then_counts() {
        let r = vec![
            checked("a", Status::Ok),
            checked("b", Status::Size { expected: 1024, actual: 3 }),
            checked("c", Status::Missing { reason: "gone".into() }),
        ];
        let text = verify_report(&r, "sizes", 1.5, Path::new("/l/spark-kit.lock"));
        assert_eq!(
            text,
            "FAILED o/r b: size 3, expected 1024 (/c/b)\nFAILED o/r c: missing (gone) (/c/c)\n\
             1 of 3 files ok (sizes, 3.0 KiB) in 1.5 s against /l/spark-kit.lock\n"
        );
        let v = verify_json(&r, "sizes", 1.5, Path::new("/l"), Path::new("/c"));
        assert_eq!((v["ok"].as_u64(), v["failed"].as_u64(), v["bytes"].as_u64()), (Some(1), Some(2), Some(3072)));
    }

    #[test]
    fn a_rate_never_divides_by_zero() {
        assert!(rate(1 << 20, 0.0).ends_with("/s"));
    }
}
