//! The Hugging Face cache layout (`models--owner--name/{blobs,snapshots,refs}`, `.locks/`; the
//! folder name is `deploy::hf::repo_folder`), written the way `huggingface_hub` reads it offline: relative symlinks, `refs/<rev>` without
//! a newline, no `trees/` file.

use std::collections::HashSet;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};

use super::error::HubError;
use super::journal::Journal;
use super::paths::is_safe_ref;
use crate::deploy::hf::repo_folder;

/// Suffix of a partial blob (a private name: old Python clients would promote `.incomplete`).
pub const PARTIAL: &str = "spark-partial";

/// One repo's folder in the cache.
#[derive(Debug, Clone)]
pub struct RepoCache {
    pub root: PathBuf,
    pub dir: PathBuf,
    pub repo: String,
}

/// An exclusive `flock` on `.locks/models--owner--name/<blob>.lock`, released on drop.
pub struct BlobLock {
    _lock: Flock<File>,
}

impl RepoCache {
    #[must_use]
    pub fn new(root: &Path, repo: &str) -> Self {
        Self { root: root.to_path_buf(), dir: root.join(repo_folder(repo)), repo: repo.to_string() }
    }

    #[must_use]
    pub fn blob(&self, name: &str) -> PathBuf {
        self.dir.join("blobs").join(name)
    }

    #[must_use]
    pub fn partial(&self, name: &str) -> PathBuf {
        self.dir.join("blobs").join(format!("{name}.{PARTIAL}"))
    }

    #[must_use]
    pub fn journal(&self, name: &str) -> PathBuf {
        self.dir.join("blobs").join(format!("{name}.{PARTIAL}.json"))
    }

    /// Where a blob that failed its hash is kept aside (`blobs/<name>.spark-bad`): out of every
    /// reader's way, on the same filesystem, for the user to inspect or delete.
    #[must_use]
    pub fn aside(&self, name: &str) -> PathBuf {
        self.dir.join("blobs").join(format!("{name}.spark-bad"))
    }

    /// Move `blobs/<name>` aside (under its lock); returns where it went. The snapshot link then
    /// dangles until the blob is fetched again.
    pub fn move_aside(&self, name: &str, path: &str) -> Result<PathBuf, HubError> {
        let _lock = self.lock(name, path)?;
        let (from, to) = (self.blob(name), self.aside(name));
        fs::rename(&from, &to).map_err(|e| HubError::io(&from, e))?;
        Ok(to)
    }

    #[must_use]
    pub fn snapshot(&self, commit: &str, path: &str) -> PathBuf {
        self.dir.join("snapshots").join(commit).join(path)
    }

    fn mkdirs(&self, p: &Path) -> Result<(), HubError> {
        fs::create_dir_all(p).map_err(|e| HubError::io(p, e))
    }

