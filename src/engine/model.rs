//! Where the served model comes from, per `model.source`: made locally (tiny kits), a local
//! directory, or a snapshot in the Hugging Face cache.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::cancel::Cancel;
use crate::deploy::Deployment;
use crate::kit::schema::{Kit, ModelSource};

/// Why the model directory is not available.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("model.path {0} does not exist or has no config.json")]
    MissingLocal(PathBuf),
    #[error("{repo} is not in the Hugging Face cache {cache} (no refs/{revision}); run `spark-kit download`")]
    NotDownloaded { repo: String, revision: String, cache: PathBuf },
    #[error("the tiny model maker failed ({status}); see {log}")]
    Maker { status: String, log: PathBuf },
    #[error("cannot run the tiny model maker {python}: {source}")]
    MakerStart { python: PathBuf, source: std::io::Error },
    /// Making the model was cancelled (the agent was told to stop); its scratch is removed.
    #[error("making the tiny model was cancelled")]
    Cancelled,
}

/// The served snapshot of `repo` at `revision` in the HF cache ([`crate::deploy::hf::snapshot`],
/// the one rule), when it holds a `config.json`.
pub fn hub_snapshot(d: &Deployment, repo: &str, revision: &str) -> Result<PathBuf, ModelError> {
    let missing =
        || ModelError::NotDownloaded { repo: repo.into(), revision: revision.into(), cache: d.hf_cache.clone() };
    d.snapshot(repo, revision).filter(|s| s.join("config.json").exists()).ok_or_else(missing)
}

/// The directory a tiny model of `kind` (`tiny-exl3`, `tiny-dense`) is made in:
/// `<data_dir>/models/<kind>-<overlay tag>`. The tag (the materialised overlay's directory name,
/// `<version>-<content hash>`) changes with the maker, so a changed maker makes a new model.
#[must_use]
pub fn tiny_dir(data_dir: &Path, kind: &str, overlay_tag: &str) -> PathBuf {
    data_dir.join("models").join(format!("{kind}-{overlay_tag}"))
}

/// The directory [`ensure`] finds or makes for `kit` on the node of `d`, without making
/// anything (None: a Hub model not in the cache yet). `overlay_tag`: [`super::overlay::tag`].
#[must_use]
pub fn served_dir(kit: &Kit, d: &Deployment, overlay_tag: &str) -> Option<PathBuf> {
    match kit.model.source {
        ModelSource::Local => d.model_path.clone(),
        ModelSource::Hub => hub_snapshot(d, &kit.model.repo, &kit.model.revision).ok(),
        ModelSource::TinyExl3 => Some(tiny_dir(&d.data_dir, "tiny-exl3", overlay_tag)),
        ModelSource::TinyDense => Some(tiny_dir(&d.data_dir, "tiny-dense", overlay_tag)),
    }
}

fn overlay_tag(overlay: &Path) -> String {
    overlay.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}

/// Make (once) or find the model directory of `kit`. Tiny models are made by the overlay's
/// maker with the engine venv's python into `<data_dir>/models/`, its output logged to `log`.
/// Making a tiny model takes a minute on a first start: `still` hears the seconds spent every
/// [`crate::engine::STILL_EVERY`] while a maker runs (no quiet minute). `cancel` kills
/// the maker's process group and removes its scratch ([`ModelError::Cancelled`]); the makers
/// rename a model into place only once it is complete, so none is left half-made.
pub fn ensure(
    kit: &Kit,
    d: &Deployment,
    python: &Path,
    overlay: &Path,
    log: &Path,
    still: &dyn Fn(f64),
    cancel: &Cancel,
) -> Result<PathBuf, ModelError> {
    ensure_every(kit, d, (python, overlay, log), (still, crate::engine::STILL_EVERY), cancel)
}

