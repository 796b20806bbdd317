//! The whiteboard in docs/architecture.md, enforced: who may import whom among the modules of
//! `src/` and no cycle among the top-level modules.
//!
//! Every `use crate::…` / `use super::…` tree and every inline `crate::x::…` / `super::x::…` path
//! in `src/**/*.rs` (comments and string literals removed first) becomes an arrow from the file's
//! module to the module it names. The rules are checked on those arrows; each failure names the
//! file and line of the import. (tests/rules/source_rules.rs: file sizes and terminal writes.)

use crate::source_scan;

use std::collections::{BTreeMap, BTreeSet};

use source_scan::{is_ident, sources, strip};

/// One import: the file's module path, the imported path (absolute, from the crate root), where.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Arrow {
    from: Vec<String>,
    to: Vec<String>,
    file: String,
    line: usize,
}

/// The module path of a file under `src/`: `a/b.rs` → `[a, b]`, `a/mod.rs` → `[a]`, `lib.rs` → `[]`.
fn module_of(rel: &str) -> Vec<String> {
    let stem = rel.strip_suffix(".rs").unwrap_or(rel);
    let mut parts: Vec<String> = stem.split('/').map(str::to_string).collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib" | "main")) {
        parts.pop();
    }
    parts
}

/// The paths a `use` tree names: `a::{b, c::{d as e, self}}` → `[a,b]`, `[a,c,d]`, `[a,c]`.
fn use_paths(tree: &str) -> Vec<Vec<String>> {
    fn parse(s: &[char], i: &mut usize, prefix: &[String], out: &mut Vec<Vec<String>>) {
        let mut path = prefix.to_vec();
        loop {
            skip_ws(s, i);
            if *i < s.len() && s[*i] == '{' {
                *i += 1;
                loop {
                    skip_ws(s, i);
                    if *i >= s.len() || s[*i] == '}' {
                        *i += 1;
                        return;
                    }
                    parse(s, i, &path, out);
                    skip_ws(s, i);
                    if *i < s.len() && s[*i] == ',' {
                        *i += 1;
                    }
                }
            }
            let start = *i;
            while *i < s.len() && (s[*i].is_alphanumeric() || s[*i] == '_' || s[*i] == '*') {
                *i += 1;
            }
            let seg: String = s[start..*i].iter().collect();
            if seg.is_empty() {
                return;
            }
            if seg != "self" && seg != "*" {
                path.push(seg);
            }
            skip_ws(s, i);
            if s.get(*i) == Some(&':') && s.get(*i + 1) == Some(&':') {
                *i += 2;
                continue;
            }
            // `as name`: the rename does not change what is imported.
            let rest: String = s[*i..].iter().take(3).collect();
            if rest.starts_with("as ") {
                *i += 3;
                skip_ws(s, i);
                while *i < s.len() && (s[*i].is_alphanumeric() || s[*i] == '_') {
                    *i += 1;
                }
            }
            out.push(path);
            return;
        }
    }
    fn skip_ws(s: &[char], i: &mut usize) {
        while *i < s.len() && s[*i].is_whitespace() {
            *i += 1;
        }
    }
    let s: Vec<char> = tree.chars().collect();
    let mut out = Vec::new();
    parse(&s, &mut 0, &[], &mut out);
    out
}

/// A path as written in `module` made absolute: `crate::a` → `[a]`, `super::b` from `[x, y]` → `[x, b]`.
/// `None` for paths that do not start at the crate (external crates, std, local names).
fn absolute(module: &[String], path: &[String]) -> Option<Vec<String>> {
    let mut base: Vec<String> = match path.first().map(String::as_str) {
        Some("crate") => Vec::new(),
        Some("super" | "self") => module.to_vec(),
        _ => return None,
    };
    let mut rest = if path[0] == "crate" { &path[1..] } else { path };
    while let Some(first) = rest.first() {
        match first.as_str() {
            "super" => {
                base.pop()?;
            }
            "self" => {}
            _ => break,
        }
        rest = &rest[1..];
    }
    base.extend(rest.iter().cloned());
    Some(base)
}