    /// Take the blob's lock without waiting; `Busy` when another process holds it.
    pub fn lock(&self, name: &str, path: &str) -> Result<BlobLock, HubError> {
        let dir = self.root.join(".locks").join(repo_folder(&self.repo));
        self.mkdirs(&dir)?;
        self.mkdirs(&self.dir.join("blobs"))?;
        let lock = dir.join(format!("{name}.lock"));
        let f = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock)
            .map_err(|e| HubError::io(&lock, e))?;
        match Flock::lock(f, FlockArg::LockExclusiveNonblock) {
            Ok(l) => Ok(BlobLock { _lock: l }),
            Err((_, nix::errno::Errno::EWOULDBLOCK)) => Err(HubError::Busy { lock, path: path.into() }),
            Err((_, e)) => Err(HubError::io(&lock, std::io::Error::from(e))),
        }
    }

    /// Whether the finished blob is there with the right size.
    #[must_use]
    pub fn has_blob(&self, name: &str, size: u64) -> bool {
        fs::metadata(self.blob(name)).is_ok_and(|m| m.is_file() && m.len() == size)
    }

    /// Move a verified partial into place as `blobs/<name>`.
    pub fn promote(&self, partial: &Path, name: &str) -> Result<(), HubError> {
        let dest = self.blob(name);
        fs::rename(partial, &dest).map_err(|e| HubError::io(&dest, e))
    }

    /// Write a verified small file as `blobs/<name>` (temp file, fsync, rename).
    pub fn write_blob(&self, name: &str, bytes: &[u8]) -> Result<(), HubError> {
        let tmp = self.partial(name);
        self.mkdirs(&self.dir.join("blobs"))?;
        let mut f = File::create(&tmp).map_err(|e| HubError::io(&tmp, e))?;
        f.write_all(bytes).and_then(|()| f.sync_data()).map_err(|e| HubError::io(&tmp, e))?;
        self.promote(&tmp, name)
    }

    /// `snapshots/<commit>/<path>` → `../../blobs/<name>` (one more `../` per directory level).
    pub fn link(&self, commit: &str, path: &str, name: &str) -> Result<(), HubError> {
        let link = self.snapshot(commit, path);
        if let Some(parent) = link.parent() {
            self.mkdirs(parent)?;
        }
        let target = format!("{}blobs/{name}", "../".repeat(2 + path.matches('/').count()));
        if fs::read_link(&link).is_ok_and(|t| t == Path::new(&target)) {
            return Ok(());
        }
        let tmp = link.with_file_name(format!(
            ".{}.spark-link",
            link.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
        ));
        let _ = fs::remove_file(&tmp);
        std::os::unix::fs::symlink(&target, &tmp).map_err(|e| HubError::io(&tmp, e))?;
        fs::rename(&tmp, &link).map_err(|e| HubError::io(&link, e))
    }

    /// `refs/<revision>` = commit, no trailing newline, written atomically (nothing for a commit).
    pub fn write_ref(&self, revision: &str, commit: &str) -> Result<(), HubError> {
        if revision.eq_ignore_ascii_case(commit) || !is_safe_ref(revision) {
            return Ok(());
        }
        let path = self.dir.join("refs").join(revision);
        if let Some(parent) = path.parent() {
            self.mkdirs(parent)?;
        }
        let tmp = path.with_file_name(format!(
            ".{}.spark-tmp",
            path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
        ));
        fs::write(&tmp, commit.as_bytes()).map_err(|e| HubError::io(&tmp, e))?;
        fs::rename(&tmp, &path).map_err(|e| HubError::io(&path, e))
    }

    /// Partial blobs not in `keep` as (blob name, partial, journal path, journal).
    #[must_use]
    pub fn stale_partials(&self, keep: &HashSet<String>) -> Vec<(String, PathBuf, PathBuf, Option<Journal>)> {
        let Ok(rd) = fs::read_dir(self.dir.join("blobs")) else { return Vec::new() };
        let suffix = format!(".{PARTIAL}");
        rd.flatten()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                let blob = name.strip_suffix(&suffix)?.to_string();
                (!keep.contains(&blob)).then(|| {
                    let j = self.journal(&blob);
                    let journal = Journal::load(&j);
                    (blob, e.path(), j, journal)
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout() {
        let d = tempfile::tempdir().unwrap();
        let c = RepoCache::new(d.path(), "org/name");
        assert!(c.dir.ends_with("models--org--name"));
        c.write_blob("abc", b"hi").unwrap();
        c.link("c0mmit", "sub/dir/f.json", "abc").unwrap();
        c.link("c0mmit", "sub/dir/f.json", "abc").unwrap();
        let l = c.snapshot("c0mmit", "sub/dir/f.json");
        assert_eq!(fs::read_link(&l).unwrap(), Path::new("../../../../blobs/abc"));
        assert_eq!(fs::read(&l).unwrap(), b"hi");
        c.write_ref("main", "c0mmit").unwrap();
        assert_eq!(fs::read(c.dir.join("refs/main")).unwrap(), b"c0mmit");
        c.write_ref("refs/pr/1", "c0mmit").unwrap();
        assert_eq!(fs::read(c.dir.join("refs/refs/pr/1")).unwrap(), b"c0mmit");
        let first = c.lock("abc", "f").unwrap();
        assert!(matches!(c.lock("abc", "f"), Err(HubError::Busy { .. })));
        drop(first);
        assert!(c.lock("abc", "f").is_ok());
        assert!(d.path().join(".locks/models--org--name/abc.lock").exists());
    }
}
