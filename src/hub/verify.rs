//! Check the cache against `spark-kit.lock`: presence and size, and (unless fast) SHA-256,
//! files hashed in parallel with the page cache dropped behind the reader.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use serde::Serialize;

use super::cache::RepoCache;
use super::hashing::sha256_file;
use super::lockfile::LockEntry;

/// The verdict on one file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Status {
    Ok,
    Missing { reason: String },
    Size { expected: u64, actual: u64 },
    Sha256 { expected: String, actual: String },
}

/// One checked file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Checked {
    pub repo: String,
    pub path: String,
    pub size: u64,
    pub file: PathBuf,
    #[serde(flatten)]
    pub status: Status,
}

/// Where a lock entry lives in the cache.
#[must_use]
pub fn cache_path(hf_cache: &Path, e: &LockEntry) -> PathBuf {
    RepoCache::new(hf_cache, &e.repo).snapshot(&e.commit, &e.path)
}

fn check(hf_cache: &Path, e: &LockEntry, fast: bool, progress: &(dyn Fn(u64) + Sync)) -> Checked {
    let file = cache_path(hf_cache, e);
    let status = match File::open(&file).and_then(|f| f.metadata().map(|m| (f, m.len()))) {
        Err(err) => Status::Missing { reason: dangling(&file).unwrap_or_else(|| err.to_string()) },
        Ok((_, len)) if len != e.size => Status::Size { expected: e.size, actual: len },
        Ok(_) if fast => Status::Ok,
        Ok((f, _)) => match sha256_file(&f, progress) {
            Err(err) => Status::Missing { reason: format!("read failed: {err}") },
            Ok((h, _)) if h == e.sha256 => Status::Ok,
            Ok((h, _)) => Status::Sha256 { expected: e.sha256.clone(), actual: h },
        },
    };
    Checked { repo: e.repo.clone(), path: e.path.clone(), size: e.size, file, status }
}

/// `Some(why)` when `file` is reached through a symlink whose target is gone (a cache written by
/// `hf` with its shared blob store moved or pruned): names the first link that dangles.
fn dangling(file: &Path) -> Option<String> {
    let mut at = file.to_path_buf();
    for _ in 0..8 {
        let target = std::fs::read_link(&at).ok()?;
        let next = at.parent().map_or_else(|| target.clone(), |d| d.join(&target));
        if std::fs::symlink_metadata(&next).is_err() {
            return Some(format!("dangling symlink: {} → {} does not exist", at.display(), target.display()));
        }
        at = next;
    }
    None
}

/// Check every entry with `threads` readers (largest files first); results in lock order.
pub fn verify(
    hf_cache: &Path,
    entries: &[LockEntry],
    fast: bool,
    threads: usize,
    progress: &(dyn Fn(u64) + Sync),
) -> Vec<Checked> {
    let mut order: Vec<usize> = (0..entries.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(entries[i].size));
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<Checked>>> = Mutex::new(vec![None; entries.len()]);
    std::thread::scope(|s| {
        for _ in 0..threads.clamp(1, entries.len().max(1)) {
            s.spawn(|| loop {
                let k = next.fetch_add(1, Ordering::SeqCst);
                let Some(&i) = order.get(k) else { return };
                let c = check(hf_cache, &entries[i], fast, progress);
                if let Ok(mut r) = results.lock() {
                    r[i] = Some(c);
                }
            });
        }
    });
    results.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner).into_iter().flatten().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hub::hashing::sha256;

    #[test]
    fn statuses() {
        let d = tempfile::tempdir().unwrap();
        let c = RepoCache::new(d.path(), "o/n");
        let mk = |path: &str, body: &[u8]| {
            c.write_blob(&sha256(body), body).unwrap();
            c.link("c", path, &sha256(body)).unwrap();
            LockEntry {
                repo: "o/n".into(),
                revision: "main".into(),
                commit: "c".into(),
                path: path.into(),
                size: body.len() as u64,
                sha256: sha256(body),
                git_sha1: None,
            }
        };
        let good = mk("a", b"aaaa");
        let mut bad_hash = mk("b", b"bbbb");
        bad_hash.sha256 = sha256(b"other");
        let mut bad_size = mk("c", b"cc");
        bad_size.size = 3;
        let mut missing = good.clone();
        missing.path = "nope".into();
        let entries = [good, bad_hash, bad_size, missing];
        let r = verify(d.path(), &entries, false, 2, &|_| {});
        assert!(matches!(r[0].status, Status::Ok));
        assert!(matches!(r[1].status, Status::Sha256 { .. }));
        assert!(matches!(r[2].status, Status::Size { expected: 3, actual: 2 }));
        assert!(matches!(r[3].status, Status::Missing { .. }));
        let fast = verify(d.path(), &entries, true, 2, &|_| {});
        assert!(matches!(fast[1].status, Status::Ok));

        // A shared-blob cache (as `hf` writes it): blobs/<etag> → ../../blobs/<2hex>/<xet hash>.
        let shared = d.path().join("blobs/ab");
        std::fs::create_dir_all(&shared).unwrap();
        std::fs::write(shared.join("x1"), b"dddd").unwrap();
        std::os::unix::fs::symlink("../../blobs/ab/x1", c.blob(&sha256(b"dddd"))).unwrap();
        c.link("c", "d", &sha256(b"dddd")).unwrap();
        let linked = LockEntry { path: "d".into(), size: 4, sha256: sha256(b"dddd"), ..entries[0].clone() };
        assert!(matches!(verify(d.path(), std::slice::from_ref(&linked), false, 1, &|_| {})[0].status, Status::Ok));
        std::fs::remove_file(shared.join("x1")).unwrap();
        let r = verify(d.path(), &[linked], false, 1, &|_| {});
        let Status::Missing { reason } = &r[0].status else { panic!("{:?}", r[0]) };
        assert!(reason.starts_with("dangling symlink: ") && reason.contains("blobs/ab/x1"), "{reason}");
    }
}
