//! The precedence chain: built-in defaults < kit file < `SPARK_KIT_*` environment < flags.
//!
//! Layers are merged as YAML values; every path a layer touches records its origin, so
//! `config --explain` and every error can name the layer (and file line) a value came from.

use std::collections::BTreeMap;

use serde_yaml::{Mapping, Value};

use super::origin::Origin;
use super::positions::Positions;
use super::problem::Problem;
use super::shape::{Scalar, Shape};
use super::suggest::closest;

/// Prefix of environment variables that set kit keys.
pub const ENV_PREFIX: &str = "SPARK_KIT_";

/// `SPARK_KIT_*` variables that are not kit keys.
pub const ENV_RESERVED: &[&str] = &["SPARK_KIT_LOG", "SPARK_KIT_CACHE"];

/// Variables with this prefix belong to the test suite, not to kits.
pub const ENV_TEST_PREFIX: &str = "SPARK_KIT_TEST_";

/// A value tree plus the origin of every path a layer set.
#[derive(Debug, Clone)]
pub struct Layered {
    pub value: Value,
    pub origins: BTreeMap<String, Origin>,
    /// Positions of the kit file's keys, and its display path.
    pub positions: Positions,
    pub file: String,
}

/// One value given as text by the environment or a flag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Override {
    pub path: Vec<String>,
    pub raw: String,
    pub origin: Origin,
}

#[must_use]
pub fn dotted(path: &[String]) -> String {
    path.join(".")
}

impl Layered {
    /// The defaults layer.
    #[must_use]
    pub fn new(defaults: Value) -> Self {
        Self { value: defaults, origins: BTreeMap::new(), positions: Positions::new(), file: String::new() }
    }

    /// Origin of a dotted key: the nearest recorded ancestor, else the default.
    #[must_use]
    pub fn origin_of(&self, key: &str) -> Origin {
        let mut k = key;
        loop {
            if let Some(o) = self.origins.get(k) {
                return o.clone();
            }
            match k.rfind('.') {
                Some(i) => k = &k[..i],
                None => return Origin::Default,
            }
        }
    }

    /// Where to point an error about `key`: its origin, or else the kit line nearest to it.
    #[must_use]
    pub fn locate(&self, key: &str) -> Origin {
        match self.origin_of(key) {
            Origin::Default => {
                let mut k = key;
                loop {
                    if let Some(p) = self.positions.get(k) {
                        return Origin::Kit { file: self.file.clone(), line: p.line, col: p.col };
                    }
                    match k.rfind('.') {
                        Some(i) => k = &k[..i],
                        None => return Origin::Default,
                    }
                }
            }
            other => other,
        }
    }

    fn forget_below(&mut self, key: &str) {
        let prefix = format!("{key}.");
        self.origins.retain(|k, _| k != key && !k.starts_with(&prefix));
    }

    /// Merge a kit document over the current value.
    pub fn merge_kit(&mut self, doc: Value, file: &str, positions: &Positions) {
        let mut path = Vec::new();
        let origin_at = |key: &str| {
            let mut k = key;
            loop {
                if let Some(p) = positions.get(k) {
                    return Origin::Kit { file: file.to_string(), line: p.line, col: p.col };
                }
                match k.rfind('.') {
                    Some(i) => k = &k[..i],
                    None => return Origin::Kit { file: file.to_string(), line: 1, col: 1 },
                }
            }
        };
        let mut value = std::mem::take(&mut self.value);
        merge(&mut value, doc, &mut path, &mut self.origins, &origin_at);
        self.value = value;
        self.positions = positions.clone();
        self.file = file.to_string();
    }

    /// Set one value given as text, typed by the kit's shape.
    pub fn apply(&mut self, ov: &Override, shape: &Shape) -> Result<(), Problem> {
        let key = dotted(&ov.path);
        let target = shape.at(&ov.path).ok_or_else(|| unknown_key(&ov.path, shape, ov.origin.clone()))?;
        let typed = typed_value(&ov.raw, target).map_err(|e| {
            Problem::new(ov.origin.clone(), &key, format!("`{}` is not valid YAML ({e})", ov.raw), "quote the value")
        })?;
        let slot = slot_mut(&mut self.value, &ov.path, shape).map_err(|e| {
            Problem::new(ov.origin.clone(), &key, e.to_string(), "address an existing list item (indices start at 0)")
        })?;
        *slot = typed;
        self.forget_below(&key);
        self.origins.insert(key, ov.origin.clone());
        Ok(())
    }
}

