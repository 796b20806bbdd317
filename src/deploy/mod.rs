//! A kit's deployment on one node, resolved once: [`Deployment::resolve`] turns a resolved kit
//! and *this node's* environment (its HOME, `HF_*`, `SPARK_KIT_CACHE`, the API key variable)
//! into every path, port and key the rest of the program uses. It runs where the values are
//! used: in the command on the head (`up`, `plan`, `preflight`, …) and in each node agent for
//! its own node (`Command::Start`), so a node with another HOME or cache finds its own files.
//!
//! The bottom layer: it imports only `kit` and `dirs` (tests/rules/import_rules.rs). Commands,
//! agents, the supervisor, the gateway and the hub read these values; none re-derives them.
//!
//! - paths: spark-kit's cache, logs, data dir (and the kit's `spark-kit.lock` and packed Engram
//!   shards under it), the Engram dir, the engine venv, `model.path` — each `~`-expanded here;
//! - the Hugging Face cache: its location, folder layout and served snapshot ([`hf`]);
//! - ports: the API port and the internal port behind the gateway ([`ports`]);
//! - API keys: `engine.api_keys`, read once ([`keys`]).

pub mod hf;
pub mod keys;
pub mod ports;

use std::path::{Path, PathBuf};

use crate::dirs::{Dirs, HomeUnset};
use crate::kit::schema::Kit;
use keys::KeysError;
use ports::Ports;

/// Every value of one kit's deployment on this node.
#[derive(Debug, Clone)]
pub struct Deployment {
    /// HOME and spark-kit's cache (`SPARK_KIT_CACHE`, else `$XDG_CACHE_HOME/spark-kit`, else
    /// `~/.cache/spark-kit`): engine venvs, image build contexts, pushed binaries.
    pub dirs: Dirs,
    /// `paths.logs`.
    pub logs: PathBuf,
    /// `paths.data_dir` (made tiny models live in its `models/`).
    pub data_dir: PathBuf,
    /// Where `download` records what it fetched: `<data_dir>/<kit>/spark-kit.lock`.
    pub lock_file: PathBuf,
    /// Where `pack-engram` puts the packed shards: `<data_dir>/<kit>/engram-packed`.
    pub packed_dir: PathBuf,
    /// The Hugging Face cache ([`hf::cache_location`]).
    pub hf_cache: PathBuf,
    /// `paths.engram_dir`.
    pub engram_dir: PathBuf,
    /// `engine.venv` (None: the venv `setup` makes from `engine.requirements`).
    pub venv: Option<PathBuf>,
    /// `model.path`.
    pub model_path: Option<PathBuf>,
    pub ports: Ports,
    /// `engine.api_keys`: every key, or why the kit's key source gives none (read once).
    pub keys: Result<Vec<String>, KeysError>,
}

impl Deployment {
    /// The deployment of `kit` on this node; `env` is this process's environment (read once,
    /// in `main`). Reads the API key file when the kit names one; nothing else touches disk.
    /// HOME must be set ([`HomeUnset`]).
    pub fn resolve(kit: &Kit, env: &[(String, String)]) -> Result<Self, HomeUnset> {
        let dirs = Dirs::from_env(env)?;
        let data_dir = dirs.expand(&kit.paths.data_dir);
        let kit_data = data_dir.join(&kit.name);
        let configured = kit.paths.hf_cache.as_deref().map(|p| dirs.expand(p));
        Ok(Self {
            logs: dirs.expand(&kit.paths.logs),
            lock_file: kit_data.join("spark-kit.lock"),
            packed_dir: kit_data.join("engram-packed"),
            hf_cache: hf::cache_location(configured.as_deref(), env, &dirs.home),
            engram_dir: dirs.expand(&kit.paths.engram_dir),
            venv: kit.engine.venv.as_deref().map(|p| dirs.expand(p)),
            model_path: kit.model.path.as_deref().map(|p| dirs.expand(p)),
            ports: Ports::of(kit),
            keys: keys::api_keys(kit, env, &dirs),
            data_dir,
            dirs,
        })
    }

    /// A repo's directory in the Hugging Face cache.
    #[must_use]
    pub fn repo_dir(&self, repo: &str) -> PathBuf {
        hf::repo_dir(&self.hf_cache, repo)
    }

    /// The served snapshot of `repo` at `revision` ([`hf::snapshot`], the one rule).
    #[must_use]
    pub fn snapshot(&self, repo: &str, revision: &str) -> Option<PathBuf> {
        hf::snapshot(&self.hf_cache, repo, revision)
    }

    /// The first API key (what the engine itself and the node's probes use).
    pub fn api_key(&self) -> Result<Option<&str>, &KeysError> {
        self.keys.as_ref().map(|k| k.first().map(String::as_str))
    }

    /// spark-kit's own cache.
    #[must_use]
    pub fn cache(&self) -> &Path {
        &self.dirs.cache
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::dirs::pairs as env;

    #[test]
    fn every_path_follows_this_nodes_home() {
        let d = Deployment::resolve(&crate::kit::builtin_kit("tiny-cpu"), &env(&[("HOME", "/home/u")])).unwrap();
        assert_eq!(d.dirs.home, PathBuf::from("/home/u"));
        assert_eq!(d.cache(), Path::new("/home/u/.cache/spark-kit"));
        assert_eq!(d.hf_cache, PathBuf::from("/home/u/.cache/huggingface/hub"));
        assert_eq!(d.lock_file, PathBuf::from("/home/u/.cache/spark-kit/data/tiny-cpu/spark-kit.lock"));
        assert_eq!(d.packed_dir, d.lock_file.with_file_name("engram-packed"));
        assert!(d.logs.starts_with("/home/u") && d.engram_dir.starts_with("/home/u"), "{d:?}");
        assert_eq!(d.repo_dir("o/n"), PathBuf::from("/home/u/.cache/huggingface/hub/models--o--n"));
        assert_eq!(d.api_key().unwrap(), None);
    }

    #[test]
    fn the_kit_and_hf_variables_move_the_cache() {
        let mut kit = crate::kit::builtin_kit("tiny-cpu");
        let d = Deployment::resolve(&kit, &env(&[("HOME", "/h"), ("HF_HOME", "/hf")])).unwrap();
        assert_eq!(d.hf_cache, PathBuf::from("/hf/hub"));
        kit.paths.hf_cache = Some("~/mine".into());
        kit.model.path = Some("~/m".into());
        let d = Deployment::resolve(&kit, &env(&[("HOME", "/h"), ("HF_HUB_CACHE", "/y")])).unwrap();
        assert_eq!(d.hf_cache, PathBuf::from("/h/mine"));
        assert_eq!(d.model_path, Some(PathBuf::from("/h/m")));
    }
}
