//! The vLLM engine, under every runtime: the embedded Python overlay, the vLLM command per node,
//! the engine process (PyO3 on its main thread) and its process group, its log and boot phases,
//! and the served model's directory. How a node runs it (a venv, a container) is `runtime/`.

pub mod argv;
pub mod boot_phase;
pub mod child_exit;
pub mod embed;
pub mod log_watch;
pub mod model;
pub mod overlay;
pub mod pgroup;
pub mod process;

/// How often a long step (a venv build step, a tiny model's maker) says it is still running:
/// no quiet minute.
pub const STILL_EVERY: std::time::Duration = std::time::Duration::from_secs(10);
