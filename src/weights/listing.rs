//! The weight files the head has (relative path and size), and the comparison with what a node
//! reports. Listing reads the directory; the comparison is pure.

use std::path::{Path, PathBuf};

use crate::kit::schema::{Kit, ModelSource};

/// Names that are never weights: in-flight downloads and rsync's resume area.
#[must_use]
pub fn ignored(name: &str) -> bool {
    name == ".rsync-partial"
        || name.ends_with(".partial")
        || name.ends_with(".incomplete")
        || name.starts_with(".push.")
}

/// A directory tree every node must hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WeightTree {
    /// `model` or `engram`.
    pub what: &'static str,
    pub path: PathBuf,
}

/// The trees every node must hold: the model's (none when each node makes its own: the tiny
/// models are made on every node from the same seed) and, for kits with Engram tables, the slim
/// Engram directory (`paths.engram_dir`, already expanded by the caller).
#[must_use]
pub fn weight_trees(kit: &Kit, hf_cache: &Path, engram_dir: &Path) -> Vec<WeightTree> {
    let model = match kit.model.source {
        ModelSource::Local => kit.model.path.as_ref().map(PathBuf::from),
        // The whole repository directory: blobs, snapshots (relative symlinks) and refs, so the
        // copy is a valid Hugging Face cache entry on the node.
        ModelSource::Hub => Some(crate::deploy::hf::repo_dir(hf_cache, &kit.model.repo)),
        ModelSource::TinyDense | ModelSource::TinyExl3 => None,
    };
    let mut out: Vec<WeightTree> = model.into_iter().map(|path| WeightTree { what: "model", path }).collect();
    if kit.engram.is_some() && !out.is_empty() {
        out.push(WeightTree { what: "engram", path: engram_dir.to_path_buf() });
    }
    out
}

/// Why the head's tree cannot be listed.
#[derive(Debug, thiserror::Error)]
pub enum ListError {
    /// A symlink whose target does not exist (a shared blob store that lost a file, a moved
    /// directory): copied as it is it would dangle on every node too.
    #[error("{} is a symlink {}to {}, which does not exist", file.display(), via.as_ref().map(|v| format!("through {} ", v.display())).unwrap_or_default(), target.display())]
    Dangling {
        file: PathBuf,
        /// The last link of a chain (`snapshots/…` → `blobs/<sha256>` → gone), when not `file`.
        via: Option<PathBuf>,
        /// What the last link says, as written.
        target: PathBuf,
    },
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
}

/// Every regular file under `root` (symlinks followed for the size), sorted by path; the first
/// dangling symlink stops it, named.
pub fn list(root: &Path) -> Result<Vec<(String, u64)>, ListError> {
    let mut out = Vec::new();
    walk(root, root, &mut out)?;
    out.sort();
    Ok(out)
}

fn walk(root: &Path, dir: &Path, out: &mut Vec<(String, u64)>) -> Result<(), ListError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| ListError::Io { path, source }
    };
    for entry in std::fs::read_dir(dir).map_err(io(dir))? {
        let entry = entry.map_err(io(dir))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if ignored(&name) {
            continue;
        }
        let path = entry.path();
        let meta = match std::fs::metadata(&path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => match dangling(&path) {
                Some((via, target)) => return Err(ListError::Dangling { file: path, via, target }),
                None => return Err(ListError::Io { path, source: e }),
            },
            Err(e) => return Err(ListError::Io { path, source: e }),
        };
        if meta.is_dir() {
            walk(root, &path, out)?;
        } else if meta.is_file() {
            let rel = path.strip_prefix(root).unwrap_or(&path).to_string_lossy().into_owned();
            out.push((rel, meta.len()));
        }
    }
    Ok(())
}

/// Where the chain of links from `path` ends at nothing: the last link (when not `path`) and
/// its target as written; `None` when `path` does not dangle.
fn dangling(path: &Path) -> Option<(Option<PathBuf>, PathBuf)> {
    let mut link = path.to_path_buf();
    // The kernel's own limit on links followed in one lookup.
    for _ in 0..40 {
        let target = std::fs::read_link(&link).ok()?;
        let next = lexical(&link.parent().map_or_else(|| target.clone(), |p| p.join(&target)));
        match std::fs::symlink_metadata(&next) {
            Err(_) => return Some(((link != path).then_some(link), target)),
            Ok(m) if m.file_type().is_symlink() => link = next,
            Ok(_) => return None,
        }
    }
    None
}

/// `p` with `.` and `..` resolved by name (for messages and the next hop of a link chain).
fn lexical(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            c => out.push(c),
        }
    }
    out
}

/// `path` as the node should read it: `~/…` when it is under the head's home (each node expands
/// its own home), else unchanged.
#[must_use]
pub fn node_path(path: &Path, home: &Path) -> String {
    match path.strip_prefix(home) {
        Ok(rel) if !home.as_os_str().is_empty() => format!("~/{}", rel.display()),
        _ => path.display().to_string(),
    }
}

