//! Resolved settings: a resolved kit and this machine's environment turned into the values the
//! commands use — paths (logs, control socket, pid file, supervisor log, live records, Hugging
//! Face cache, engram dir, lock file, packed Engram dir, spark-kit's cache, the venv), the ports and endpoint, where the API key comes from, and the kit as
//! the user named it (for printed commands). Commands read these here rather than from the kit
//! or the environment; pure over the environment pairs `main` hands in.

use std::path::PathBuf;

use crate::dirs::{logs_dir, Dirs};
use crate::engine::endpoint::{base_url, internal_port, probe_host};
use crate::engram::packed_dir;
use crate::hints::{KeySource, KitRef};
use crate::hub::kit_files::lock_path;
use crate::kit::schema::{Kit, Role, Transport};
use crate::live::run_dir;
use crate::supervisor::control::{pid_path, socket_path};

/// Why a setting cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error("engine.internal_port {0} is not a TCP port: set engine.internal_port to 1-65535")]
    InternalPort(u32),
}

/// The ports of a deployment: the public API (`engine.port`, the gateway's in `up`) and the
/// engine's own API behind it (`engine.internal_port`, or `engine.port ± 10000` when 0).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ports {
    /// `engine.host`: where clients connect.
    pub host: String,
    pub api: u32,
    pub internal: u32,
}

impl Ports {
    /// The internal port as a TCP port.
    pub fn internal_tcp(&self) -> Result<u16, SettingsError> {
        u16::try_from(self.internal).map_err(|_| SettingsError::InternalPort(self.internal))
    }

    /// The client-facing base URL, `http://host:port` (the host as a client reaches it).
    #[must_use]
    pub fn base_url(&self) -> String {
        base_url(probe_host(&self.host), self.api)
    }

    /// The client-facing endpoint, `http://host:port/v1`.
    #[must_use]
    pub fn endpoint(&self) -> String {
        format!("{}/v1", self.base_url())
    }
}

/// Everything a command needs about one kit on this machine.
#[derive(Debug, Clone)]
pub struct Settings {
    pub kit: Kit,
    /// The kit as the user named it (`--kit`), for the commands printed as fixes.
    pub kit_ref: KitRef,
    pub dirs: Dirs,
    /// `paths.logs`, expanded.
    pub logs: PathBuf,
    /// The supervisor's control socket (`status`, `down`).
    pub socket: PathBuf,
    /// The foreground supervisor's pid file.
    pub pid_file: PathBuf,
    /// Where a detached supervisor's output goes.
    pub supervisor_log: PathBuf,
    /// The live records of running deployments.
    pub run_dir: PathBuf,
    /// The Hugging Face cache (`paths.hf_cache`, else `HF_HUB_CACHE` / `HF_HOME` / the default).
    pub hf_cache: PathBuf,
    /// `paths.engram_dir`, expanded.
    pub engram_dir: PathBuf,
    /// Where `download` records what it fetched (`<paths.data_dir>/<kit>/spark-kit.lock`).
    pub lock_file: PathBuf,
    /// Where `pack-engram` puts the packed shards by default (`<paths.data_dir>/<kit>/engram-packed`).
    pub packed_dir: PathBuf,
    /// spark-kit's own cache (`SPARK_KIT_CACHE`): engine venvs, image build contexts, pushed binaries.
    pub cache: PathBuf,
    /// `engine.venv`, expanded (None: the venv `setup` makes from `engine.requirements`).
    pub venv: Option<PathBuf>,
    pub ports: Ports,
    /// Where the API key comes from, when the kit has keys.
    pub key: Option<KeySource>,
}

impl Settings {
    /// The settings of `kit` (resolved with its layers) on this machine; `kit_arg` is what
    /// `--kit` said (None: the default kit).
    #[must_use]
    pub fn new(kit: Kit, kit_arg: Option<&str>, env: &[(String, String)]) -> Self {
        let dirs = Dirs::from_env(env);
        let logs = logs_dir(&kit, &dirs);
        let hf_cache = crate::engine::model::hf_cache(
            kit.paths.hf_cache.as_deref().map(|p| dirs.expand(p)).as_deref(),
            env,
            &dirs.home,
        );
        Self {
            kit_ref: KitRef::new(kit_arg),
            socket: socket_path(&logs, &kit.name),
            pid_file: pid_path(&logs, &kit.name),
            supervisor_log: logs.join(format!("{}-supervisor.log", kit.name)),
            run_dir: run_dir(&dirs),
            hf_cache,
            engram_dir: dirs.expand(&kit.paths.engram_dir),
            lock_file: lock_path(&kit, &dirs),
            packed_dir: packed_dir(&kit, &dirs),
            cache: dirs.cache.clone(),
            venv: kit.engine.venv.as_deref().map(|p| dirs.expand(p)),
            ports: Ports { host: kit.engine.host.clone(), api: kit.engine.port, internal: internal_port(&kit) },
            key: KeySource::of(&kit.engine.api_keys, env),
            logs,
            dirs,
            kit,
        }
    }

    /// Whether the head node runs on this machine (then `up` can check its API port first).
    #[must_use]
    pub fn head_is_local(&self) -> bool {
        self.kit.nodes.iter().any(|n| n.role == Role::Head && n.transport == Transport::Local)
    }

    /// The head node when it is not on this machine.
    #[must_use]
    pub fn remote_head(&self) -> Option<&str> {
        self.kit.nodes.iter().find(|n| n.role == Role::Head && n.transport != Transport::Local).map(|n| n.name.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::kit::builtin_kit as kit;

    #[test]
    fn paths_and_ports_of_tiny_cpu() {
        let env = vec![("HOME".to_string(), "/h".to_string())];
        let s = Settings::new(kit("tiny-cpu"), Some("tiny-cpu"), &env);
        assert!(s.socket.starts_with(&s.logs) && s.pid_file.starts_with(&s.logs), "{s:?}");
        assert_eq!(s.supervisor_log, s.logs.join("tiny-cpu-supervisor.log"));
        assert!(s.lock_file.ends_with("tiny-cpu/spark-kit.lock"), "{}", s.lock_file.display());
        assert_eq!(s.packed_dir, s.lock_file.with_file_name("engram-packed"));
        assert_eq!(s.cache, s.dirs.cache);
        assert_eq!(s.ports.internal, s.kit.engine.effective_internal_port());
        assert_eq!(s.ports.internal_tcp().unwrap(), u16::try_from(s.ports.internal).unwrap());
        assert!(s.ports.endpoint().ends_with(&format!(":{}/v1", s.kit.engine.port)), "{}", s.ports.endpoint());
        assert!(s.head_is_local() && s.remote_head().is_none());
        assert_eq!(s.kit_ref.command("status", &[]), "spark-kit status --kit tiny-cpu");
    }

    #[test]
    fn an_internal_port_out_of_range_says_the_key() {
        let p = Ports { host: "127.0.0.1".into(), api: 8000, internal: 70000 };
        assert!(p.internal_tcp().unwrap_err().to_string().starts_with("engine.internal_port 70000 "));
    }
}
