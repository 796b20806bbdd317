//! `spark-kit image build`: the engine image of a kit with `engine.docker_mount_venv`, made
//! offline from this machine's own files — no registry, no Dockerfile. The engine venv (~6 GB)
//! is not baked in (vfs copies an image per container): it and its base Python's standard
//! library are bind-mounted read-only at their own paths ([`venv_mounts`]), so the image is only
//! a small rootfs: `/bin/sh`, the venv's interpreter, and the shared libraries (per `ldd`) that
//! the interpreter and every extension module of the venv and the standard library load from
//! outside those mounts. The rootfs tarball is cached under `<cache>/images/build/` by a hash of
//! its inputs (the venv's completion marker, the interpreter, the system's package database) and
//! brought in with `docker import`, labelled with that hash so a rerun with nothing changed
//! does nothing.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use sha2::{Digest, Sha256};

use super::dockerctl::{self, DockerError};
use crate::kit::schema::Kit;

/// The label that records the inputs' hash on the imported image.
pub const LABEL_INPUTS: &str = "spark-kit.inputs";
/// Bumped when the rootfs layout changes.
const FORMAT: &str = "spark-kit engine image v1";
/// Executables in the image besides the interpreter (vLLM's CPU platform calls `lscpu`).
const TOOLS: &[&str] = &["/bin/sh", "/usr/bin/lscpu"];
/// Files `ldd` is asked about per call.
const LDD_BATCH: usize = 200;

/// Why an image could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("kit {kit}: its image is not made by spark-kit (engine.docker_mount_venv is not set)")]
    NotBuildable { kit: String },
    #[error("the kit has no engine.docker_image")]
    NoImageSet,
    #[error("venv python {python} is not usable: {why}")]
    Python { python: PathBuf, why: String },
    #[error("{what} {path}: {source}")]
    Io { what: &'static str, path: PathBuf, source: std::io::Error },
    #[error("tar of the image rootfs failed: {0}")]
    Tar(String),
    #[error("docker import: {0}")]
    Docker(#[from] DockerError),
}

impl ImageError {
    /// The one-line fix.
    #[must_use]
    pub fn fix(&self) -> String {
        match self {
            Self::NotBuildable { .. } => {
                "load the image on this node (`docker load -i <file>`), or copy it from the head with `spark-kit image sync`"
                    .into()
            }
            Self::NoImageSet => "set engine.docker_image in the kit".into(),
            Self::Python { .. } => "rebuild the engine venv (`spark-kit setup --kit <kit>`)".into(),
            Self::Io { .. } => "check the cache directory (SPARK_KIT_CACHE) is writable and has room".into(),
            Self::Tar(_) => "check that `tar` is installed and the cache directory has room".into(),
            Self::Docker(e) => e.fix(),
        }
    }
}

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> ImageError {
    let path = path.to_path_buf();
    move |source| ImageError::Io { what, path, source }
}

/// The venv's interpreter as the container needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PythonLayout {
    /// Paths outside the venv on the way from `<venv>/bin/python` to the interpreter (symlinks
    /// and the file itself); the image holds the interpreter at each.
    pub executables: Vec<PathBuf>,
    /// The interpreter file itself.
    pub interpreter: PathBuf,
    /// The base Python's standard library directories (bind-mounted).
    pub stdlib: Vec<PathBuf>,
}

/// Where the venv's python comes from (runs it once).
pub fn python_layout(venv: &Path) -> Result<PythonLayout, ImageError> {
    let python = venv.join("bin/python");
    let code = "import sysconfig; print(sysconfig.get_path('stdlib')); print(sysconfig.get_path('platstdlib'))";
    let out = Command::new(&python)
        .args(["-I", "-c", code])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| ImageError::Python { python: python.clone(), why: e.to_string() })?;
    if !out.status.success() {
        let why = String::from_utf8_lossy(&out.stderr).lines().last().unwrap_or("").to_string();
        return Err(ImageError::Python { python, why });
    }
    let mut stdlib: Vec<PathBuf> = Vec::new();
    for l in String::from_utf8_lossy(&out.stdout).lines().map(str::trim).filter(|l| !l.is_empty()) {
        let p = PathBuf::from(l);
        if !p.starts_with(venv) && !stdlib.contains(&p) {
            stdlib.push(p);
        }
    }
    let mut executables = Vec::new();
    let mut at = python.clone();
    for _ in 0..16 {
        if !at.starts_with(venv) && !executables.contains(&at) {
            executables.push(at.clone());
        }
        match fs::read_link(&at) {
            Ok(next) => at = at.parent().map_or(next.clone(), |d| d.join(&next)),
            Err(_) => break,
        }
    }
    let interpreter = fs::canonicalize(&python).map_err(io("cannot resolve", &python))?;
    if !executables.contains(&interpreter) && !interpreter.starts_with(venv) {
        executables.push(interpreter.clone());
    }
    Ok(PythonLayout { executables, interpreter, stdlib })
}

