//! `spark-kit.lock`: what `download` put in the cache (repo, commit, path, size, sha256), the
//! reference `verify` checks against; and the engine image's id as preflight first saw it on
//! every node (docker kits), the reference later preflights check every node against.

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

/// An engine image as first seen on every node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageEntry {
    /// `engine.docker_image` as the kit names it (a release tag).
    pub image: String,
    /// Its image id: the sha256 digest of its configuration (`docker image inspect {{.Id}}`),
    /// which `docker save`/`load` and `spark-kit image sync` keep.
    pub id: String,
    /// The vLLM version read inside it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub vllm_version: String,
}

/// The lock file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct LockFile {
    pub version: u32,
    pub kit: String,
    pub files: Vec<LockEntry>,
    /// Engine images (docker kits), one per image reference.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<ImageEntry>,
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

    /// The lock file, or an empty one for `kit` when there is none yet.
    pub fn load_or_new(path: &Path, kit: &str) -> Result<Self, HubError> {
        if path.exists() {
            Self::load(path)
        } else {
            Ok(Self { version: Self::VERSION, kit: kit.to_string(), ..Self::default() })
        }
    }

    /// The recorded entry of `image`.
    #[must_use]
    pub fn image(&self, image: &str) -> Option<&ImageEntry> {
        self.images.iter().find(|e| e.image == image)
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
        let mut lf = LockFile {
            version: LockFile::VERSION,
            kit: "k".into(),
            files: vec![e("a/b", "x"), e("c/d", "y")],
            images: Vec::new(),
        };
        lf.merge(&["a/b".into()], vec![e("a/b", "z")]);
        assert_eq!(lf.files.iter().map(|f| f.path.as_str()).collect::<Vec<_>>(), ["z", "y"]);
        lf.save(&p).unwrap();
        assert_eq!(LockFile::load(&p).unwrap(), lf);
        assert!(matches!(LockFile::load(&d.path().join("nope")), Err(HubError::Io { .. })));
    }

    #[test]
    fn images_are_kept_beside_files_and_old_locks_still_load() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("spark-kit.lock");
        std::fs::write(&p, r#"{"version": 1, "kit": "k", "files": []}"#).unwrap();
        let mut lf = LockFile::load(&p).unwrap();
        assert!(lf.images.is_empty() && lf.image("a:1").is_none());
        lf.images.push(ImageEntry { image: "a:1".into(), id: "sha256:ab".into(), vllm_version: "0.34.0".into() });
        lf.save(&p).unwrap();
        assert_eq!(LockFile::load(&p).unwrap().image("a:1").map(|e| e.id.as_str()), Some("sha256:ab"));
        let fresh = LockFile::load_or_new(&d.path().join("none/spark-kit.lock"), "k").unwrap();
        assert_eq!((fresh.version, fresh.kit.as_str(), fresh.files.len()), (LockFile::VERSION, "k", 0));
    }
}