fn ensure_every(
    kit: &Kit,
    d: &Deployment,
    (python, overlay, log): (&Path, &Path, &Path),
    still: (&dyn Fn(f64), Duration),
    cancel: &Cancel,
) -> Result<PathBuf, ModelError> {
    let data_dir = &d.data_dir;
    match kit.model.source {
        ModelSource::Local => {
            let p = d.model_path.clone().unwrap_or_default();
            if p.join("config.json").exists() {
                Ok(p)
            } else {
                Err(ModelError::MissingLocal(p))
            }
        }
        ModelSource::Hub => hub_snapshot(d, &kit.model.repo, &kit.model.revision),
        ModelSource::TinyExl3 => make_tiny_exl3(data_dir, (python, overlay, log), still, cancel),
        ModelSource::TinyDense => {
            let maker = overlay.join("tools/make_tiny_model.py");
            let dir = tiny_dir(data_dir, "tiny-dense", &overlay_tag(overlay));
            if dir.join("config.json").exists() && dir.join("model.safetensors").exists() {
                return Ok(dir);
            }
            let mut cmd = Command::new(python);
            cmd.arg(&maker).arg("--out").arg(&dir);
            let status = run_maker(&mut cmd, (python, log), still, cancel).map_err(|e| scratch_gone(e, &[&dir]))?;
            if status.success() && dir.join("config.json").exists() {
                Ok(dir)
            } else {
                Err(ModelError::Maker { status: status.to_string(), log: log.to_path_buf() })
            }
        }
    }
}

/// A cancelled maker's scratch beside each of `dirs` (`.<name>.tmp-*`, `.work-*`, `.old-*`:
/// the makers' staging directories) is removed; other errors pass.
fn scratch_gone(e: ModelError, dirs: &[&Path]) -> ModelError {
    if matches!(e, ModelError::Cancelled) {
        for dir in dirs {
            let (Some(parent), Some(name)) = (dir.parent(), dir.file_name()) else { continue };
            let prefix = format!(".{}.", name.to_string_lossy());
            for entry in fs::read_dir(parent).into_iter().flatten().flatten() {
                if entry.file_name().to_string_lossy().starts_with(&prefix) {
                    let _ = fs::remove_dir_all(entry.path());
                }
            }
        }
    }
    e
}

/// Runs a maker (its own process group) with its output to `log`, telling `still` the seconds
/// spent every period; `cancel` kills the group ([`ModelError::Cancelled`]).
fn run_maker(
    cmd: &mut Command,
    (python, log): (&Path, &Path),
    (still, every): (&dyn Fn(f64), Duration),
    cancel: &Cancel,
) -> Result<ExitStatus, ModelError> {
    if let Some(p) = log.parent() {
        let _ = fs::create_dir_all(p);
    }
    let start = |source| ModelError::MakerStart { python: python.into(), source };
    let out = fs::File::create(log).map_err(start)?;
    let err = out.try_clone().map_err(start)?;
    cmd.stdin(Stdio::null()).stdout(out).stderr(err);
    let mut group =
        cancel.spawn(cmd).map_err(|e| if cancel.is_cancelled() { ModelError::Cancelled } else { start(e) })?;
    let (started, mut said) = (Instant::now(), Duration::ZERO);
    loop {
        if let Some(status) = group.child.try_wait().map_err(start)? {
            if !status.success() && cancel.is_cancelled() {
                return Err(ModelError::Cancelled);
            }
            return Ok(status);
        }
        std::thread::sleep(Duration::from_millis(100));
        let t = started.elapsed();
        if t >= said + every {
            said = t;
            still(t.as_secs_f64());
        }
    }
}

/// The tiny EXL3 model (`tools/make_tiny_exl3.py`), made once into
/// `<data_dir>/models/tiny-exl3-<overlay tag>`, with its dense twin beside it ([`dense_twin`]).
fn make_tiny_exl3(
    data_dir: &Path,
    (python, overlay, log): (&Path, &Path, &Path),
    still: (&dyn Fn(f64), Duration),
    cancel: &Cancel,
) -> Result<PathBuf, ModelError> {
    let maker = overlay.join("tools/make_tiny_exl3.py");
    let dir = tiny_dir(data_dir, "tiny-exl3", &overlay_tag(overlay));
    let twin = dense_twin(&dir);
    let made = |d: &Path| d.join("config.json").exists() && d.join("model.safetensors").exists();
    if made(&dir) && made(&twin) {
        return Ok(dir);
    }
    let mut cmd = Command::new(python);
    cmd.arg(&maker).arg("--out").arg(&dir).arg("--dense-out").arg(&twin);
    let status = run_maker(&mut cmd, (python, log), still, cancel).map_err(|e| scratch_gone(e, &[&dir, &twin]))?;
    if status.success() && made(&dir) && made(&twin) {
        Ok(dir)
    } else {
        Err(ModelError::Maker { status: status.to_string(), log: log.to_path_buf() })
    }
}