/// The inline modules of a file (`mod tests { … }`) as `(start, end, name)` byte spans.
fn inline_mods(code: &str) -> Vec<(usize, usize, String)> {
    let bytes = code.as_bytes();
    let mut spans = Vec::new();
    let mut open: Vec<(usize, usize, String)> = Vec::new(); // (start, brace depth inside, name)
    let mut depth = 0usize;
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'{' => depth += 1,
            b'}' => {
                if open.last().is_some_and(|o| o.1 == depth) {
                    if let Some((start, _, name)) = open.pop() {
                        spans.push((start, i, name));
                    }
                }
                depth = depth.saturating_sub(1);
            }
            b'm' if code[i..].starts_with("mod ") && (i == 0 || !is_ident(bytes[i - 1])) => {
                let rest = &code[i + 4..];
                let name: String = rest.trim_start().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                let after = rest.trim_start()[name.len()..].trim_start();
                if !name.is_empty() && after.starts_with('{') {
                    open.push((i, depth + 1, name));
                }
            }
            _ => {}
        }
        i += 1;
    }
    spans
}

/// Every arrow out of one file (already stripped of comments and strings).
fn arrows_of(rel: &str, code: &str) -> Vec<Arrow> {
    let file_module = module_of(rel);
    let mods = inline_mods(code);
    let module_at = |pos: usize| {
        let mut m = file_module.clone();
        m.extend(mods.iter().filter(|(s, e, _)| *s <= pos && pos <= *e).map(|(_, _, n)| n.clone()));
        m
    };
    let line_at = |pos: usize| code[..pos].matches('\n').count() + 1;
    let mut out = Vec::new();
    let mut push = |path: &[String], pos: usize| {
        if let Some(to) = absolute(&module_at(pos), path) {
            if !to.is_empty() {
                out.push(Arrow { from: file_module.clone(), to, file: format!("src/{rel}"), line: line_at(pos) });
            }
        }
    };
    // `use` trees (also `pub use`, `pub(crate) use`); blanked afterwards so the inline scan skips them.
    let bytes = code.as_bytes();
    let mut rest = code.to_string().into_bytes();
    let mut from = 0;
    while let Some(k) = code[from..].find("use ") {
        let at = from + k;
        from = at + 4;
        if at > 0 && is_ident(bytes[at - 1]) {
            continue;
        }
        let Some(end) = code[at..].find(';') else { break };
        let tree = &code[at + 4..at + end];
        if tree.contains('=') || tree.contains('(') {
            continue;
        }
        for p in use_paths(tree) {
            push(&p, at);
        }
        for b in &mut rest[at..at + end] {
            if *b != b'\n' {
                *b = b' ';
            }
        }
    }
    // Inline paths: `crate::a::b`, `super::a`, `super::super::a`.
    let inline = String::from_utf8_lossy(&rest).into_owned();
    let b = inline.as_bytes();
    let mut i = 0;
    while i < inline.len() {
        let tail = &inline[i..];
        let starts = tail.starts_with("crate::") || tail.starts_with("super::");
        if starts && (i == 0 || !(is_ident(b[i - 1]) || b[i - 1] == b':')) {
            let len = tail.find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':')).unwrap_or(tail.len());
            let path: Vec<String> = tail[..len].split("::").filter(|s| !s.is_empty()).map(str::to_string).collect();
            push(&path, i);
            i += len.max(1);
        } else {
            i += tail.chars().next().map_or(1, char::len_utf8);
        }
    }
    out
}

/// The command files: the modules `commands::run` dispatches to (`… => name::fn(…)`).
fn command_files(dispatcher: &str) -> BTreeSet<String> {
    let declared: BTreeSet<&str> =
        dispatcher.lines().filter_map(|l| l.trim().strip_prefix("pub mod")?.trim().strip_suffix(';')).collect();
    let mut out = BTreeSet::new();
    for arm in dispatcher.split("=>").skip(1) {
        let name: String = arm.trim_start().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        if declared.contains(name.as_str()) && arm.trim_start()[name.len()..].starts_with("::") {
            out.insert(name);
        }
    }
    out
}

/// What the deployment layer (src/deploy/) may import: it sits under everything that reads it.
const DEPLOY_IMPORTS: [&str; 3] = ["deploy", "kit", "dirs"];

/// Leaf modules: pure, shared by several layers, importing nothing of the crate. `sse` is the one
/// SSE parser that `bench` (timing the events) and `gateway` (passing them on) both use.
const LEAVES: [&str; 2] = ["sse", "cancel"];