/// The host directories the container mounts read-only at their own paths: the venv and its
/// base Python's standard library.
pub fn venv_mounts(venv: &Path) -> Result<Vec<String>, ImageError> {
    let layout = python_layout(venv)?;
    let mut out = vec![venv.display().to_string()];
    out.extend(layout.stdlib.iter().map(|p| p.display().to_string()));
    Ok(out)
}

/// Where progress goes.
pub trait BuildReporter {
    fn line(&self, text: &str);
}

/// What `build` did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Built {
    pub image: String,
    pub image_id: String,
    /// `present` (the daemon has it from the same inputs), `imported` (from the cached
    /// tarball) or `built` (tarball made, then imported).
    pub action: &'static str,
    pub tarball: PathBuf,
    pub bytes: u64,
    pub inputs: String,
}

/// Make `kit`'s engine image from `venv` (cached under `cache`) and import it into the daemon.
pub fn build(kit: &Kit, venv: &Path, cache: &Path, rep: &dyn BuildReporter) -> Result<Built, ImageError> {
    if !kit.engine.docker_mount_venv {
        return Err(ImageError::NotBuildable { kit: kit.name.clone() });
    }
    let image = kit.engine.docker_image.clone().filter(|i| !i.is_empty()).ok_or(ImageError::NoImageSet)?;
    let layout = python_layout(venv)?;
    let inputs = inputs_hash(venv, &layout)?;
    let present = dockerctl::query(
        &["image", "inspect", "--format", &format!("{{{{index .Config.Labels \"{LABEL_INPUTS}\"}}}}"), &image],
        Some(&image),
    );
    let dir = cache.join("images/build");
    let safe: String = image.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).collect();
    let tarball = dir.join(format!("{safe}-{inputs}.tar"));
    match present {
        Ok(label) if label.trim() == inputs => {
            let image_id = dockerctl::image_id(&image)?.unwrap_or_default();
            let bytes = fs::metadata(&tarball).map_or(0, |m| m.len());
            return Ok(Built { image, image_id, action: "present", tarball, bytes, inputs });
        }
        Ok(_) | Err(DockerError::NoImage(_)) => {}
        Err(e) => return Err(e.into()),
    }
    let action = if tarball.is_file() {
        "imported"
    } else {
        rep.line(&format!("making the rootfs of {image} (the libraries the venv's python loads; once per venv)"));
        make_tarball(venv, &layout, &dir, &tarball)?;
        "built"
    };
    let bytes = fs::metadata(&tarball).map_or(0, |m| m.len());
    rep.line(&format!("docker import {} ({:.1} MiB) as {image}", tarball.display(), bytes as f64 / 1_048_576.0));
    let label = format!("LABEL {LABEL_INPUTS}={inputs}");
    let path = tarball.display().to_string();
    // Watched by the daemon's heartbeat: a large rootfs takes its time, a wedged daemon is named.
    let still = &mut |t: std::time::Duration| rep.line(&format!("docker import: still running, {} s", t.as_secs()));
    dockerctl::long(&["import", "--change", &label, &path, &image], Some(&image), still)?;
    let image_id = dockerctl::image_id(&image)?.unwrap_or_default();
    Ok(Built { image, image_id, action, tarball, bytes, inputs })
}

/// 16 hex digits over what decides the rootfs: the venv (its completion marker), the
/// interpreter, the tools, the base standard library's location and the system's package
/// database (a changed system library changes it).
fn inputs_hash(venv: &Path, layout: &PythonLayout) -> Result<String, ImageError> {
    let mut h = Sha256::new();
    h.update(format!("{FORMAT}\0{}\0", venv.display()).as_bytes());
    let marker = venv.join(crate::runtime::venv::build::MARKER);
    // A venv named by engine.venv may have no marker: then its python's identity stands in.
    h.update(fs::read(&marker).unwrap_or_default());
    let mut files: Vec<PathBuf> = layout.executables.clone();
    files.push(layout.interpreter.clone());
    files.extend(TOOLS.iter().map(PathBuf::from));
    files.push(PathBuf::from("/var/lib/dpkg/status"));
    for f in &files {
        if let Ok(m) = fs::metadata(f) {
            let mtime =
                m.modified().ok().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok()).unwrap_or_default();
            h.update(format!("{}\0{}\0{}\0", f.display(), m.len(), mtime.as_nanos()).as_bytes());
        }
    }
    for d in &layout.stdlib {
        h.update(format!("{}\0", d.display()).as_bytes());
    }
    Ok(h.finalize().iter().take(8).map(|b| format!("{b:02x}")).collect())
}

/// Every ELF shared object (`*.so`, `*.so.N`) under `dir`.
fn shared_objects(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = fs::read_dir(dir) else { return };
    for e in rd.flatten() {
        let p = e.path();
        match e.file_type() {
            Ok(t) if t.is_dir() => shared_objects(&p, out),
            Ok(t) if t.is_file() => {
                let name = e.file_name().to_string_lossy().into_owned();
                if name.ends_with(".so") || name.contains(".so.") {
                    out.push(p);
                }
            }
            _ => {}
        }
    }
}

