//! Every effective setting with its origin (`spark-kit config --explain`).

use serde::Serialize;
use serde_json::Value as Json;

use super::shape::Shape;
use super::Resolved;

/// One effective setting.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    /// Dotted key, list items by index (`nodes.0.name`).
    pub key: String,
    pub value: Json,
    /// `default`, `<kit file>:<line>:<col>`, `env NAME` or `flag --x`.
    pub origin: String,
}

/// Flatten the effective kit into rows, sorted by key.
pub fn rows(r: &Resolved) -> Result<Vec<Row>, serde_json::Error> {
    let value = serde_json::to_value(&r.kit)?;
    let mut out = Vec::new();
    flatten(&value, &r.shape, &mut Vec::new(), &mut |key, v| {
        let origin = r.layered.origin_of(&key).to_string();
        out.push(Row { key, value: v.clone(), origin });
    });
    Ok(out)
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
