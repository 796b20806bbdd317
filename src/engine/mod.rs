//! The engine: the embedded Python overlay, the engine venv, the vLLM command per node, the
//! engine process (PyO3 on its main thread) and its process group.

pub mod argv;
pub mod boot_phase;
pub mod child_exit;
pub mod container;
pub mod docker;
pub mod dockerctl;
pub mod embed;
pub mod image_build;
pub mod log_watch;
pub mod model;
pub mod overlay;
pub mod pgroup;
pub mod process;
pub mod prune;
pub mod recipe;
pub mod venv;