/// The rules of docs/architecture.md "Who may import whom"; one message per broken rule.
fn check(arrows: &[Arrow], commands: &BTreeSet<String>) -> Vec<String> {
    let mut bad = Vec::new();
    let at = |a: &Arrow| format!("{}:{} ({} → {})", a.file, a.line, a.from.join("::"), a.to.join("::"));
    let top = |p: &[String]| p.first().cloned().unwrap_or_default();
    for a in arrows {
        let (f, t) = (top(&a.from), top(&a.to));
        let forbidden = match (f.as_str(), t.as_str()) {
            ("cluster", "supervisor" | "agent") => Some("the wire (cluster/) imports no side"),
            ("agent", "supervisor") | ("supervisor", "agent") => Some("head and node meet only on the wire"),
            (_, "commands") if f != "commands" && !a.from.is_empty() => Some("library modules never import commands"),
            ("deploy", t) if !DEPLOY_IMPORTS.contains(&t) => {
                Some("deploy/ is the bottom layer: it imports only kit and dirs")
            }
            ("runtime", "agent" | "supervisor" | "cluster" | "node") => {
                Some("runtime/ runs the engine on a node: it imports neither side, the wire nor preflight (node/)")
            }
            ("engine", "runtime") => Some("engine/ is the vLLM process under the runtimes: it never picks one"),
            (f, t) if LEAVES.contains(&f) && t != f => Some("a leaf module (sse) imports nothing of the crate"),
            ("gateway", "bench") | ("bench", "gateway") => {
                Some("bench and gateway share only the sse leaf, never each other's code")
            }
            _ => None,
        };
        if let Some(why) = forbidden {
            bad.push(format!("{}: {why}", at(a)));
        }
        if f == "commands" && t == "commands" {
            let own = a.from.get(1);
            if let Some(target) = a.to.get(1) {
                if commands.contains(target) && own != Some(target) && a.from.len() > 1 {
                    bad.push(format!("{}: a command file does not import another command", at(a)));
                }
            }
        }
    }
    bad.extend(cycles(arrows));
    bad
}

/// One message per cycle among the top-level modules (strongly connected component), naming an
/// import for each arrow of the cycle.
fn cycles(arrows: &[Arrow]) -> Vec<String> {
    let mut edges: BTreeMap<String, BTreeMap<String, &Arrow>> = BTreeMap::new();
    for a in arrows {
        let (Some(f), Some(t)) = (a.from.first(), a.to.first()) else { continue };
        if f != t {
            edges.entry(f.clone()).or_default().entry(t.clone()).or_insert(a);
        }
    }
    let nodes: BTreeSet<String> = edges.keys().cloned().chain(edges.values().flat_map(|m| m.keys().cloned())).collect();
    let reach = |from: &str| {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from.to_string()];
        while let Some(n) = stack.pop() {
            for t in edges.get(&n).into_iter().flat_map(BTreeMap::keys) {
                if seen.insert(t.clone()) {
                    stack.push(t.clone());
                }
            }
        }
        seen
    };
    let reach: BTreeMap<&String, BTreeSet<String>> = nodes.iter().map(|n| (n, reach(n))).collect();
    let mut done = BTreeSet::new();
    let mut out = Vec::new();
    for n in &nodes {
        if done.contains(n) || !reach[n].contains(n) {
            continue;
        }
        let scc: BTreeSet<String> =
            nodes.iter().filter(|m| reach[n].contains(*m) && reach[*m].contains(n)).cloned().collect();
        let mut lines =
            vec![format!("cycle among top-level modules: {}", scc.iter().cloned().collect::<Vec<_>>().join(", "))];
        for f in &scc {
            for (t, a) in edges.get(f).into_iter().flatten() {
                if scc.contains(t) {
                    lines.push(format!("    {f} → {t}: {}:{}", a.file, a.line));
                }
            }
        }
        out.push(lines.join("\n"));
        done.extend(scc);
    }
    out
}

fn all_arrows() -> (Vec<Arrow>, BTreeSet<String>) {
    let mut arrows = Vec::new();
    let mut commands = BTreeSet::new();
    for (rel, src) in sources() {
        let code = strip(&src);
        if rel == "commands/mod.rs" {
            commands = command_files(&code);
        }
        arrows.extend(arrows_of(&rel, &code));
    }
    (arrows, commands)
}

#[test]
fn imports_follow_the_architecture_rules() {
    let (arrows, commands) = all_arrows();
    assert!(arrows.len() > 100, "the scan found only {} imports: the parser is broken", arrows.len());
    assert!(commands.len() > 10, "found only {} command files in commands/mod.rs: {commands:?}", commands.len());
    let bad = check(&arrows, &commands);
    assert!(bad.is_empty(), "forbidden imports (docs/architecture.md, \"Who may import whom\"):\n{}", bad.join("\n"));
}