fn merge(
    dst: &mut Value,
    src: Value,
    path: &mut Vec<String>,
    origins: &mut BTreeMap<String, Origin>,
    origin_at: &dyn Fn(&str) -> Origin,
) {
    match (dst, src) {
        (Value::Mapping(d), Value::Mapping(s)) => {
            for (k, v) in s {
                let name = key_text(&k);
                path.push(name);
                match d.get_mut(&k) {
                    Some(existing) => merge(existing, v, path, origins, origin_at),
                    None => {
                        mark(&v, path, origins, origin_at);
                        d.insert(k, v);
                    }
                }
                path.pop();
            }
        }
        (dst, src) => {
            let key = dotted(path);
            let prefix = format!("{key}.");
            origins.retain(|k, _| *k != key && !k.starts_with(&prefix));
            mark(&src, path, origins, origin_at);
            *dst = src;
        }
    }
}

fn mark(v: &Value, path: &mut Vec<String>, origins: &mut BTreeMap<String, Origin>, origin_at: &dyn Fn(&str) -> Origin) {
    // Only values the layer really wrote get an origin: a list item's keys that the kit leaves
    // out keep their defaults and must say `default`.
    let key = dotted(path);
    match v {
        Value::Mapping(m) if !m.is_empty() => {
            for (k, sub) in m {
                path.push(key_text(k));
                mark(sub, path, origins, origin_at);
                path.pop();
            }
        }
        Value::Sequence(items) if items.iter().any(|i| i.is_mapping() || i.is_sequence()) => {
            for (i, sub) in items.iter().enumerate() {
                path.push(i.to_string());
                mark(sub, path, origins, origin_at);
                path.pop();
            }
        }
        _ => {
            origins.insert(key, origin_at(&dotted(path)));
        }
    }
}

/// A mapping key as text (kits use string keys; numbers and booleans are shown as written).
#[must_use]
pub fn key_text(k: &Value) -> String {
    match k {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        other => format!("{other:?}"),
    }
}

/// Why an override's path does not lead to a value in the kit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum SlotError {
    #[error("no key {0}")]
    NoKey(String),
    #[error("`{0}` is not a list index")]
    NotIndex(String),
    #[error("{list} has {len} item(s), so index {index} does not exist")]
    NoItem { list: String, len: usize, index: usize },
    #[error("{0} is a single value, not a section")]
    Scalar(String),
}

fn slot_mut<'a>(mut cur: &'a mut Value, path: &[String], shape: &Shape) -> Result<&'a mut Value, SlotError> {
    let mut here = shape;
    for (depth, seg) in path.iter().enumerate() {
        match here {
            Shape::Object(fields) => {
                here = fields.get(seg).map(|f| &f.shape).ok_or_else(|| SlotError::NoKey(seg.clone()))?;
                cur = entry(cur, seg);
            }
            Shape::Map(inner) => {
                here = inner;
                cur = entry(cur, seg);
            }
            Shape::List(inner) => {
                here = inner;
                let len = cur.as_sequence().map_or(0, Vec::len);
                let index: usize = seg.parse().map_err(|_| SlotError::NotIndex(seg.clone()))?;
                let Some(item) = cur.as_sequence_mut().and_then(|s| s.get_mut(index)) else {
                    return Err(SlotError::NoItem { list: dotted(&path[..depth]), len, index });
                };
                cur = item;
            }
            Shape::Scalar(_) => return Err(SlotError::Scalar(dotted(&path[..depth]))),
        }
    }
    Ok(cur)
}

fn entry<'a>(cur: &'a mut Value, seg: &str) -> &'a mut Value {
    if !cur.is_mapping() {
        *cur = Value::Mapping(Mapping::new());
    }
    match cur {
        Value::Mapping(m) => m.entry(Value::String(seg.to_string())).or_insert(Value::Null),
        // Proven: `cur` was made a mapping just above.
        _ => unreachable!("value was just made a mapping"),
    }
}

/// Type a textual value by the shape it is meant for.
pub fn typed_value(raw: &str, shape: &Shape) -> Result<Value, serde_yaml::Error> {
    match shape {
        Shape::Scalar(Scalar::String | Scalar::Enum(_)) => Ok(Value::String(raw.to_string())),
        Shape::Scalar(Scalar::Bytes) => {
            Ok(raw.trim().parse::<u64>().map_or_else(|_| Value::String(raw.to_string()), |n| Value::Number(n.into())))
        }
        _ => serde_yaml::from_str(raw),
    }
}

