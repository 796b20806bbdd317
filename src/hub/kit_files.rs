//! What `download` and `verify --repair` fetch for a kit (where it goes, the HF cache and the
//! `spark-kit.lock`, is the kit's `deploy::Deployment`).

use std::path::Path;

use super::error::HubError;
use super::lockfile::{LockEntry, LockFile};
use super::run::{EngramTarget, RepoRequest, Summary, Want};
use crate::kit::schema::{Kit, ModelSource};

/// Which part of a kit `download --only` fetches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    Model,
    Engram,
}

/// Why a kit has nothing to download.
#[derive(Debug, thiserror::Error)]
pub enum NothingToFetch {
    #[error("kit `{kit}` has model.source `{model_source}`, not `hub`: there is no model to download")]
    NotHub { kit: String, model_source: String },
    #[error("kit `{0}` has no `engram` section")]
    NoEngram(String),
    #[error("kit `{0}` names nothing on the Hub to download")]
    Nothing(String),
}

impl NothingToFetch {
    /// The fix.
    #[must_use]
    pub fn hint(&self) -> &'static str {
        match self {
            Self::NotHub { .. } => "use a kit whose model comes from the Hub (spark-kit kits)",
            Self::NoEngram(_) => "drop --only engram, or use a kit with Engram tables",
            Self::Nothing(_) => "its model is made locally (`spark-kit up` does that); `download` is for Hub kits",
        }
    }
}

/// The Engram target of a kit's Engram repo: the slim directory (`engram_dir`) and its layers.
fn engram_target(kit: &Kit, engram_dir: &Path) -> Option<EngramTarget> {
    kit.engram.as_ref().map(|e| EngramTarget { dir: engram_dir.to_path_buf(), layers: e.layers.clone() })
}

/// The repos `download` fetches for `kit` (every model file, the kit's Engram files), or only
/// one part of them; `engram_dir` is where the slim Engram directory goes.
pub fn requests(kit: &Kit, only: Option<Part>, engram_dir: &Path) -> Result<Vec<RepoRequest>, NothingToFetch> {
    let mut out = Vec::new();
    if only != Some(Part::Engram) {
        if kit.model.source == ModelSource::Hub {
            out.push(RepoRequest {
                repo: kit.model.repo.clone(),
                revision: kit.model.revision.clone(),
                want: Want::All { required: kit.model.files.clone(), expected_shards: kit.model.expected_shards },
                key: "model.files",
                engram: None,
            });
        } else if only == Some(Part::Model) {
            let model_source = serde_json::to_value(kit.model.source)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default();
            return Err(NothingToFetch::NotHub { kit: kit.name.clone(), model_source });
        }
    }
    if only != Some(Part::Model) {
        match &kit.engram {
            Some(e) => out.push(RepoRequest {
                repo: e.repo.clone(),
                revision: e.revision.clone(),
                want: Want::Only(e.files.clone()),
                key: "engram.files",
                engram: engram_target(kit, engram_dir),
            }),
            None if only == Some(Part::Engram) => return Err(NothingToFetch::NoEngram(kit.name.clone())),
            None => {}
        }
    }
    if out.is_empty() {
        return Err(NothingToFetch::Nothing(kit.name.clone()));
    }
    Ok(out)
}

/// What `verify --repair` fetches again: exactly the `bad` files at their locked commit, except
/// that the kit's Engram repo is fetched whole — the slim Engram directory hardlinks the shards'
/// blobs, a repaired shard is a new inode, so the directory is rebuilt (the good files are cached).
#[must_use]
pub fn repair_requests(kit: &Kit, bad: &[&LockEntry], engram_dir: &Path) -> Vec<RepoRequest> {
    let mut repos = super::repair::requests(bad);
    for r in &mut repos {
        if let Some(e) = kit.engram.as_ref().filter(|e| e.repo == r.repo) {
            r.want = Want::Only(e.files.clone());
            r.engram = engram_target(kit, engram_dir);
        }
    }
    repos
}

/// Record what a download fetched in the kit's lock file at `lock` (the repos it fetched replace
/// their earlier entries; others are kept).
pub fn record(lock: &Path, kit: &str, summary: &Summary) -> Result<(), HubError> {
    let mut lf = LockFile::load(lock).unwrap_or(LockFile {
        version: LockFile::VERSION,
        kit: kit.to_string(),
        files: vec![],
        images: Vec::new(),
    });
    kit.clone_into(&mut lf.kit);
    let repos: Vec<String> = summary.repos.iter().map(|r| r.repo.clone()).collect();
    lf.merge(&repos, summary.lock.clone());
    lf.save(lock)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::kit::builtin_kit as kit;

    #[test]
    fn a_local_kit_has_nothing_to_fetch_and_says_why() {
        let k = kit("tiny-cpu");
        let e = requests(&k, None, Path::new("/e")).unwrap_err();
        assert_eq!(e.to_string(), "kit `tiny-cpu` names nothing on the Hub to download");
        let e = requests(&k, Some(Part::Model), Path::new("/e")).unwrap_err();
        assert!(e.to_string().starts_with("kit `tiny-cpu` has model.source `"), "{e}");
        let e = requests(&k, Some(Part::Engram), Path::new("/e")).unwrap_err();
        assert_eq!(e.hint(), "drop --only engram, or use a kit with Engram tables");
    }

    #[test]
    fn the_reference_kit_fetches_its_model_and_engram_repos() {
        let k = kit("dgx-spark-2x-dsv41-exl3");
        let r = requests(&k, None, Path::new("/e")).unwrap();
        assert_eq!(r.iter().map(|r| r.key).collect::<Vec<_>>(), ["model.files", "engram.files"]);
        assert_eq!(r[1].engram.as_ref().map(|e| e.dir.as_path()), Some(Path::new("/e")));
    }
}
