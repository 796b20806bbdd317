//! The Hugging Face cache: where it is on this node (one rule) and its folder layout
//! (`models--owner--name/{blobs,snapshots,refs}`), coded once. `hub::cache` writes it,
//! `engine::model` serves from it, `weights` copies it, `commands` read checkpoints in it.

use std::path::{Path, PathBuf};

use crate::dirs::env_value;

/// `HF_HOME`: `$HF_HOME`, else `$XDG_CACHE_HOME/huggingface`, else `~/.cache/huggingface`
/// (`huggingface_hub`'s order; the Hub token file lives there too, `hub::auth`).
#[must_use]
pub fn hf_home(env: &[(String, String)], home: &Path) -> PathBuf {
    if let Some(h) = env_value(env, "HF_HOME").filter(|v| !v.trim().is_empty()) {
        return PathBuf::from(h);
    }
    if let Some(x) = env_value(env, "XDG_CACHE_HOME").filter(|v| !v.trim().is_empty()) {
        return Path::new(x).join("huggingface");
    }
    home.join(".cache/huggingface")
}

/// The HF hub cache: kit `paths.hf_cache` (expanded by the caller), else `HF_HUB_CACHE`, else
/// `<HF_HOME>/hub` ([`hf_home`]) — `huggingface_hub`'s own order.
#[must_use]
pub fn cache_location(configured: Option<&Path>, env: &[(String, String)], home: &Path) -> PathBuf {
    if let Some(p) = configured {
        return p.to_path_buf();
    }
    if let Some(p) = env_value(env, "HF_HUB_CACHE") {
        return PathBuf::from(p);
    }
    hf_home(env, home).join("hub")
}

/// A repo's folder name in the cache: `models--owner--name`.
#[must_use]
pub fn repo_folder(repo: &str) -> String {
    format!("models--{}", repo.replace('/', "--"))
}

/// A repo's directory in the cache.
#[must_use]
pub fn repo_dir(hf_cache: &Path, repo: &str) -> PathBuf {
    hf_cache.join(repo_folder(repo))
}

/// Whether `revision` is a full commit hash (40 hex digits) rather than a ref name.
#[must_use]
pub fn is_commit(revision: &str) -> bool {
    revision.len() == 40 && revision.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The served snapshot of `repo` at `revision` — the one rule every reader of the cache uses
/// (the engine, `plan`, `verify`, `preflight`, the gateway's tokenizer): `revision` itself
/// when it is a commit, else the commit `refs/<revision>` names. `download` writes that ref
/// beside recording the same commit in `spark-kit.lock` (which `verify` checks the files
/// against); the ref, not the lock, picks the snapshot because it travels with the cache to
/// every node (the weights' rsync, a shared mount) and is what `huggingface_hub` reads offline.
/// None when the ref is missing; the directory may not exist (a download not finished).
#[must_use]
pub fn snapshot(hf_cache: &Path, repo: &str, revision: &str) -> Option<PathBuf> {
    let dir = repo_dir(hf_cache, repo);
    let commit = if is_commit(revision) {
        revision.to_string()
    } else {
        std::fs::read_to_string(dir.join("refs").join(revision)).ok().map(|s| s.trim().to_string())?
    };
    (!commit.is_empty()).then(|| dir.join("snapshots").join(commit))
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::dirs::pairs as e;

    #[test]
    fn cache_location_precedence() {
        let home = Path::new("/h");
        assert_eq!(cache_location(None, &e(&[]), home), PathBuf::from("/h/.cache/huggingface/hub"));
        assert_eq!(cache_location(None, &e(&[("HF_HOME", "/x")]), home), PathBuf::from("/x/hub"));
        assert_eq!(cache_location(None, &e(&[("HF_HOME", "/x"), ("HF_HUB_CACHE", "/y")]), home), PathBuf::from("/y"));
        assert_eq!(cache_location(Some(Path::new("/k")), &e(&[("HF_HUB_CACHE", "/y")]), home), PathBuf::from("/k"));
        assert_eq!(cache_location(None, &e(&[("HF_HUB_CACHE", "")]), home), PathBuf::from("/h/.cache/huggingface/hub"));
        // As huggingface_hub: HF_HOME defaults under XDG_CACHE_HOME (the token file's home too).
        assert_eq!(cache_location(None, &e(&[("XDG_CACHE_HOME", "/c")]), home), PathBuf::from("/c/huggingface/hub"));
        assert_eq!(hf_home(&e(&[("XDG_CACHE_HOME", "/c"), ("HF_HOME", "/x")]), home), PathBuf::from("/x"));
    }

    #[test]
    fn the_snapshot_is_the_commit_or_the_ref() {
        let t = tempfile::tempdir().unwrap();
        assert_eq!(repo_dir(t.path(), "o/n"), t.path().join("models--o--n"));
        let c = "a".repeat(40);
        assert_eq!(snapshot(t.path(), "o/n", &c), Some(t.path().join("models--o--n/snapshots").join(&c)));
        assert_eq!(snapshot(t.path(), "o/n", "main"), None, "no ref yet");
        std::fs::create_dir_all(t.path().join("models--o--n/refs")).unwrap();
        std::fs::write(t.path().join("models--o--n/refs/main"), "b0b").unwrap();
        assert_eq!(snapshot(t.path(), "o/n", "main"), Some(t.path().join("models--o--n/snapshots/b0b")));
    }
}