/// The libraries `ldd` finds for `files`, outside `mounted`.
fn libraries(files: &[PathBuf], mounted: &[PathBuf]) -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    for batch in files.chunks(LDD_BATCH) {
        let Ok(o) = Command::new("ldd").args(batch).stdin(Stdio::null()).stderr(Stdio::null()).output() else {
            continue;
        };
        for line in String::from_utf8_lossy(&o.stdout).lines() {
            // `\tlibz.so.1 => /lib/x86_64-linux-gnu/libz.so.1 (0x…)` or `\t/lib64/ld-linux… (0x…)`;
            // a `file:` header line (several files) ends with a colon and is skipped.
            let Some(p) = line.split_whitespace().filter(|w| w.starts_with('/')).find(|w| !w.ends_with(':')) else {
                continue;
            };
            let p = PathBuf::from(p);
            if p.is_file() && !mounted.iter().any(|m| p.starts_with(m)) {
                out.insert(p);
            }
        }
    }
    out
}

fn make_tarball(venv: &Path, layout: &PythonLayout, dir: &Path, tarball: &Path) -> Result<(), ImageError> {
    fs::create_dir_all(dir).map_err(io("cannot create", dir))?;
    let mut mounted = vec![venv.to_path_buf()];
    mounted.extend(layout.stdlib.iter().cloned());
    let mut objects = vec![layout.interpreter.clone()];
    objects.extend(TOOLS.iter().map(PathBuf::from).filter(|p| p.is_file()));
    for m in &mounted {
        shared_objects(m, &mut objects);
    }
    let libs = libraries(&objects, &mounted);
    let root = dir.join(format!(".rootfs-{}", std::process::id()));
    let _ = fs::remove_dir_all(&root);
    let result = (|| {
        let mut copies: Vec<(PathBuf, PathBuf)> =
            layout.executables.iter().map(|e| (layout.interpreter.clone(), e.clone())).collect();
        copies.extend(TOOLS.iter().map(PathBuf::from).filter(|p| p.is_file()).map(|p| (p.clone(), p)));
        copies.extend(libs.iter().map(|l| (l.clone(), l.clone())));
        for (from, to) in &copies {
            let dest = root.join(to.strip_prefix("/").unwrap_or(to));
            if let Some(p) = dest.parent() {
                fs::create_dir_all(p).map_err(io("cannot create", p))?;
            }
            // Follows links: the image gets the files, whatever the host's link layout.
            fs::copy(from, &dest).map_err(io("cannot copy", from))?;
        }
        for d in ["proc", "sys", "dev", "tmp", "etc", "root"] {
            let p = root.join(d);
            fs::create_dir_all(&p).map_err(io("cannot create", &p))?;
        }
        use std::os::unix::fs::PermissionsExt;
        let tmp = root.join("tmp");
        fs::set_permissions(&tmp, fs::Permissions::from_mode(0o1777)).map_err(io("cannot chmod", &tmp))?;
        let passwd = root.join("etc/passwd");
        fs::write(&passwd, "root:x:0:0:root:/root:/bin/sh\n").map_err(io("cannot write", &passwd))?;
        let part = dir.join(format!(".{}.part", tarball.file_name().unwrap_or_default().to_string_lossy()));
        let st = Command::new("tar")
            .args(["--sort=name", "--owner=0", "--group=0", "--numeric-owner", "-C"])
            .arg(&root)
            .arg("-cf")
            .arg(&part)
            .arg(".")
            .stdin(Stdio::null())
            .output()
            .map_err(|e| ImageError::Tar(e.to_string()))?;
        if !st.status.success() {
            return Err(ImageError::Tar(String::from_utf8_lossy(&st.stderr).trim().to_string()));
        }
        fs::rename(&part, tarball).map_err(io("cannot write", tarball))
    })();
    let _ = fs::remove_dir_all(&root);
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_kits_that_mount_their_venv_are_built() {
        let mut kit = crate::kit::builtin_kit("tiny-cpu-docker");
        kit.engine.docker_mount_venv = false;
        let e = build(&kit, Path::new("/nonexistent"), Path::new("/nonexistent"), &Quiet).unwrap_err();
        assert!(matches!(e, ImageError::NotBuildable { .. }), "{e}");
        assert!(e.fix().contains("image sync"));
    }

    struct Quiet;
    impl BuildReporter for Quiet {
        fn line(&self, _: &str) {}
    }

    #[test]
    fn ldd_finds_the_loader_and_libc_of_sh() {
        let libs = libraries(&[PathBuf::from("/bin/sh")], &[]);
        assert!(libs.iter().any(|l| l.to_string_lossy().contains("libc.so")), "{libs:?}");
        let none = libraries(&[PathBuf::from("/bin/sh")], &[PathBuf::from("/")]);
        assert!(none.is_empty(), "{none:?}");
    }
}
