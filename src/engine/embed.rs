//! `spark-kit __engine`: CPython embedded with PyO3, initialised from the engine venv, running
//! `vllm` on this process's main thread. This is the only module with `unsafe` FFI.
//!
//! The process leads its own process group (the spawner made it so) and:
//! - sets its `oom_score_adj` to 1000 (children inherit it), so the kernel picks vLLM, not the host;
//! - watches its parent: when the parent goes (PDEATHSIG already sent us SIGTERM), it SIGTERMs
//!   itself again, waits `grace`, then SIGKILLs the whole group — EngineCore and workers never
//!   outlive us;
//! - sets `PyConfig.program_name` to the venv's python so `sys.executable`, `sys.prefix` and
//!   site-packages are the venv's, and checks that they are before importing vLLM.

use std::ffi::{CStr, CString};
use std::os::raw::c_char;
use std::path::{Path, PathBuf};
use std::thread;
use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::{getpgrp, getppid};
use pyo3::exceptions::PySystemExit;
use pyo3::prelude::*;
use pyo3::types::PyAnyMethods;

/// Why the engine could not run vLLM.
#[derive(Debug, thiserror::Error)]
pub enum EmbedError {
    #[error("engine venv python {0} does not exist; run `spark-kit setup` (or fix engine.venv)")]
    NoPython(PathBuf),
    #[error("cannot initialise Python from {python}: {msg}")]
    Init { python: PathBuf, msg: String },
    #[error(
        "embedded Python resolved {what} to {got}, not the venv ({want}); the venv is broken, rerun `spark-kit setup`"
    )]
    WrongPrefix { what: &'static str, got: String, want: String },
    #[error("argument contains a NUL byte: {0:?}")]
    Nul(String),
}

/// Set the kernel OOM-killer preference of this process (inherited by its children).
pub fn set_oom_score_adj(value: i32) -> std::io::Result<()> {
    std::fs::write("/proc/self/oom_score_adj", value.to_string())
}

/// Start the parent watchdog (see module docs). `grace` is the drain window before SIGKILL.
pub fn watch_parent(grace: Duration) {
    let parent = getppid();
    thread::spawn(move || loop {
        thread::sleep(Duration::from_millis(200));
        if getppid() != parent {
            // SIGTERM to this process (vLLM shuts its children down), then the whole group.
            let _ = nix::sys::signal::kill(nix::unistd::getpid(), Signal::SIGTERM);
            thread::sleep(grace);
            let _ = killpg(getpgrp(), Signal::SIGKILL);
            return;
        }
    });
}

fn cstring(s: &str) -> Result<CString, EmbedError> {
    CString::new(s).map_err(|_| EmbedError::Nul(s.to_string()))
}

/// Initialise CPython with `program_name` = the venv's python and `sys.argv` = `argv`.
fn initialise(python: &Path, argv: &[String]) -> Result<(), EmbedError> {
    let prog = cstring(&python.to_string_lossy())?;
    let args: Vec<CString> = argv.iter().map(|a| cstring(a)).collect::<Result<_, _>>()?;
    let mut ptrs: Vec<*const c_char> = args.iter().map(|a| a.as_ptr()).collect();
    let fail = |msg: String| EmbedError::Init { python: python.to_path_buf(), msg };
    // SAFETY: the PyConfig API is used as documented: initialised by PyConfig_InitPythonConfig
    // before any field is set, strings copied in by PyConfig_Set* (our CStrings outlive the
    // calls), cleared after Py_InitializeFromConfig. This runs once, on the main thread, before
    // any other Python use in this process.
    unsafe {
        let mut config = std::mem::MaybeUninit::<pyo3::ffi::PyConfig>::zeroed();
        pyo3::ffi::PyConfig_InitPythonConfig(config.as_mut_ptr());
        let mut config = config.assume_init();
        config.parse_argv = 0;
        config.install_signal_handlers = 1;
        let check = |status: pyo3::ffi::PyStatus| -> Result<(), EmbedError> {
            if pyo3::ffi::PyStatus_Exception(status) == 0 {
                return Ok(());
            }
            let msg = if status.err_msg.is_null() {
                "unknown error".to_string()
            } else {
                CStr::from_ptr(status.err_msg).to_string_lossy().into_owned()
            };
            Err(fail(msg))
        };
        let program_name = std::ptr::addr_of_mut!(config.program_name);
        let step = check(pyo3::ffi::PyConfig_SetBytesString(&raw mut config, program_name, prog.as_ptr()))
            .and_then(|()| {
                let n = isize::try_from(ptrs.len()).unwrap_or(isize::MAX);
                check(pyo3::ffi::PyConfig_SetBytesArgv(&raw mut config, n, ptrs.as_mut_ptr()))
            })
            .and_then(|()| check(pyo3::ffi::Py_InitializeFromConfig(&raw const config)));
        pyo3::ffi::PyConfig_Clear(&raw mut config);
        step?;
        // Release the GIL taken by initialisation; PyO3 re-acquires it in `attach`.
        pyo3::ffi::PyEval_SaveThread();
    }
    Ok(())
}

fn check_prefix(py: Python<'_>, venv: &Path) -> Result<(), EmbedError> {
    let sys = py.import("sys").map_err(|e| EmbedError::Init { python: venv.into(), msg: e.to_string() })?;
    let get = |name: &str| -> String { sys.getattr(name).and_then(|v| v.extract::<String>()).unwrap_or_default() };
    let want = venv.to_string_lossy().into_owned();
    let prefix = get("prefix");
    if Path::new(&prefix) != venv {
        return Err(EmbedError::WrongPrefix { what: "sys.prefix", got: prefix, want });
    }
    let exe = get("executable");
    if !Path::new(&exe).starts_with(venv) {
        return Err(EmbedError::WrongPrefix { what: "sys.executable", got: exe, want });
    }
    Ok(())
}

/// Run `vllm <args>` in the embedded interpreter; returns the process exit code.
///
/// Python's `SystemExit` gives the code; any other exception is printed with its traceback
/// (to stderr, i.e. the engine log) and gives 1. Python's atexit handlers run, the interpreter
/// is not finalised (never tear down under CUDA/NCCL threads).
pub fn run_vllm(venv: &Path, args: &[String]) -> Result<i32, EmbedError> {
    let python = venv.join("bin/python");
    if !python.exists() {
        return Err(EmbedError::NoPython(python));
    }
    let mut argv = vec!["vllm".to_string()];
    argv.extend(args.iter().cloned());
    initialise(&python, &argv)?;
    Python::attach(|py| {
        check_prefix(py, venv)?;
        let result = py.import("vllm.entrypoints.cli.main").and_then(|m| m.getattr("main")).and_then(|f| f.call0());
        let code = match result {
            Ok(_) => 0,
            Err(e) if e.is_instance_of::<PySystemExit>(py) => {
                let code = e.value(py).getattr("code").ok();
                match code {
                    None => 0,
                    Some(c) if c.is_none() => 0,
                    Some(c) => c.extract::<i32>().unwrap_or_else(|_| {
                        // `sys.exit("message")`: Python prints the message and exits 1.
                        e.print(py);
                        1
                    }),
                }
            }
            Err(e) => {
                e.print(py);
                1
            }
        };
        let _ =
            py.run(c"import atexit, sys\natexit._run_exitfuncs()\nsys.stdout.flush()\nsys.stderr.flush()", None, None);
        Ok(code)
    })
}