// The checker itself, on made-up files: each rule fires on its violation.

fn arrows(files: &[(&str, &str)]) -> Vec<Arrow> {
    files.iter().flat_map(|(rel, src)| arrows_of(rel, &strip(src))).collect()
}

fn cmds() -> BTreeSet<String> {
    command_files("pub mod up;\npub mod verify;\npub mod load;\nmatch c { A => up::run(a), B => verify::run(b) }")
}

#[test]
fn use_trees_and_inline_paths_are_resolved() {
    let a = arrows(&[(
        "commands/up.rs",
        "use super::{load, Context};\nuse crate::{kit::Kit, supervisor::{self, run as r}};\nfn f() { crate::engine::x(); super::super::hex::encode(b); }",
    )]);
    let to: Vec<String> = a.iter().map(|a| a.to.join("::")).collect();
    assert_eq!(
        to,
        [
            "commands::load",
            "commands::Context",
            "kit::Kit",
            "supervisor",
            "supervisor::run",
            "engine::x",
            "hex::encode"
        ]
    );
    assert_eq!(a[5].line, 3);
}

#[test]
fn comments_and_strings_are_not_imports() {
    let a = arrows(&[(
        "cluster/x.rs",
        "// use crate::supervisor;\n/* crate::agent::x */ const S: &str = \"crate::agent::run\"; const R: &str = r#\"crate::agent\"#; fn f<'a>(c: char) -> bool { c == '\"' }",
    )]);
    assert!(a.is_empty(), "{a:?}");
}

#[test]
fn the_wire_importing_a_side_is_refused() {
    let bad = check(&arrows(&[("cluster/push.rs", "use crate::supervisor::run;")]), &cmds());
    assert_eq!(bad.len(), 1, "{bad:?}");
    assert!(bad[0].contains("src/cluster/push.rs:1") && bad[0].contains("imports no side"), "{bad:?}");
}

#[test]
fn head_and_node_importing_each_other_is_refused() {
    let bad = check(
        &arrows(&[("agent/run.rs", "fn f() { crate::supervisor::x(); }"), ("supervisor/run.rs", "use crate::agent;")]),
        &cmds(),
    );
    assert_eq!(bad.len(), 3, "two arrows and their cycle: {bad:?}");
    assert!(bad[2].starts_with("cycle among top-level modules: agent, supervisor"), "{bad:?}");
}

#[test]
fn a_command_importing_another_command_is_refused_but_helpers_are_not() {
    let files = [
        ("commands/up.rs", "use super::{load, Context};\nuse super::verify::size;"),
        ("commands/load.rs", "use super::verify::size;"),
        ("commands/verify.rs", "use super::load;\nfn f() { super::verify::g(); }"),
    ];
    let bad = check(&arrows(&files), &cmds());
    assert_eq!(bad.len(), 2, "{bad:?}");
    assert!(bad[0].contains("src/commands/up.rs:2"), "{bad:?}");
    assert!(bad[1].contains("src/commands/load.rs:1"), "{bad:?}");
}

#[test]
fn a_cycle_of_three_is_found() {
    let files = [
        ("engine/a.rs", "use crate::node::x;"),
        ("node/a.rs", "use crate::weights::y;"),
        ("weights/a.rs", "use crate::engine::z;"),
    ];
    let bad = check(&arrows(&files), &cmds());
    assert_eq!(bad.len(), 1, "{bad:?}");
    assert!(
        bad[0].contains("engine, node, weights") && bad[0].contains("weights → engine: src/weights/a.rs:1"),
        "{bad:?}"
    );
}

#[test]
fn the_sse_leaf_imports_nothing_and_bench_and_gateway_meet_only_there() {
    let files = [
        ("sse.rs", "use crate::bench::metrics;\nuse serde_json::Value;"),
        ("gateway/stream.rs", "use crate::sse::{parse_event, Aligner};\nuse crate::bench::sse::SseParser;"),
        ("bench/client.rs", "use crate::sse::Usage;\nfn f() { crate::gateway::framing::x(); }"),
    ];
    let bad = check(&arrows(&files), &cmds());
    assert_eq!(bad.len(), 4, "three arrows and their cycle: {bad:?}");
    assert!(bad[0].contains("src/sse.rs:1") && bad[0].contains("leaf"), "{bad:?}");
    assert!(bad[1].contains("src/gateway/stream.rs:2") && bad[1].contains("share only the sse leaf"), "{bad:?}");
    assert!(bad[2].contains("src/bench/client.rs:2"), "{bad:?}");
}

