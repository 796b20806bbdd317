//! Rules over the source files themselves: none longer than 600 lines (src/ and tests/), and no
//! library file writing to the process's stdout / stderr except the reporter.

use crate::source_scan;

use std::path::Path;

use source_scan::{is_ident, rs_files, sources, strip};

/// Longest a source file may be.
const MAX_LINES: usize = 600;

/// Files that may write to the process's stdout / stderr: the reporter and the agent's protocol
/// channel (`spark-kit node` speaks JSON lines on stdout).
const TERMINAL_FILES: &[&str] = &["reporter/mod.rs", "commands/node.rs"];

/// Where `code` writes to the terminal directly: `io::stdout()` / `io::stderr()` or a print macro.
fn terminal_writes(code: &str) -> Vec<usize> {
    let needles = ["io::stdout()", "io::stderr()", "println!", "eprintln!", "print!", "eprint!", "dbg!"];
    code.lines()
        .enumerate()
        .filter(|(_, l)| {
            needles.iter().any(|n| {
                l.match_indices(n).any(|(i, _)| i == 0 || !is_ident(l.as_bytes()[i - 1]) || n.starts_with("io::"))
            })
        })
        .map(|(i, _)| i + 1)
        .collect()
}

#[test]
fn only_the_reporter_writes_to_the_terminal() {
    let mut bad = Vec::new();
    for (rel, src) in sources() {
        if TERMINAL_FILES.contains(&rel.as_str()) {
            continue;
        }
        bad.extend(terminal_writes(&strip(&src)).into_iter().map(|l| format!("src/{rel}:{l}")));
    }
    assert!(
        bad.is_empty(),
        "library code writes to stdout/stderr (use the writer a command is given, or src/reporter/): {}",
        bad.join(", ")
    );
}

#[test]
fn terminal_writes_are_found_outside_comments_and_strings() {
    let code = strip(
        "// println!(\"x\")\nlet s = \"eprintln!\";\nlet _ = writeln!(std::io::stderr(), \"{s}\");\nprintln!(\"y\");",
    );
    assert_eq!(terminal_writes(&code), [3, 4]);
}

#[test]
fn no_source_file_is_longer_than_600_lines() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = rs_files(&root.join("src"));
    files.extend(rs_files(&root.join("tests")));
    assert!(files.len() > 100);
    let long: Vec<String> = files
        .iter()
        .filter_map(|p| {
            let n = std::fs::read_to_string(p).ok()?.lines().count();
            (n > MAX_LINES).then(|| format!("{} ({n} lines)", p.strip_prefix(root).unwrap_or(p).display()))
        })
        .collect();
    assert!(long.is_empty(), "files over {MAX_LINES} lines (split them by concern): {}", long.join(", "));
}
