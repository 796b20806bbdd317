//! What `up` settles before the supervisor starts: the kit and its settings (with
//! `--shutdown-timeout`), that it is not running already, that the API port is free, the gates
//! (preflight, weight trees), and its registration (pid file, live record) for the run.

use std::time::Duration;

use super::load;
use crate::cli::UpArgs;
use crate::error::Failure;
use crate::kit::{Origin, Override};
use crate::live;
use crate::runtime::check_port;
use crate::settings::Settings;
use crate::supervisor::control::request;
use crate::supervisor::Gates;
use crate::weights::listing::{weight_trees, WeightTree};

/// The kit `up` / `restart` mean, with `--shutdown-timeout` (above the environment, below
/// `--set`), and its settings on this machine.
pub fn settings(args: &UpArgs, env: &[(String, String)]) -> Result<Settings, Failure> {
    let mut flags = load::flag_overrides(&args.kit)?;
    if let Some(t) = &args.shutdown_timeout {
        flags.insert(
            0,
            Override {
                path: vec!["engine".into(), "shutdown_timeout_s".into()],
                raw: t.clone(),
                origin: Origin::Flag("--shutdown-timeout".into()),
            },
        );
    }
    let src = crate::kit::source(args.kit.kit.as_deref()).map_err(load::kit_failure)?;
    let kit = crate::kit::resolve(src, env, &flags).map_err(load::kit_failure)?.kit;
    Ok(Settings::new(kit, args.kit.kit.as_deref(), env)?)
}

/// Whether the kit's supervisor answers on its control socket.
#[must_use]
pub fn is_running(s: &Settings) -> bool {
    request(&s.socket, &s.kit.name, "status", Some(Duration::from_secs(5))).is_ok()
}

/// Refuse to start a kit that is running; fail before anything starts when the local head's API
/// port is taken (vLLM would notice late).
pub fn check_free(s: &Settings) -> Result<(), Failure> {
    std::fs::create_dir_all(&s.deploy.logs).map_err(|e| {
        Failure::runtime(format!("cannot create {}: {e}", s.deploy.logs.display())).caused_by_chain_of(&e)
    })?;
    if let Ok(snap) = request(&s.socket, &s.kit.name, "status", Some(Duration::from_secs(5))) {
        return Err(Failure::runtime(format!(
            "kit {} is already running (supervisor pid {}, state {:?})",
            s.kit.name, snap.supervisor_pid, snap.state
        ))
        .with_hint(format!(
            "see {}, stop it with {}",
            s.kit_ref.quoted("status", &[]),
            s.kit_ref.quoted("down", &[])
        )));
    }
    if s.head_is_local() {
        check_port(&s.deploy.ports.host, s.deploy.ports.api)?;
    }
    Ok(())
}

/// The gates the supervisor passes before the engines start.
pub fn gates(s: &Settings, args: &UpArgs) -> Result<Gates, Failure> {
    Ok(Gates {
        exe: crate::dirs::self_exe()?,
        preflight: (!args.skip_preflight).then(|| crate::node::preflight::PreflightInput {
            gateway_holds_api_port: true,
            ..super::preflight_input::input(s)
        }),
        weight_trees: weight_trees(&s.kit, &s.deploy.hf_cache, &s.deploy.engram_dir)
            .into_iter()
            .map(|t| WeightTree { path: s.deploy.dirs.expand(&t.path.to_string_lossy()), ..t })
            .collect(),
        home: s.deploy.dirs.home.clone(),
        replace: args.replace,
        limits: crate::supervisor::GateLimits::default(),
        engines: true,
    })
}

/// The foreground supervisor's traces: its pid file and live record, removed with its socket by
/// [`Registration::release`].
pub struct Registration<'a> {
    settings: &'a Settings,
    record: Option<std::path::PathBuf>,
}

impl<'a> Registration<'a> {
    /// Write the pid file and the live record; a record that cannot be written is a warning on `err`.
    pub fn new(s: &'a Settings, args: &UpArgs, err: &mut dyn std::io::Write) -> Self {
        let _ = std::fs::write(&s.pid_file, std::process::id().to_string());
        let record = live::Record {
            schema: 1,
            kit_name: s.kit.name.clone(),
            kit_arg: live::recorded_arg(args.kit.kit.as_deref()),
            socket: s.socket.clone(),
            pid: std::process::id(),
            endpoint: s.deploy.ports.endpoint(),
            kit: s.kit.clone(),
        };
        let record = live::register(&s.run_dir, &record)
            .map_err(|e| {
                let _ = writeln!(err, "warning: cannot register in {}: {e}", s.run_dir.display());
            })
            .ok();
        Self { settings: s, record }
    }

    /// Remove the socket, the pid file and the live record.
    pub fn release(self) {
        let _ = std::fs::remove_file(&self.settings.socket);
        let _ = std::fs::remove_file(&self.settings.pid_file);
        if let Some(p) = &self.record {
            live::unregister(p);
        }
    }
}