#[test]
fn the_deployment_layer_imports_only_kit_and_dirs() {
    let files = [
        ("deploy/hf.rs", "use crate::dirs::env_value;\nuse crate::kit::Kit;"),
        ("deploy/mod.rs", "use crate::engine::model;"),
    ];
    let bad = check(&arrows(&files), &cmds());
    assert_eq!(bad.len(), 1, "{bad:?}");
    assert!(bad[0].contains("src/deploy/mod.rs:1") && bad[0].contains("bottom layer"), "{bad:?}");
}

#[test]
fn the_runtimes_import_no_side_and_the_engine_no_runtime() {
    let files = [
        ("runtime/docker/mod.rs", "use crate::agent::run;"),
        ("engine/process.rs", "use crate::runtime::Runtime;"),
        ("runtime/venv/mod.rs", "fn f() { crate::node::facts::gather(p, r); }"),
    ];
    let bad = check(&arrows(&files), &cmds());
    assert_eq!(bad.len(), 3, "{bad:?}");
    assert!(bad[0].contains("src/runtime/docker/mod.rs:1") && bad[1].contains("src/engine/process.rs:1"), "{bad:?}");
    assert!(bad[2].contains("src/runtime/venv/mod.rs:1") && bad[2].contains("preflight (node/)"), "{bad:?}");
}

/// Where code outside `src/runtime/` (and the kit's own schema and checks) still decides by
/// `engine.runtime`: none since issue 28 item 3 (the runtime's room); everything else asks the
/// runtime `runtime::of` picks. The list may only stay empty: a new place fails.
const RUNTIME_BRANCHES_LEFT: [&str; 0] = [];

/// Whether code (comments and strings removed) decides by the runtime kind: names a variant of
/// the kit's `Runtime` enum, or reads `engine.runtime` or a setting of the docker runtime
/// (`engine.docker_image`, `engine.docker_mount_venv`: the runtime answers for them).
fn branches_on_runtime(code: &str) -> bool {
    let reads = |field: &str| {
        code.match_indices(field).any(|(i, m)| code.as_bytes().get(i + m.len()).is_none_or(|b| !is_ident(*b)))
    };
    let fields = ["engine.runtime", "engine.docker_image", "engine.docker_mount_venv"];
    fields.iter().any(|f| reads(f)) || code.contains("Runtime::Docker") || code.contains("Runtime::Venv")
}

#[test]
fn nothing_outside_the_runtime_choice_branches_on_engine_runtime() {
    let mut found = std::collections::BTreeSet::new();
    for (rel, src) in sources() {
        if rel.starts_with("runtime/") || rel.starts_with("kit/") {
            continue;
        }
        let code = strip(&src);
        let code = code.split("#[cfg(test)]").next().unwrap_or_default();
        if branches_on_runtime(code) {
            found.insert(rel);
        }
    }
    let left: std::collections::BTreeSet<String> = RUNTIME_BRANCHES_LEFT.iter().map(|s| (*s).to_string()).collect();
    let new: Vec<&String> = found.difference(&left).collect();
    assert!(new.is_empty(), "these branch on engine.runtime outside src/runtime/ (ask the runtime instead): {new:?}");
}

#[test]
fn a_branch_on_the_runtime_kind_is_seen() {
    for code in [
        "if kit.engine.runtime == Runtime::Docker { x() }",
        "match kit.engine.runtime { _ => 1 }",
        "let r = s.kit.engine.runtime;",
        "f(Runtime::Venv)",
        "let image = kit.engine.docker_image.clone();",
        "if !s.kit.engine.docker_mount_venv { x() }",
    ] {
        assert!(branches_on_runtime(&strip(code)), "not seen: {code}");
    }
    for code in [
        "crate::runtime::of(kit).image(kit)",
        "// engine.runtime == Runtime::Docker",
        "let s = \"engine.runtime: venv\";",
        "kit.engine.runtime_x",
    ] {
        assert!(!branches_on_runtime(&strip(code)), "seen where there is none: {code}");
    }
}

#[test]
fn library_modules_never_import_commands() {
    let bad = check(&arrows(&[("live.rs", "use crate::commands::Context;")]), &cmds());
    assert_eq!(bad.len(), 1, "{bad:?}");
}
