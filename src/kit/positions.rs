//! Where each key of a YAML document is written (line and column), by dotted path.
//!
//! `serde_yaml` values carry no positions, so errors and `config --explain` look positions up
//! here. Mapping keys map to the key's position; list items to the item's position.

use std::collections::BTreeMap;

use saphyr_parser::{Event, Parser, Span};

/// 1-based line and column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pos {
    pub line: usize,
    pub col: usize,
}

/// Dotted path (`engine.port`, `nodes.0.name`) → position.
pub type Positions = BTreeMap<String, Pos>;

/// A YAML syntax error with its position.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{line}:{col}: {msg}")]
pub struct SyntaxError {
    pub line: usize,
    pub col: usize,
    pub msg: String,
}

enum Frame {
    Map { key: Option<String> },
    Seq { index: usize },
}

fn pos(span: Span) -> Pos {
    Pos { line: span.start.line(), col: span.start.col() + 1 }
}

fn join(path: &[String], last: &str) -> String {
    if path.is_empty() {
        last.to_string()
    } else {
        format!("{}.{last}", path.join("."))
    }
}

/// Scan `text` and record the position of every key and list item.
pub fn scan(text: &str) -> Result<Positions, SyntaxError> {
    let mut out = Positions::new();
    let mut stack: Vec<Frame> = Vec::new();
    let mut path: Vec<String> = Vec::new();
    let mut parser = Parser::new_from_str(text);
    while let Some(item) = parser.next_event() {
        let (event, span) = item.map_err(|e| SyntaxError {
            line: e.marker().line(),
            col: e.marker().col() + 1,
            msg: e.info().to_string(),
        })?;
        match event {
            Event::Scalar(value, ..) => match stack.last_mut() {
                Some(Frame::Map { key }) => {
                    if key.is_none() {
                        out.insert(join(&path, &value), pos(span));
                        *key = Some(value.into_owned());
                    } else {
                        *key = None;
                    }
                }
                Some(Frame::Seq { index }) => {
                    out.insert(join(&path, &index.to_string()), pos(span));
                    *index += 1;
                }
                None => {}
            },
            Event::MappingStart(..) | Event::SequenceStart(..) => {
                match stack.last() {
                    Some(Frame::Map { key: Some(k) }) => path.push(k.clone()),
                    Some(Frame::Seq { index }) => {
                        out.insert(join(&path, &index.to_string()), pos(span));
                        path.push(index.to_string());
                    }
                    // A container as a mapping key is not used in kits; track it so nesting stays right.
                    Some(Frame::Map { key: None }) => path.push(String::from("?")),
                    None => {}
                }
                let frame = if matches!(event, Event::MappingStart(..)) {
                    Frame::Map { key: None }
                } else {
                    Frame::Seq { index: 0 }
                };
                stack.push(frame);
            }
            Event::MappingEnd | Event::SequenceEnd => {
                stack.pop();
                if !stack.is_empty() {
                    path.pop();
                }
                match stack.last_mut() {
                    Some(Frame::Map { key }) => *key = None,
                    Some(Frame::Seq { index }) => *index += 1,
                    None => {}
                }
            }
            Event::Alias(_) => match stack.last_mut() {
                Some(Frame::Map { key }) => *key = None,
                Some(Frame::Seq { index }) => *index += 1,
                None => {}
            },
            _ => {}
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_keys_and_items() {
        let text = "name: x\nengine:\n  port: 8888\n  extra_args: [--a, --b]\nnodes:\n  - name: a\n    role: head\n  - name: b\n";
        let p = scan(text).unwrap();
        assert_eq!(p["name"], Pos { line: 1, col: 1 });
        assert_eq!(p["engine.port"], Pos { line: 3, col: 3 });
        assert_eq!(p["engine.extra_args.1"].line, 4);
        assert_eq!(p["nodes.0"], Pos { line: 6, col: 5 });
        assert_eq!(p["nodes.0.role"], Pos { line: 7, col: 5 });
        assert_eq!(p["nodes.1.name"], Pos { line: 8, col: 5 });
    }

    #[test]
    fn syntax_error_has_position() {
        let e = scan("a: [1, 2\nb: 3\n").unwrap_err();
        assert!(e.line >= 1, "{e}");
    }
}
