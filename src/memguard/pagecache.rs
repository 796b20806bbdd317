//! Soft-floor relief: drop the page cache of the model's shard files with
//! `posix_fadvise(POSIX_FADV_DONTNEED)` — only those files, never `drop_caches` for the whole
//! host, and never after the engine mapped them in a way that would fault them back
//! (gb10-ops.md §1.3).

use std::fs::File;
use std::path::{Path, PathBuf};

use nix::fcntl::{posix_fadvise, PosixFadviseAdvice};

/// The model files under `roots`: `*.safetensors` (recursively, following the Hugging Face
/// cache's symlinks to blobs), or the roots themselves when they are files.
#[must_use]
pub fn model_files(roots: &[PathBuf]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for r in roots {
        collect(r, &mut out, 0);
    }
    out.sort();
    out.dedup();
    out
}

fn collect(p: &Path, out: &mut Vec<PathBuf>, depth: u32) {
    if p.is_file() {
        out.push(p.canonicalize().unwrap_or_else(|_| p.to_path_buf()));
        return;
    }
    let Ok(dir) = std::fs::read_dir(p) else { return };
    for e in dir.flatten() {
        let path = e.path();
        if path.is_dir() && depth < 6 {
            collect(&path, out, depth + 1);
        } else if path.extension().is_some_and(|x| x == "safetensors") {
            out.push(path.canonicalize().unwrap_or(path));
        }
    }
}

/// Drop the page cache of each file; the files it worked on.
#[must_use]
pub fn drop_cache(files: &[PathBuf]) -> Vec<String> {
    files
        .iter()
        .filter(|f| {
            File::open(f).is_ok_and(|file| posix_fadvise(&file, 0, 0, PosixFadviseAdvice::POSIX_FADV_DONTNEED).is_ok())
        })
        .map(|f| f.display().to_string())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_shards_and_drops_their_cache() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("snap")).unwrap();
        std::fs::write(d.path().join("snap/model-00001.safetensors"), vec![1u8; 1 << 16]).unwrap();
        std::fs::write(d.path().join("snap/config.json"), "{}").unwrap();
        let files = model_files(&[d.path().to_path_buf()]);
        assert_eq!(files.len(), 1);
        assert_eq!(drop_cache(&files).len(), 1);
        assert!(drop_cache(&[d.path().join("missing.safetensors")]).is_empty());
    }
}
