//! `spark-kit.lock`: what `download` put in the cache (repo, commit, path, size, sha256), the
//! reference `verify` checks against.

use std::fs;
use std::io::Write;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::error::HubError;

/// One verified file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockEntry {
    pub repo: String,
    pub revision: String,
    pub commit: String,
    pub path: String,
    pub size: u64,
    pub sha256: String,
    /// Git blob id of regular (non-LFS) files; their cache blob is named by it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub git_sha1: Option<String>,
}

/// The lock file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct LockFile {
    pub version: u32,
    pub kit: String,
    pub files: Vec<LockEntry>,
}

impl LockFile {
    pub const VERSION: u32 = 1;

    /// Read the lock file; a missing one is an error naming the command that writes it.
    pub fn load(path: &Path) -> Result<Self, HubError> {
        let text = fs::read(path).map_err(|e| HubError::io(path, e))?;
        let lf: Self =
            serde_json::from_slice(&text).map_err(|source| HubError::BadLock { path: path.to_path_buf(), source })?;
        if lf.version != Self::VERSION {
            return Err(HubError::LockVersion { path: path.to_path_buf(), found: lf.version, expected: Self::VERSION });
        }
        Ok(lf)
    }

    /// Replace the entries of `repos` with `entries`, keeping other repos' entries.
    pub fn merge(&mut self, repos: &[String], entries: Vec<LockEntry>) {
        self.files.retain(|e| !repos.contains(&e.repo));
        self.files.extend(entries);
        self.files.sort_by(|a, b| (&a.repo, &a.path).cmp(&(&b.repo, &b.path)));
    }

    /// Write atomically (temp file, fsync, rename).
    pub fn save(&self, path: &Path) -> Result<(), HubError> {
        if let Some(p) = path.parent() {
            fs::create_dir_all(p).map_err(|e| HubError::io(p, e))?;
        }
        let tmp = path.with_extension("lock.tmp");
        let mut text = serde_json::to_vec_pretty(self)
            .map_err(|source| HubError::Json { what: path.display().to_string(), source })?;
        text.push(b'\n');
        let mut f = fs::File::create(&tmp).map_err(|e| HubError::io(&tmp, e))?;
        f.write_all(&text).and_then(|()| f.sync_all()).map_err(|e| HubError::io(&tmp, e))?;
        fs::rename(&tmp, path).map_err(|e| HubError::io(path, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(repo: &str, path: &str) -> LockEntry {
        LockEntry {
            repo: repo.into(),
            revision: "main".into(),
            commit: "c".into(),
            path: path.into(),
            size: 1,
            sha256: "s".into(),
            git_sha1: None,
        }
    }

    #[test]
    fn merge_save_load() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("k/spark-kit.lock");
        let mut lf =
            LockFile { version: LockFile::VERSION, kit: "k".into(), files: vec![e("a/b", "x"), e("c/d", "y")] };
        lf.merge(&["a/b".into()], vec![e("a/b", "z")]);
        assert_eq!(lf.files.iter().map(|f| f.path.as_str()).collect::<Vec<_>>(), ["z", "y"]);
        lf.save(&p).unwrap();
        assert_eq!(LockFile::load(&p).unwrap(), lf);
        assert!(matches!(LockFile::load(&d.path().join("nope")), Err(HubError::Io { .. })));
    }
}
