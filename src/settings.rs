//! Resolved settings: a resolved kit, its deployment on this machine (`deploy::Deployment`:
//! paths, Hugging Face cache, ports, API keys) and what only the commands need beside it (the
//! control socket, pid file, supervisor log, live records, where the API key comes from for
//! printed commands, the kit as the user named it). Commands read these here rather than from
//! the kit or the environment.

use std::path::PathBuf;

use crate::deploy::Deployment;
use crate::dirs::HomeUnset;
use crate::hints::{KeySource, KitRef};
use crate::kit::schema::{Kit, Role, Transport};
use crate::live::run_dir;
use crate::supervisor::control::{pid_path, socket_path};

/// Everything a command needs about one kit on this machine.
#[derive(Debug, Clone)]
pub struct Settings {
    pub kit: Kit,
    /// The kit as the user named it (`--kit`), for the commands printed as fixes.
    pub kit_ref: KitRef,
    /// The kit's deployment on this machine: paths, HF cache, ports, API keys (src/deploy/).
    pub deploy: Deployment,
    /// The supervisor's control socket (`status`, `down`).
    pub socket: PathBuf,
    /// The foreground supervisor's pid file.
    pub pid_file: PathBuf,
    /// Where a detached supervisor's output goes.
    pub supervisor_log: PathBuf,
    /// The live records of running deployments.
    pub run_dir: PathBuf,
    /// Where the API key comes from, when the kit has keys (for printed `curl` commands).
    pub key: Option<KeySource>,
}

impl Settings {
    /// The settings of `kit` (resolved with its layers) on this machine; `kit_arg` is what
    /// `--kit` said (None: the default kit). HOME must be set.
    pub fn new(kit: Kit, kit_arg: Option<&str>, env: &[(String, String)]) -> Result<Self, HomeUnset> {
        let deploy = Deployment::resolve(&kit, env)?;
        let logs = &deploy.logs;
        Ok(Self {
            kit_ref: KitRef::new(kit_arg),
            socket: socket_path(logs, &kit.name),
            pid_file: pid_path(logs, &kit.name),
            supervisor_log: logs.join(format!("{}-supervisor.log", kit.name)),
            run_dir: run_dir(&deploy.dirs),
            key: KeySource::of(&kit.engine.api_keys, env),
            deploy,
            kit,
        })
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
        let s = Settings::new(kit("tiny-cpu"), Some("tiny-cpu"), &env).unwrap();
        let logs = &s.deploy.logs;
        assert!(s.socket.starts_with(logs) && s.pid_file.starts_with(logs), "{s:?}");
        assert_eq!(s.supervisor_log, logs.join("tiny-cpu-supervisor.log"));
        assert!(s.head_is_local() && s.remote_head().is_none());
        assert_eq!(s.kit_ref.command("status", &[]), "spark-kit status --kit tiny-cpu");
    }
}