/// The problem for a key path that the schema does not have, with a suggestion.
pub fn unknown_key(path: &[String], shape: &Shape, origin: Origin) -> Problem {
    // Find the deepest known prefix, and suggest among its keys.
    let mut known = 0;
    while known < path.len() && shape.at(&path[..=known]).is_some() {
        known += 1;
    }
    let parent = shape.at(&path[..known]);
    let bad = path.get(known).cloned().unwrap_or_default();
    let key = dotted(path);
    let (message, fix) = match parent {
        Some(Shape::Object(fields)) => {
            let msg = format!("unknown key `{bad}`");
            let fix = match closest(&bad, fields.keys().map(String::as_str)) {
                Some(s) => format!("did you mean `{}`?", dotted(&[&path[..known], &[s.to_string()]].concat())),
                None => {
                    let list: Vec<&str> = fields.keys().map(String::as_str).collect();
                    let at = if known == 0 { "the top level".to_string() } else { dotted(&path[..known]) };
                    format!("valid keys under {at}: {}", list.join(", "))
                }
            };
            (msg, fix)
        }
        Some(Shape::List(_)) => (format!("`{bad}` is not a list index"), "use a number, e.g. nodes.0.name".into()),
        _ => (
            format!("`{}` is a single value and has no key `{bad}`", dotted(&path[..known])),
            "remove the extra key segment".into(),
        ),
    };
    Problem::new(origin, key, message, fix)
}

/// Check every key of a document against the shape; positions locate each problem.
pub fn check_keys(
    v: &Value,
    shape: &Shape,
    path: &mut Vec<String>,
    origin_at: &dyn Fn(&str) -> Origin,
) -> Vec<Problem> {
    let mut out = Vec::new();
    walk_keys(v, shape, shape, path, origin_at, &mut out);
    out
}

fn walk_keys(
    v: &Value,
    shape: &Shape,
    root: &Shape,
    path: &mut Vec<String>,
    origin_at: &dyn Fn(&str) -> Origin,
    out: &mut Vec<Problem>,
) {
    match (v, shape) {
        (Value::Mapping(m), Shape::Object(fields)) => {
            for (k, sub) in m {
                let name = key_text(k);
                path.push(name.clone());
                match fields.get(&name) {
                    Some(f) if k.is_string() => walk_keys(sub, &f.shape, root, path, origin_at, out),
                    _ => out.push(unknown_key(path, root, origin_at(&dotted(path)))),
                }
                path.pop();
            }
        }
        (Value::Mapping(m), Shape::Map(inner)) => {
            for (k, sub) in m {
                path.push(key_text(k));
                if k.is_string() {
                    walk_keys(sub, inner, root, path, origin_at, out);
                } else {
                    let key = dotted(path);
                    out.push(Problem::new(origin_at(&key), key, "map keys must be strings", "quote the key"));
                }
                path.pop();
            }
        }
        (Value::Sequence(items), Shape::List(inner)) => {
            for (i, sub) in items.iter().enumerate() {
                path.push(i.to_string());
                walk_keys(sub, inner, root, path, origin_at, out);
                path.pop();
            }
        }
        _ => {}
    }
}

/// Collect kit overrides from the environment (`SPARK_KIT_ENGINE__PORT=9999` → `engine.port`).
pub fn env_overrides(vars: &[(String, String)]) -> Vec<Override> {
    let mut out: Vec<Override> = vars
        .iter()
        .filter(|(name, _)| {
            name.starts_with(ENV_PREFIX) && !name.starts_with(ENV_TEST_PREFIX) && !ENV_RESERVED.contains(&name.as_str())
        })
        .map(|(name, value)| {
            let rest = &name[ENV_PREFIX.len()..];
            let path = rest.split("__").map(str::to_ascii_lowercase).collect();
            Override { path, raw: value.clone(), origin: Origin::Env(name.clone()) }
        })
        .collect();
    // Deterministic order whatever the environment's order.
    out.sort_by(|a, b| a.path.cmp(&b.path));
    out
}

/// Parse one `--set KEY=VALUE`.
pub fn set_override(arg: &str) -> Result<Override, Problem> {
    let origin = Origin::Flag(format!("--set {arg}"));
    let Some((key, value)) = arg.split_once('=') else {
        return Err(Problem::new(origin, arg, "missing `=`", "write --set KEY=VALUE, e.g. --set engine.port=8888"));
    };
    let key = key.trim();
    if key.is_empty() || key.split('.').any(str::is_empty) {
        return Err(Problem::new(origin, key, "empty key segment", "write a dotted key such as engine.port"));
    }
    Ok(Override {
        path: key.split('.').map(str::to_string).collect(),
        raw: value.to_string(),
        origin: Origin::Flag(format!("--set {key}")),
    })
}
