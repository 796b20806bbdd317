//! What the receipt says about where the served checkpoint and engine image came from: the
//! kit's `spark-kit.lock` (checkpoint files with their SHA-256, engine image ids).

use std::path::Path;

use super::result::{LockReceipt, LockedFile, LockedImage};
use crate::hub::lockfile::LockFile;

/// The lock at `path` as a receipt; a lock that cannot be read says why (a locally made
/// checkpoint has none: nothing was downloaded).
#[must_use]
pub fn lock_receipt(path: &Path) -> LockReceipt {
    let mut r = LockReceipt { path: path.display().to_string(), error: None, files: Vec::new(), images: Vec::new() };
    match LockFile::load(path) {
        Ok(lock) => {
            r.files = lock
                .files
                .into_iter()
                .map(|f| LockedFile { repo: f.repo, commit: f.commit, path: f.path, size: f.size, sha256: f.sha256 })
                .collect();
            r.images = lock
                .images
                .into_iter()
                .map(|i| LockedImage { image: i.image, id: i.id, vllm_version: i.vllm_version })
                .collect();
        }
        Err(e) => r.error = Some(e.to_string()),
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_is_copied_and_a_missing_one_says_why() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("spark-kit.lock");
        let missing = lock_receipt(&path);
        assert!(missing.error.is_some() && missing.files.is_empty(), "{missing:?}");
        let lock = serde_json::json!({"version": 1, "kit": "k", "files": [{"repo": "o/m", "revision": "main",
            "commit": "c0ffee", "path": "model.safetensors", "size": 3, "sha256": "ab"}],
            "images": [{"image": "vllm/x:1", "id": "sha256:12", "vllm_version": "0.34.0"}]});
        std::fs::write(&path, lock.to_string()).unwrap();
        let r = lock_receipt(&path);
        assert_eq!(r.error, None);
        assert_eq!((r.files[0].sha256.as_str(), r.files[0].commit.as_str()), ("ab", "c0ffee"));
        assert_eq!(r.images[0].id, "sha256:12");
    }
}
