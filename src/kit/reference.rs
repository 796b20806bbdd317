//! `docs/configuration.md`, generated from the schema (a test keeps the file equal to this).

use std::fmt::Write;

use serde_json::Value as Json;

use super::shape::{Field, Shape};

/// The kit reference as Markdown.
#[must_use]
pub fn markdown(shape: &Shape) -> String {
    let mut out = String::from(
        "# Launch-kit reference\n\n\
         Generated from the schema in `src/kit/schema.rs` (`cargo test` fails if this file drifts;\n\
         regenerate with `SPARK_KIT_TEST_BLESS=1 cargo test --test cli kit_reference::`).\n\n\
         Every key can be set in a kit file, by an environment variable `SPARK_KIT_<KEY>` with `__`\n\
         between levels (`SPARK_KIT_ENGINE__PORT=9999`), or by `--set key=value` (dotted key).\n\
         Precedence, lowest first: built-in defaults < kit file < environment < flags.\n\
         `spark-kit config --explain` shows every effective value and where it came from.\n\
         Byte sizes accept `2684354560`, `512MiB`, `2.5GiB`, `10GB`. Unknown keys are errors.\n\n\
         | key | type | default | meaning |\n|---|---|---|---|\n",
    );
    rows(shape, "", None, &mut out);
    out
}

fn rows(shape: &Shape, prefix: &str, _default: Option<&Json>, out: &mut String) {
    if let Shape::Object(fields) = shape {
        for (name, field) in fields {
            let key = if prefix.is_empty() { name.clone() } else { format!("{prefix}.{name}") };
            row(&key, field, out);
            match &field.shape {
                Shape::Object(_) => rows(&field.shape, &key, field.default.as_ref(), out),
                Shape::List(inner) if matches!(**inner, Shape::Object(_)) => {
                    rows(inner, &format!("{key}[]"), None, out)
                }
                _ => {}
            }
        }
    }
}

fn row(key: &str, field: &Field, out: &mut String) {
    let ty = match &field.shape {
        Shape::Object(_) => "section".to_string(),
        s if field.nullable => format!("{} (optional)", s.type_name()),
        s => s.type_name(),
    };
    let default = match (&field.shape, &field.default) {
        (Shape::Object(_), _) | (_, None) => String::new(),
        (_, Some(Json::String(s))) if s.is_empty() => "\"\"".into(),
        (_, Some(d)) => format!("`{d}`"),
    };
    let doc = field.doc.replace('\n', " ").replace('|', "\\|");
    // Writing to a String cannot fail.
    let _ = writeln!(out, "| `{key}` | {} | {} | {doc} |", ty.replace('|', "\\|"), default.replace('|', "\\|"));
}
