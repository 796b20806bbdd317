//! Launch kits: schema, built-in kits, layering with explained precedence, validation.
//!
//! Precedence, lowest first: built-in defaults < kit file < `SPARK_KIT_*` environment < flags.
//! Nothing is ever sourced into the process environment.

pub mod builtin;
pub mod bytes;
pub mod explain;
pub mod layers;
pub mod origin;
pub mod port;
pub mod positions;
pub mod problem;
pub mod reference;
pub mod schema;
pub mod shape;
pub mod suggest;
pub mod validate;

use std::path::Path;

pub use layers::{Layered, Override};
pub use origin::Origin;
pub use problem::Problem;
pub use schema::Kit;
pub use shape::Shape;

/// Which kit to load: a built-in name or a path to a YAML file.
#[derive(Debug, Clone)]
pub struct KitSource {
    /// Kit name (built-in name or file stem).
    pub name: String,
    /// Path shown in origins and errors.
    pub display: String,
    pub text: String,
    pub builtin: bool,
}

/// Everything that went wrong loading a kit. All are configuration errors (exit code 2).
#[derive(Debug, thiserror::Error)]
pub enum KitError {
    #[error("no kit named `{name}` and no such file; built-in kits: {available}")]
    NotFound { name: String, available: String },
    #[error("cannot read kit file {path}")]
    Read { path: String, source: std::io::Error },
    #[error("{file}:{line}:{col}: YAML syntax error: {msg}")]
    Syntax { file: String, line: usize, col: usize, msg: String },
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"))]
    Invalid(Vec<Problem>),
    #[error("internal: {0}")]
    Schema(#[from] shape::ShapeError),
}

impl KitError {
    /// A one-line fix for errors that are not already self-explaining.
    #[must_use]
    pub fn hint(&self) -> Option<String> {
        match self {
            Self::NotFound { .. } => {
                Some("run `spark-kit kits` to list built-in kits, or pass --kit path/to/kit.yaml".into())
            }
            Self::Read { .. } => Some("check the path and its permissions".into()),
            Self::Syntax { .. } => Some("fix the YAML at that position (indentation, quotes, brackets)".into()),
            Self::Invalid(_) | Self::Schema(_) => None,
        }
    }
}

impl Kit {
    /// Whether the kit needs GB10 GPUs (the CPU kits install the CPU build of vLLM).
    #[must_use]
    pub fn needs_gpu(&self) -> bool {
        !self.engine.requirements.contains("cpu")
    }

    /// What the engine runs, in one line (plan, preflight, up): `vLLM 0.34.0 (venv runtime,
    /// requirements engine-dgx-spark-cu130); the overlay supports 0.32.0, 0.33.0, 0.34.0`.
    #[must_use]
    pub fn engine_line(&self) -> String {
        let e = &self.engine;
        let version = if e.vllm_version.is_empty() {
            "any supported vLLM".to_string()
        } else {
            format!("vLLM {}", e.vllm_version)
        };
        let how = match (e.runtime, &e.docker_image) {
            (schema::Runtime::Docker, Some(image)) if e.docker_mount_venv => {
                format!("docker runtime, image {image} running the venv of requirements {}", e.requirements)
            }
            (schema::Runtime::Docker, Some(image)) => format!("docker runtime, image {image}"),
            _ => format!("venv runtime, requirements {}", e.requirements),
        };
        format!("{version} ({how}); the overlay supports {}", crate::vllm_support::supported_list())
    }
}

/// Find a kit by built-in name or file path.
pub fn source(kit: Option<&str>) -> Result<KitSource, KitError> {
    let name = kit.unwrap_or(builtin::DEFAULT_KIT);
    if let Some(b) = builtin::find(name) {
        return Ok(KitSource { name: b.name.into(), display: b.path.into(), text: b.text.into(), builtin: true });
    }
    let path = Path::new(name);
    if !path.exists() {
        let available = builtin::BUILTINS.iter().map(|b| b.name).collect::<Vec<_>>().join(", ");
        return Err(KitError::NotFound { name: name.into(), available });
    }
    let text = std::fs::read_to_string(path).map_err(|source| KitError::Read { path: name.into(), source })?;
    let stem = path.file_stem().map_or_else(|| name.to_string(), |s| s.to_string_lossy().into_owned());
    Ok(KitSource { name: stem, display: name.into(), text, builtin: false })
}

/// A built-in kit as it resolves with no environment and no flags (unit tests' shorthand).
#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub fn builtin_kit(name: &str) -> Kit {
    resolve(source(Some(name)).unwrap(), &[], &[]).unwrap().kit
}

/// A loaded, validated kit with the origin of every value.
#[derive(Debug, Clone)]
pub struct Resolved {
    pub kit: Kit,
    pub source: KitSource,
    pub layered: Layered,
    pub shape: Shape,
}

