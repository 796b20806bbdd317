//! Every effective setting with its origin (`spark-kit config --explain`).

use serde::Serialize;
use serde_json::Value as Json;

use super::bytes::ByteSize;
use super::shape::{Scalar, Shape};
use super::Resolved;

/// One effective setting.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    /// Dotted key, list items by index (`nodes.0.name`).
    pub key: String,
    pub value: Json,
    /// `default`, `<kit file>:<line>:<col>`, `env NAME` or `flag --x`.
    pub origin: String,
    /// A byte size as its layer wrote it (`12GiB`; a plain number or a default in binary
    /// units), for people; `value` stays the number of bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub written: Option<String>,
}

/// Flatten the effective kit into rows, sorted by key.
pub fn rows(r: &Resolved) -> Result<Vec<Row>, serde_json::Error> {
    let value = serde_json::to_value(&r.kit)?;
    let mut out = Vec::new();
    flatten(&value, &r.shape, &mut Vec::new(), &mut |key, v| {
        let origin = r.layered.origin_of(&key).to_string();
        let path: Vec<String> = key.split('.').map(str::to_string).collect();
        let written = match r.shape.at(&path) {
            Some(Shape::Scalar(Scalar::Bytes)) => as_written(&r.layered.value, &path, v),
            _ => None,
        };
        out.push(Row { key, value: v.clone(), origin, written });
    });
    Ok(out)
}

/// The layered (as written) value of a byte-size key: its text, or the number in binary units.
fn as_written(layered: &serde_yaml::Value, path: &[String], effective: &Json) -> Option<String> {
    let mut cur = layered;
    for seg in path {
        cur = match cur {
            serde_yaml::Value::Sequence(items) => items.get(seg.parse::<usize>().ok()?)?,
            other => other.get(seg.as_str())?,
        };
    }
    match cur {
        serde_yaml::Value::String(s) => Some(s.trim().to_string()),
        _ => effective.as_u64().map(|n| ByteSize(n).to_string()),
    }
}

fn flatten(v: &Json, shape: &Shape, path: &mut Vec<String>, emit: &mut dyn FnMut(String, &Json)) {
    match (v, shape) {
        (Json::Object(m), Shape::Object(fields)) => {
            for (name, field) in fields {
                path.push(name.clone());
                flatten(m.get(name).unwrap_or(&Json::Null), &field.shape, path, emit);
                path.pop();
            }
        }
        (Json::Object(m), Shape::Map(inner)) if !m.is_empty() => {
            for (k, sub) in m {
                path.push(k.clone());
                flatten(sub, inner, path, emit);
                path.pop();
            }
        }
        (Json::Array(items), Shape::List(inner)) if !items.is_empty() && matches!(**inner, Shape::Object(_)) => {
            for (i, sub) in items.iter().enumerate() {
                path.push(i.to_string());
                flatten(sub, inner, path, emit);
                path.pop();
            }
        }
        _ => emit(path.join("."), v),
    }
}