/// The dense twin the EXL3 tiny maker writes beside `exl3_dir` (`<dir>-dense`): the same model
/// with every linear replaced by its decoded EXL3 weight, served without quantization.
#[must_use]
pub fn dense_twin(exl3_dir: &Path) -> PathBuf {
    let mut name = exl3_dir.file_name().map(std::ffi::OsStr::to_os_string).unwrap_or_default();
    name.push("-dense");
    exl3_dir.with_file_name(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dense_twin_sits_beside() {
        assert_eq!(
            dense_twin(Path::new("/d/models/tiny-exl3-0.1.0-ab")),
            PathBuf::from("/d/models/tiny-exl3-0.1.0-ab-dense")
        );
    }

    fn deployment(hf_cache: &Path, data_dir: &Path) -> Deployment {
        let kit = crate::kit::builtin_kit("tiny-cpu");
        Deployment {
            hf_cache: hf_cache.into(),
            data_dir: data_dir.into(),
            ..Deployment::resolve(&kit, &[("HOME".into(), "/h".into())]).unwrap()
        }
    }

    #[test]
    fn hub_snapshot_via_ref() {
        let t = tempfile::tempdir().unwrap();
        let c = "a".repeat(40);
        let d = deployment(t.path(), t.path());
        let repo = d.repo_dir("o/n");
        fs::create_dir_all(repo.join("refs")).unwrap();
        fs::write(repo.join("refs/main"), &c).unwrap();
        assert!(matches!(hub_snapshot(&d, "o/n", "main"), Err(ModelError::NotDownloaded { .. })));
        fs::create_dir_all(repo.join("snapshots").join(&c)).unwrap();
        fs::write(repo.join("snapshots").join(&c).join("config.json"), "{}").unwrap();
        assert_eq!(hub_snapshot(&d, "o/n", "main").unwrap(), repo.join("snapshots").join(&c));
    }

    #[test]
    fn served_dir_is_where_ensure_finds_a_made_model() {
        let t = tempfile::tempdir().unwrap();
        let (data, tag) = (t.path().join("data"), crate::engine::overlay::tag());
        let overlay = t.path().join("overlay").join(&tag);
        let made = |d: &Path| {
            fs::create_dir_all(d).unwrap();
            fs::write(d.join("config.json"), "{}").unwrap();
            fs::write(d.join("model.safetensors"), "").unwrap();
        };
        for source in [ModelSource::TinyExl3, ModelSource::TinyDense] {
            let mut kit = crate::kit::builtin_kit("tiny-cpu");
            kit.model.source = source;
            let d = deployment(t.path(), &data);
            let want = served_dir(&kit, &d, &tag).unwrap();
            made(&want);
            made(&dense_twin(&want));
            // Found, not made: the python is absent, so a made-again model would fail.
            let got = ensure(
                &kit,
                &d,
                Path::new("/nonexistent/python"),
                &overlay,
                &t.path().join("log"),
                &|_| {},
                &Cancel::default(),
            );
            assert_eq!(got.unwrap(), want, "{source:?}");
        }
    }

    #[test]
    fn a_maker_that_takes_a_while_says_it_is_still_running() {
        let t = tempfile::tempdir().unwrap();
        let (data, tag) = (t.path().join("data"), crate::engine::overlay::tag());
        let overlay = t.path().join("overlay").join(&tag);
        // A "python" that runs the maker's argv as a shell: sleeps, then writes what it was asked.
        let python = t.path().join("python");
        fs::write(&python, "#!/bin/sh\nsleep 0.55\nmkdir -p \"$3\" && echo '{}' > \"$3/config.json\"\n").unwrap();
        fs::set_permissions(&python, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let mut kit = crate::kit::builtin_kit("tiny-cpu");
        kit.model.source = ModelSource::TinyDense;
        let d = deployment(t.path(), &data);
        let heard = std::sync::Mutex::new(Vec::new());
        let still = |s: f64| heard.lock().unwrap().push(s);
        let log = t.path().join("logs/maker.log");
        let got =
            ensure_every(&kit, &d, (&python, &overlay, &log), (&still, Duration::from_millis(150)), &Cancel::default());
        assert_eq!(got.unwrap(), served_dir(&kit, &d, &tag).unwrap());
        let heard = heard.into_inner().unwrap();
        assert!(heard.len() >= 2, "{heard:?}");
        assert!(heard.windows(2).all(|w| w[1] > w[0]), "{heard:?}");
    }
}