/// Layer defaults, the kit, the environment and the flags; type-check; validate.
///
/// `env` is the process environment as pairs (only `SPARK_KIT_*` entries are used);
/// `flags` are the command line's overrides, highest precedence, in order.
pub fn resolve(src: KitSource, env: &[(String, String)], flags: &[Override]) -> Result<Resolved, KitError> {
    resolve_for(src, env, flags, &validate::Part::ALL)
}

/// [`resolve`], validating only `parts` of the kit (what the command at hand uses).
pub fn resolve_for(
    src: KitSource,
    env: &[(String, String)],
    flags: &[Override],
    parts: &[validate::Part],
) -> Result<Resolved, KitError> {
    let shape = shape::kit_shape()?;
    let defaults = serde_yaml::to_value(Kit::default()).map_err(|e| KitError::Invalid(vec![internal(&e)]))?;
    let mut layered = Layered::new(defaults);

    let positions = positions::scan(&src.text).map_err(|e| KitError::Syntax {
        file: src.display.clone(),
        line: e.line,
        col: e.col,
        msg: e.msg,
    })?;
    let doc: serde_yaml::Value = serde_yaml::from_str(&src.text).map_err(|e| {
        let (line, col) = e.location().map_or((1, 1), |l| (l.line(), l.column()));
        KitError::Syntax { file: src.display.clone(), line, col, msg: e.to_string() }
    })?;
    let doc = match doc {
        serde_yaml::Value::Null => serde_yaml::Value::Mapping(serde_yaml::Mapping::new()),
        v @ serde_yaml::Value::Mapping(_) => v,
        _ => {
            return Err(KitError::Invalid(vec![Problem::new(
                Origin::Kit { file: src.display.clone(), line: 1, col: 1 },
                "",
                "a kit must be a YAML mapping",
                "start the file with keys such as `name:` and `model:`",
            )]))
        }
    };
    let kit_origin = |key: &str| {
        let p = positions.get(key).copied().unwrap_or(positions::Pos { line: 1, col: 1 });
        Origin::Kit { file: src.display.clone(), line: p.line, col: p.col }
    };
    let mut problems = layers::check_keys(&doc, &shape, &mut Vec::new(), &kit_origin);
    if problems.is_empty() {
        layered.merge_kit(doc, &src.display, &positions);
    }

    for ov in layers::env_overrides(env).iter().chain(flags) {
        if let Err(p) = layered.apply(ov, &shape) {
            problems.push(p);
        }
    }
    if !problems.is_empty() {
        return Err(KitError::Invalid(problems));
    }

    let kit: Kit = serde_path_to_error::deserialize(layered.value.clone()).map_err(|e| {
        let key = error_path(e.path());
        let origin = layered.locate(&key);
        let expected = shape.at(&split(&key)).map_or_else(|| "value".to_string(), Shape::type_name);
        // A deserializer that knows the fix names it after `port::FIX_MARK` (the ports' range).
        let msg = plain_types(&e.inner().to_string());
        let (msg, fix) = match msg.split_once(port::FIX_MARK) {
            Some((m, f)) => (m.to_string(), f.to_string()),
            None => (msg, format!("write {}", with_article(&expected))),
        };
        KitError::Invalid(vec![Problem::new(origin, key, msg, fix)])
    })?;

    let findings = validate::validate_parts(&kit, parts);
    if !findings.is_empty() {
        let problems =
            findings.into_iter().map(|f| Problem::new(layered.locate(&f.key), f.key, f.message, f.fix)).collect();
        return Err(KitError::Invalid(problems));
    }
    Ok(Resolved { kit, source: src, layered, shape })
}

/// serde names Rust types (`u32`); users read kit types.
fn plain_types(msg: &str) -> String {
    ["u16", "u32", "u64", "usize"]
        .iter()
        .fold(msg.to_string(), |m, t| m.replace(&format!("expected {t}"), "expected a whole number ≥ 0"))
        .replace("expected f64", "expected a number")
}

fn with_article(noun: &str) -> String {
    let vowel = noun.starts_with(['a', 'e', 'i', 'o', 'u']);
    format!("{} {noun}", if vowel { "an" } else { "a" })
}

fn internal(e: &serde_yaml::Error) -> Problem {
    Problem::new(Origin::Default, "", format!("defaults do not serialise: {e}"), "report this bug")
}

fn split(key: &str) -> Vec<String> {
    key.split('.').filter(|s| !s.is_empty()).map(str::to_string).collect()
}

fn error_path(path: &serde_path_to_error::Path) -> String {
    use serde_path_to_error::Segment;
    let parts: Vec<String> = path
        .iter()
        .filter_map(|seg| match seg {
            Segment::Seq { index } => Some(index.to_string()),
            Segment::Map { key } => Some(key.clone()),
            Segment::Enum { variant } => Some(variant.clone()),
            Segment::Unknown => None,
        })
        .collect();
    parts.join(".")
}
