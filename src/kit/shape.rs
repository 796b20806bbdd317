//! The kit's shape, derived once from its JSON schema: which keys exist, their types and docs.
//!
//! Used to reject unknown keys (with a suggestion), to type values given as strings
//! (environment, `--set`) and to generate `docs/configuration.md`.

use std::collections::BTreeMap;

use serde_json::Value as Json;

/// The type of one kit value.
#[derive(Debug, Clone, PartialEq)]
pub enum Shape {
    /// A struct: a closed set of keys.
    Object(BTreeMap<String, Field>),
    /// A free-form map from string keys to values of one shape.
    Map(Box<Shape>),
    /// A list of values of one shape.
    List(Box<Shape>),
    /// A leaf value.
    Scalar(Scalar),
}

/// A key of a struct.
#[derive(Debug, Clone, PartialEq)]
pub struct Field {
    pub shape: Shape,
    /// `null` is allowed (optional value).
    pub nullable: bool,
    pub doc: String,
    /// The default written in the schema (from the `Default` impls).
    pub default: Option<Json>,
}

/// Leaf types.
#[derive(Debug, Clone, PartialEq)]
pub enum Scalar {
    String,
    Integer,
    Number,
    Boolean,
    Bytes,
    /// One of these strings.
    Enum(Vec<String>),
}

impl Scalar {
    /// Human name of the type, as shown in docs and errors.
    #[must_use]
    pub fn name(&self) -> String {
        match self {
            Self::String => "string".into(),
            Self::Integer => "integer".into(),
            Self::Number => "number".into(),
            Self::Boolean => "boolean".into(),
            Self::Bytes => "byte size".into(),
            Self::Enum(v) => format!("one of {}", v.join(" | ")),
        }
    }
}

impl Shape {
    /// Human name of the type.
    #[must_use]
    pub fn type_name(&self) -> String {
        match self {
            Self::Object(_) => "section".into(),
            Self::Map(v) => format!("map of {}", v.type_name()),
            Self::List(v) => format!("list of {}", v.type_name()),
            Self::Scalar(s) => s.name(),
        }
    }

    /// The shape reached by following `path` from here; `None` if a segment does not exist.
    #[must_use]
    pub fn at(&self, path: &[String]) -> Option<&Shape> {
        let Some((first, rest)) = path.split_first() else {
            return Some(self);
        };
        match self {
            Self::Object(fields) => fields.get(first)?.shape.at(rest),
            Self::Map(v) => v.at(rest),
            Self::List(v) if first.parse::<usize>().is_ok() => v.at(rest),
            _ => None,
        }
    }
}

/// Why the schema could not be turned into a shape (a bug in the schema, caught by tests).
#[derive(Debug, thiserror::Error)]
#[error("kit schema at {at}: {what}")]
pub struct ShapeError {
    at: String,
    what: String,
}

/// Build the shape from a JSON schema document (as produced by `schemars`).
pub fn from_schema(root: &Json) -> Result<Shape, ShapeError> {
    let defs = root.get("$defs").cloned().unwrap_or(Json::Null);
    convert(root, &defs, "$").map(|(shape, _)| shape)
}

fn err(at: &str, what: impl Into<String>) -> ShapeError {
    ShapeError { at: at.to_string(), what: what.into() }
}

fn resolve<'a>(node: &'a Json, defs: &'a Json, at: &str) -> Result<&'a Json, ShapeError> {
    match node.get("$ref").and_then(Json::as_str) {
        Some(r) => {
            let name = r.strip_prefix("#/$defs/").ok_or_else(|| err(at, format!("unsupported $ref {r}")))?;
            defs.get(name).ok_or_else(|| err(at, format!("missing definition {name}")))
        }
        None => Ok(node),
    }
}

