//! The Python overlay embedded in the binary, materialised into a versioned directory that goes
//! on every vLLM process's `PYTHONPATH` (with a dist-info, so vLLM finds the plugin entry point).

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

mod embedded {
    include!(concat!(env!("OUT_DIR"), "/overlay_files.rs"));
}

/// Every embedded file: (path relative to `python_overlay/`, bytes).
#[must_use]
pub fn files() -> &'static [(&'static str, &'static [u8])] {
    embedded::FILES
}

/// One embedded file by its path relative to `python_overlay/`.
#[must_use]
pub fn file(rel: &str) -> Option<&'static [u8]> {
    files().iter().find(|(p, _)| *p == rel).map(|(_, b)| *b)
}

/// The overlay package's version (`__version__` in `spark_overlay/__init__.py`).
#[must_use]
pub fn version() -> String {
    let init = file("spark_overlay/__init__.py").map(String::from_utf8_lossy).unwrap_or_default();
    init.lines()
        .find_map(|l| l.strip_prefix("__version__ = ").map(|v| v.trim().trim_matches('"').to_string()))
        .unwrap_or_else(|| "0".into())
}

/// Content hash of the embedded overlay (first 12 hex digits).
#[must_use]
pub fn content_hash() -> String {
    let mut h = Sha256::new();
    for (p, b) in files() {
        h.update(p.as_bytes());
        h.update([0]);
        h.update((b.len() as u64).to_le_bytes());
        h.update(b);
    }
    crate::hex::encode(&h.finalize())[..12].to_string()
}

/// The materialised overlay's directory name, `<version>-<content hash>` (it names the tiny
/// models made with it, `engine::model::tiny_dir`).
#[must_use]
pub fn tag() -> String {
    format!("{}-{}", version(), content_hash())
}

/// Errors writing the overlay.
#[derive(Debug, thiserror::Error)]
#[error("cannot materialise the overlay into {path}: {source}")]
pub struct OverlayError {
    pub path: PathBuf,
    pub source: std::io::Error,
}

/// Write the overlay to `<cache>/overlay/<version>-<hash>/` if not already complete; return it.
///
/// Layout: `spark_overlay/…`, `spark_overlay-<version>.dist-info/{METADATA,entry_points.txt}`,
/// `tools/…`. Built in a temporary sibling and renamed, so a crash never leaves a partial copy
/// in place.
pub fn materialise(cache: &Path) -> Result<PathBuf, OverlayError> {
    let version = version();
    let dir = cache.join("overlay").join(tag());
    if dir.join(".complete").exists() {
        return Ok(dir);
    }
    let err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| OverlayError { path, source }
    };
    let parent = cache.join("overlay");
    fs::create_dir_all(&parent).map_err(err(&parent))?;
    let tmp = parent.join(format!(".tmp-{}-{}", std::process::id(), content_hash()));
    if tmp.exists() {
        fs::remove_dir_all(&tmp).map_err(err(&tmp))?;
    }
    for (rel, bytes) in files() {
        let target = match rel.strip_prefix("spark_overlay.dist-info-template/") {
            Some(name) => tmp.join(format!("spark_overlay-{version}.dist-info")).join(name),
            None => tmp.join(rel),
        };
        if let Some(p) = target.parent() {
            fs::create_dir_all(p).map_err(err(p))?;
        }
        let mut f = fs::File::create(&target).map_err(err(&target))?;
        f.write_all(bytes).map_err(err(&target))?;
    }
    let done = tmp.join(".complete");
    fs::write(&done, version.as_bytes()).map_err(err(&done))?;
    match fs::rename(&tmp, &dir) {
        Ok(()) => Ok(dir),
        // Another process finished the same version first: theirs is identical.
        Err(_) if dir.join(".complete").exists() => {
            let _ = fs::remove_dir_all(&tmp);
            Ok(dir)
        }
        Err(e) => Err(OverlayError { path: dir, source: e }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embeds_the_package_and_entry_point() {
        assert!(file("spark_overlay/__init__.py").is_some());
        assert!(file("spark_overlay/plugin.py").is_some());
        let ep = String::from_utf8_lossy(file("spark_overlay.dist-info-template/entry_points.txt").unwrap_or_default())
            .into_owned();
        assert!(ep.contains("[vllm.general_plugins]"), "{ep}");
        assert!(!version().is_empty());
    }

    #[test]
    fn materialises_once_with_dist_info() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = materialise(tmp.path()).unwrap();
        let again = materialise(tmp.path()).unwrap();
        assert_eq!(dir, again);
        assert!(dir.join("spark_overlay/plugin.py").is_file());
        assert!(dir.join(format!("spark_overlay-{}.dist-info/entry_points.txt", version())).is_file());
        assert!(dir.join("tools/make_tiny_model.py").is_file());
    }
}
