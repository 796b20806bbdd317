//! Which files to fetch: the tree listing checked against the kit (paths, shard count, files,
//! sizes, hashes). Pure.

use std::collections::BTreeSet;

use serde::Serialize;

use super::api::{Resolved, TreeEntry};
use super::error::HubError;
use super::paths::check_repo_path;
use crate::kit::schema::ExpectedFile;

/// How a file is stored on the Hub, which decides its blob name and check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// LFS/Xet: blob named by the content SHA-256, fetched in ranges from the CDN.
    Lfs,
    /// Regular git file: blob named by the git blob sha1, fetched whole.
    Regular,
}

/// One file to have in the cache.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PlannedFile {
    pub path: String,
    pub size: u64,
    pub kind: Kind,
    /// The cache blob name: LFS sha256 or git sha1.
    pub blob: String,
}

/// Which files of a repo the kit wants.
#[derive(Debug, Clone, Copy)]
pub enum Selection<'a> {
    /// Every file; the kit's `files` must be among them and `expected_shards` (if > 0) must match.
    All { required: &'a [ExpectedFile], expected_shards: u32, key: &'static str },
    /// Exactly these files.
    Only { files: &'a [ExpectedFile], key: &'static str },
}

fn is_hex(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Turn a listing into the files to fetch, in fetch order (small regular files first, then the
/// LFS files in path order, so shards arrive in offset order).
pub fn plan(repo: &str, commit: &str, entries: &[TreeEntry], sel: Selection<'_>) -> Result<Vec<PlannedFile>, HubError> {
    let mut seen = BTreeSet::new();
    let mut all = Vec::with_capacity(entries.len());
    for e in entries {
        check_repo_path(&e.path).map_err(|reason| HubError::UnsafePath {
            repo: repo.into(),
            path: e.path.clone(),
            reason,
        })?;
        if !seen.insert(e.path.as_str()) {
            return Err(HubError::Protocol {
                what: format!("{repo}@{commit}"),
                reason: format!("`{}` listed twice", e.path),
            });
        }
        let (kind, blob, size) = match &e.lfs {
            Some(l) if is_hex(&l.oid, 64) => (Kind::Lfs, l.oid.to_ascii_lowercase(), l.size),
            None if is_hex(&e.oid, 40) => (Kind::Regular, e.oid.to_ascii_lowercase(), e.size),
            _ => {
                return Err(HubError::Protocol {
                    what: format!("{repo}@{commit}: {}", e.path),
                    reason: "listing entry has no usable hash (lfs.oid 64 hex or oid 40 hex)".into(),
                })
            }
        };
        all.push(PlannedFile { path: e.path.clone(), size, kind, blob });
    }
    let (wanted, key) = match sel {
        Selection::All { required, key, .. } | Selection::Only { files: required, key } => (required, key),
    };
    for (i, want) in wanted.iter().enumerate() {
        let Some(f) = all.iter().find(|f| f.path == want.path) else {
            return Err(HubError::Kit(format!("{key}.{i}.path: {repo} at {commit} has no file `{}`", want.path)));
        };
        if let Some(size) = want.size.filter(|s| *s != f.size) {
            return Err(HubError::Kit(format!(
                "{key}.{i}.size: `{}` is {} bytes at {commit}, the kit says {size}",
                f.path, f.size
            )));
        }
        if let Some(sha) = &want.sha256 {
            if f.kind == Kind::Lfs && !f.blob.eq_ignore_ascii_case(sha) {
                return Err(HubError::Kit(format!(
                    "{key}.{i}.sha256: `{}` has sha256 {} at {commit}, the kit says {sha}",
                    f.path, f.blob
                )));
            }
        }
    }
    let mut chosen: Vec<PlannedFile> = match sel {
        Selection::All { expected_shards, key, .. } => {
            let shards = all.iter().filter(|f| f.path.ends_with(".safetensors")).count();
            if expected_shards > 0 && shards != expected_shards as usize {
                return Err(HubError::Kit(format!(
                    "{key}.expected_shards: {repo} at {commit} has {shards} *.safetensors files, the kit expects {expected_shards}"
                )));
            }
            all
        }
        Selection::Only { files, .. } => all.into_iter().filter(|f| files.iter().any(|w| w.path == f.path)).collect(),
    };
    chosen.sort_by(|a, b| (a.kind == Kind::Lfs, &a.path).cmp(&(b.kind == Kind::Lfs, &b.path)));
    Ok(chosen)
}

/// Check what `resolve` said against the listing: same blob, size and commit.
pub fn cross_check(repo: &str, commit: &str, f: &PlannedFile, r: &Resolved) -> Result<(), HubError> {
    let mismatch = |what, listed: String, resolved: String| HubError::Mismatch {
        repo: repo.into(),
        path: f.path.clone(),
        what,
        listed,
        resolved,
    };
    if let Some(c) = r.commit.as_deref().filter(|c| !c.eq_ignore_ascii_case(commit)) {
        return Err(mismatch("commit (X-Repo-Commit)", commit.into(), c.into()));
    }
    if let Some(e) = r.etag.as_deref().filter(|e| !e.eq_ignore_ascii_case(&f.blob)) {
        return Err(mismatch("content hash (X-Linked-Etag/ETag)", f.blob.clone(), e.into()));
    }
    if let Some(s) = r.size.filter(|s| *s != f.size) {
        return Err(mismatch("size (X-Linked-Size)", f.size.to_string(), s.to_string()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hub::api::LfsInfo;

    fn lfs(path: &str, c: char, size: u64) -> TreeEntry {
        TreeEntry {
            kind: "file".into(),
            path: path.into(),
            size,
            oid: "1".repeat(40),
            lfs: Some(LfsInfo { oid: c.to_string().repeat(64), size }),
        }
    }
    fn reg(path: &str) -> TreeEntry {
        TreeEntry { kind: "file".into(), path: path.into(), size: 5, oid: "2".repeat(40), lfs: None }
    }
    fn want(p: &str) -> ExpectedFile {
        ExpectedFile { path: p.into(), ..ExpectedFile::default() }
    }

    #[test]
    fn all_files_ordered_and_checked() {
        let entries = vec![lfs("b.safetensors", 'b', 10), reg("config.json"), lfs("a.safetensors", 'a', 10)];
        let req = [want("config.json")];
        let sel = Selection::All { required: &req, expected_shards: 2, key: "model.files" };
        let p = plan("o/n", "c", &entries, sel).unwrap();
        let names: Vec<_> = p.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(names, ["config.json", "a.safetensors", "b.safetensors"]);
        let sel = Selection::All { required: &req, expected_shards: 3, key: "model.files" };
        let e = plan("o/n", "c", &entries, sel).unwrap_err().to_string();
        assert!(e.contains("model.files.expected_shards") && e.contains("has 2"), "{e}");
        let missing = [want("tokenizer.json")];
        let sel = Selection::All { required: &missing, expected_shards: 0, key: "model.files" };
        let e = plan("o/n", "c", &entries, sel).unwrap_err().to_string();
        assert!(e.starts_with("model.files.0.path"), "{e}");
    }

    #[test]
    fn only_and_traversal() {
        let entries = vec![lfs("a.safetensors", 'a', 10), reg("config.json"), reg("README.md")];
        let only = [want("a.safetensors"), want("config.json")];
        let p = plan("o/n", "c", &entries, Selection::Only { files: &only, key: "engram.files" }).unwrap();
        assert_eq!(p.len(), 2);
        let bad = vec![reg("../x")];
        let e = plan("o/n", "c", &bad, Selection::Only { files: &[], key: "engram.files" }).unwrap_err();
        assert!(matches!(e, HubError::UnsafePath { .. }));
    }

    #[test]
    fn cross_checks() {
        let f = PlannedFile { path: "a".into(), size: 10, kind: Kind::Lfs, blob: "a".repeat(64) };
        let ok = Resolved {
            commit: Some("c".into()),
            etag: Some("a".repeat(64)),
            size: Some(10),
            location: String::new(),
            on_hub: false,
            xet: None,
        };
        assert!(cross_check("o/n", "c", &f, &ok).is_ok());
        assert!(cross_check("o/n", "c", &f, &Resolved { size: Some(11), ..ok.clone() }).is_err());
        assert!(cross_check("o/n", "d", &f, &ok).is_err());
        assert!(cross_check("o/n", "c", &f, &Resolved { etag: Some("b".repeat(64)), ..ok.clone() }).is_err());
        assert!(cross_check("o/n", "c", &f, &Resolved { etag: None, size: None, commit: None, ..ok }).is_ok());
    }
}