/// What is wrong with a node's copy: missing files and size mismatches (at most `limit` named).
#[must_use]
pub fn differences(expected: &[(String, u64)], present: &[(String, u64)], missing: &[String]) -> Vec<String> {
    let mut out: Vec<String> = missing.iter().map(|m| format!("{m} missing")).collect();
    for (path, size) in expected {
        if let Some((_, got)) = present.iter().find(|(p, _)| p == path) {
            if got != size {
                out.push(format!("{path} is {got} bytes, the head's is {size}"));
            }
        }
    }
    out
}

/// One line summing up `differences` (the first few named).
#[must_use]
pub fn summary(diffs: &[String]) -> String {
    let shown: Vec<&str> = diffs.iter().take(3).map(String::as_str).collect();
    let more = diffs.len().saturating_sub(shown.len());
    let tail = if more > 0 { format!(" (+{more} more)") } else { String::new() };
    format!("{} file(s) differ: {}{tail}", diffs.len(), shown.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_files_following_links_and_skipping_partials() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("blobs")).unwrap();
        std::fs::create_dir_all(d.path().join("snapshots/abc")).unwrap();
        std::fs::create_dir_all(d.path().join(".rsync-partial")).unwrap();
        std::fs::write(d.path().join("blobs/b1"), vec![0u8; 10]).unwrap();
        std::fs::write(d.path().join("blobs/b2.incomplete"), vec![0u8; 3]).unwrap();
        std::fs::write(d.path().join(".rsync-partial/x"), vec![0u8; 3]).unwrap();
        std::os::unix::fs::symlink("../../blobs/b1", d.path().join("snapshots/abc/model.safetensors")).unwrap();
        let l = list(d.path()).unwrap();
        assert_eq!(l, vec![("blobs/b1".to_string(), 10), ("snapshots/abc/model.safetensors".to_string(), 10)]);
    }

    #[test]
    fn a_dangling_link_is_named_with_its_target() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("blobs/ab")).unwrap();
        std::fs::write(d.path().join("blobs/ab/kept"), b"x").unwrap();
        std::os::unix::fs::symlink("ab/kept", d.path().join("blobs/e1")).unwrap();
        std::os::unix::fs::symlink("ab/gone", d.path().join("blobs/e2")).unwrap();
        let e = list(d.path()).unwrap_err();
        assert!(
            matches!(&e, ListError::Dangling { file, via: None, target }
                if *file == d.path().join("blobs/e2") && *target == Path::new("ab/gone")),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            format!("{}/blobs/e2 is a symlink to ab/gone, which does not exist", d.path().display())
        );
        // Through a chain (snapshot → blob → shared store): the last link is named too.
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("snapshots/c")).unwrap();
        std::fs::create_dir_all(d.path().join("blobs")).unwrap();
        std::os::unix::fs::symlink("../../blobs/e2", d.path().join("snapshots/c/m")).unwrap();
        std::os::unix::fs::symlink("../../blobs/ab/gone", d.path().join("blobs/e2")).unwrap();
        let e = list(&d.path().join("snapshots")).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "{0}/snapshots/c/m is a symlink through {0}/blobs/e2 to ../../blobs/ab/gone, which does not exist",
                d.path().display()
            )
        );
    }

    #[test]
    fn differences_name_missing_and_short_files() {
        let exp = vec![("a".to_string(), 5), ("b".to_string(), 7), ("c".to_string(), 1)];
        let present = vec![("a".to_string(), 5), ("b".to_string(), 3)];
        let d = differences(&exp, &present, &["c".to_string()]);
        assert_eq!(d, vec!["c missing".to_string(), "b is 3 bytes, the head's is 7".to_string()]);
        assert!(differences(&exp[..1], &present[..1], &[]).is_empty());
        let s = summary(&["1".into(), "2".into(), "3".into(), "4".into()]);
        assert_eq!(s, "4 file(s) differ: 1; 2; 3 (+1 more)");
    }

    #[test]
    fn trees_of_the_spark_kit_and_the_tiny_kit() {
        let spark = crate::kit::builtin_kit("dgx-spark-2x-dsv41-exl3");
        let t = weight_trees(&spark, Path::new("/hf"), Path::new("/e"));
        assert_eq!(t.len(), 2, "{t:?}");
        assert_eq!(t[0].what, "model");
        assert!(t[0].path.to_string_lossy().starts_with("/hf/models--"), "{t:?}");
        assert_eq!(t[1], WeightTree { what: "engram", path: PathBuf::from("/e") });
        let tiny = crate::kit::builtin_kit("tiny-cpu-2node");
        assert!(weight_trees(&tiny, Path::new("/hf"), Path::new("/e")).is_empty());
    }

    #[test]
    fn node_paths_are_home_relative() {
        assert_eq!(node_path(Path::new("/home/u/.cache/hf"), Path::new("/home/u")), "~/.cache/hf");
        assert_eq!(node_path(Path::new("/models/x"), Path::new("/home/u")), "/models/x");
    }
}