/// Returns the shape and whether `null` is allowed.
fn convert(node: &Json, defs: &Json, at: &str) -> Result<(Shape, bool), ShapeError> {
    let node = resolve(node, defs, at)?;
    if let Some(any) = node.get("anyOf").and_then(Json::as_array) {
        let non_null: Vec<&Json> =
            any.iter().filter(|v| v.get("type").and_then(Json::as_str) != Some("null")).collect();
        if non_null.len() != 1 {
            return Err(err(at, "anyOf must be one type plus null"));
        }
        let (shape, _) = convert(non_null[0], defs, at)?;
        return Ok((shape, any.len() > 1));
    }
    if let Some(one) = node.get("oneOf").and_then(Json::as_array) {
        let values = one
            .iter()
            .map(|v| v.get("const").and_then(Json::as_str).map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| err(at, "oneOf must list string constants"))?;
        return Ok((Shape::Scalar(Scalar::Enum(values)), false));
    }
    if let Some(values) = node.get("enum").and_then(Json::as_array) {
        let values = values
            .iter()
            .map(|v| v.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| err(at, "enum must list strings"))?;
        return Ok((Shape::Scalar(Scalar::Enum(values)), false));
    }
    if node.get("format").and_then(Json::as_str) == Some("byte-size") {
        return Ok((Shape::Scalar(Scalar::Bytes), false));
    }
    let (ty, nullable) = match node.get("type") {
        Some(Json::String(t)) => (t.as_str(), false),
        Some(Json::Array(ts)) => {
            let names: Vec<&str> = ts.iter().filter_map(Json::as_str).filter(|t| *t != "null").collect();
            if names.len() != 1 {
                return Err(err(at, "a type list must be one type plus null"));
            }
            (names[0], ts.len() > 1)
        }
        _ => return Err(err(at, "no type")),
    };
    let shape = match ty {
        "object" => {
            if let Some(props) = node.get("properties").and_then(Json::as_object) {
                let mut fields = BTreeMap::new();
                for (key, sub) in props {
                    let here = format!("{at}.{key}");
                    let (shape, nullable) = convert(sub, defs, &here)?;
                    let doc = sub.get("description").and_then(Json::as_str).unwrap_or_default().to_string();
                    if doc.is_empty() {
                        return Err(err(&here, "undocumented key: add a doc comment"));
                    }
                    fields.insert(key.clone(), Field { shape, nullable, doc, default: sub.get("default").cloned() });
                }
                Shape::Object(fields)
            } else {
                let values = node.get("additionalProperties").ok_or_else(|| err(at, "object without properties"))?;
                Shape::Map(Box::new(convert(values, defs, at)?.0))
            }
        }
        "array" => {
            let items = node.get("items").ok_or_else(|| err(at, "array without items"))?;
            Shape::List(Box::new(convert(items, defs, &format!("{at}[]"))?.0))
        }
        "string" => Shape::Scalar(Scalar::String),
        "integer" => Shape::Scalar(Scalar::Integer),
        "number" => Shape::Scalar(Scalar::Number),
        "boolean" => Shape::Scalar(Scalar::Boolean),
        other => return Err(err(at, format!("unsupported type {other}"))),
    };
    Ok((shape, nullable))
}

/// The shape of the launch kit.
pub fn kit_shape() -> Result<Shape, ShapeError> {
    let schema = schemars::schema_for!(super::schema::Kit);
    from_schema(schema.as_value())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kit_schema_converts() {
        let shape = kit_shape().unwrap();
        let port = shape.at(&["engine".into(), "port".into()]).unwrap();
        assert_eq!(port, &Shape::Scalar(Scalar::Integer));
        let host = shape.at(&["nodes".into(), "0".into(), "ssh_host".into()]).unwrap();
        assert_eq!(host, &Shape::Scalar(Scalar::String));
        let env = shape.at(&["engine".into(), "extra_env".into(), "ANY".into()]).unwrap();
        assert_eq!(env, &Shape::Scalar(Scalar::String));
        assert!(shape.at(&["engine".into(), "prot".into()]).is_none());
        let kv = shape.at(&["engine".into(), "kv_cache_bytes".into()]).unwrap();
        assert_eq!(kv, &Shape::Scalar(Scalar::Bytes));
        let role = shape.at(&["nodes".into(), "0".into(), "role".into()]).unwrap();
        assert_eq!(role, &Shape::Scalar(Scalar::Enum(vec!["head".into(), "worker".into()])));
    }
}
