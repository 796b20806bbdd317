//! The environment-variable registry (`src/envvars.rs`) stays true: docs/configuration.md's
//! "Environment variables" section is generated from it, every variable `src/` (or build.rs) or the
//! shipped Python overlay (`python_overlay/spark_overlay`, `python_overlay/tools`) names is in it,
//! and every entry is still named somewhere in them. The overlay's own tests
//! (`python_overlay/tests`) are left out, as `#[cfg(test)]` items are in Rust.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use spark_kit::envvars::{self, VARS};

/// Names that look like environment variables: these families, and a few classic single words.
const FAMILIES: &[&str] = &[
    "SPARK_",
    "SPARKKIT_",
    "HF_",
    "HUGGING_FACE_",
    "TRANSFORMERS_",
    "VLLM_",
    "DOCKER_",
    "NCCL_",
    "GLOO_",
    "XDG_",
    "CUDA_",
    "NVIDIA_",
    "PYTHON",
    "PYO3_",
    "TORCH",
    "OMP_",
    "LD_",
    "DO_NOT_TRACK",
];
const WORDS: &[&str] = &["HOME", "PATH", "LANG", "LC_ALL", "TERM", "USER", "LOGNAME", "TMPDIR", "SHELL"];

/// Variables cargo sets for every build (not spark-kit's).
fn cargo_own(name: &str) -> bool {
    name.starts_with("CARGO_") || name == "OUT_DIR"
}

/// Every file below `dir` whose extension is `ext`.
fn files_with(dir: &Path, ext: &str, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            files_with(&p, ext, out);
        } else if p.extension().is_some_and(|x| x == ext) {
            out.push(p);
        }
    }
}

/// The source without `#[cfg(test)]` items (a test module names variables it only fakes).
fn without_tests(src: &str) -> String {
    let mut out = String::new();
    let mut rest = src;
    while let Some(i) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..i]);
        let item = &rest[i..];
        let end = match (item.find('{'), item.find(';')) {
            (Some(b), semi) if semi.is_none_or(|s| b < s) => {
                let mut depth = 0usize;
                let mut end = item.len();
                for (k, c) in item[b..].char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' => {
                            depth -= 1;
                            if depth == 0 {
                                end = b + k + 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                end
            }
            (_, Some(s)) => s + 1,
            _ => item.len(),
        };
        rest = &item[end..];
    }
    out.push_str(rest);
    out
}

/// Every environment-variable-like string literal in `code` (line comments dropped), and every
/// name given to `env!` / `option_env!` / `var` / `var_os`, with its line.
fn names_in(code: &str) -> Vec<(String, usize)> {
    let mut out = Vec::new();
    for (n, line) in code.lines().enumerate() {
        let line = line.split("//").next().unwrap_or("");
        let mut parts = line.split('"');
        let mut before = parts.next().unwrap_or("").to_string();
        while let (Some(lit), Some(after)) = (parts.next(), parts.next()) {
            let looks = lit.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
                && !lit.is_empty()
                && (FAMILIES.iter().any(|f| lit.starts_with(f)) || WORDS.contains(&lit));
            let read_call = ["env!(", "option_env!(", "var(", "var_os("].iter().any(|c| before.trim_end().ends_with(c));
            let clap_label = before.trim_end().ends_with("value_name =");
            if (looks && !clap_label) || (read_call && !cargo_own(lit)) {
                out.push((lit.to_string(), n + 1));
            }
            before = after.to_string();
        }
    }
    out
}

/// Python: every env-var-like string literal (comments dropped), and every name read or set through
/// `environ.get(` / `environ[` / `getenv(` / `setdefault(` / `env.get(` whatever its family, with its line.
fn names_in_python(code: &str) -> Vec<(String, usize)> {
    let mut out = Vec::new();
    for (n, line) in code.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("");
        for quote in ['"', '\''] {
            let mut parts = line.split(quote);
            let mut before = parts.next().unwrap_or("").to_string();
            while let (Some(lit), Some(after)) = (parts.next(), parts.next()) {
                let shaped =
                    !lit.is_empty() && lit.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
                let looks = shaped && (FAMILIES.iter().any(|f| lit.starts_with(f)) || WORDS.contains(&lit));
                let read = ["environ.get(", "environ[", "getenv(", "setdefault(", "env.get("]
                    .iter()
                    .any(|c| before.trim_end().ends_with(c));
                if looks || (shaped && read) {
                    out.push((lit.to_string(), n + 1));
                }
                before = after.to_string();
            }
        }
    }
    out
}

/// name → first place it is named, over the shipped Python overlay (not its tests).
fn named_in_python() -> BTreeMap<String, String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in ["python_overlay/spark_overlay", "python_overlay/tools"] {
        files_with(&root.join(dir), "py", &mut files);
    }
    let mut found = BTreeMap::new();
    for f in files {
        for (name, line) in names_in_python(&std::fs::read_to_string(&f).unwrap()) {
            let at = format!("{}:{line}", f.strip_prefix(root).unwrap().display());
            found.entry(name).or_insert(at);
        }
    }
    found
}

/// name → first place it is named, over src/, build.rs and the shipped Python overlay.
fn named_in_sources() -> BTreeMap<String, String> {
    let mut found = named_in_rust();
    for (name, at) in named_in_python() {
        found.entry(name).or_insert(at);
    }
    found
}

/// name → first place it is named, over src/ and build.rs.
fn named_in_rust() -> BTreeMap<String, String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    files_with(&root.join("src"), "rs", &mut files);
    files.push(root.join("build.rs"));
    let mut found = BTreeMap::new();
    for f in files {
        let code = without_tests(&std::fs::read_to_string(&f).unwrap());
        for (name, line) in names_in(&code) {
            let at = format!("{}:{line}", f.strip_prefix(root).unwrap().display());
            found.entry(name).or_insert(at);
        }
    }
    found
}

#[test]
fn every_variable_src_names_is_in_the_registry() {
    let found = named_in_sources();
    assert!(found.contains_key("HF_TOKEN") && found.contains_key("DOCKER_HOST"), "the scan is broken: {found:?}");
    let missing: Vec<String> = found
        .iter()
        .filter(|(name, _)| envvars::find(name).is_none())
        .map(|(name, at)| format!("{name} ({at})"))
        .collect();
    assert!(missing.is_empty(), "environment variables missing from src/envvars.rs VARS: {}", missing.join(", "));
}

#[test]
fn every_variable_the_python_overlay_names_is_in_the_registry() {
    let found = named_in_python();
    for known in ["SPARK_ENGRAM_DIR", "SPARK_EXL3_MOE_COOP", "RAYON_NUM_THREADS"] {
        assert!(found.contains_key(known), "the Python scan is broken: {known} not found in {found:?}");
    }
    let missing: Vec<String> = found
        .iter()
        .filter(|(name, _)| envvars::find(name).is_none())
        .map(|(name, at)| format!("{name} ({at})"))
        .collect();
    assert!(
        missing.is_empty(),
        "environment variables the Python overlay names are missing from src/envvars.rs VARS: {}",
        missing.join(", ")
    );
}

#[test]
fn every_registry_entry_is_still_named_in_src() {
    let found: BTreeSet<String> = named_in_sources().into_keys().collect();
    let stale: Vec<&str> = VARS
        .iter()
        .map(|v| v.name)
        .filter(|name| match name.strip_suffix('*') {
            Some(prefix) => !found.iter().any(|f| f.starts_with(prefix)),
            None => !found.contains(*name),
        })
        .collect();
    assert!(
        stale.is_empty(),
        "src/envvars.rs lists variables neither src/ nor the Python overlay names any more: {}",
        stale.join(", ")
    );
}

#[test]
fn configuration_md_section_matches_the_registry() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/configuration.md");
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    let want = envvars::splice(&have, &envvars::markdown());
    if std::env::var_os("SPARK_KIT_TEST_BLESS").is_some() {
        std::fs::write(&path, &want).unwrap();
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "docs/configuration.md's environment section is out of date; regenerate: SPARK_KIT_TEST_BLESS=1 cargo test --test rules envvars::"
    );
}

#[test]
fn the_scan_finds_reads_literals_and_skips_tests() {
    let code = "let a = get(env, \"HF_HOME\"); // \"HF_IN_COMMENT\"\nenv!(\"MY_BUILD_VAR\"); var(\"OUT_DIR\");\n#[arg(value_name = \"PATH\")]\n#[cfg(test)]\nmod tests { const X: &str = \"HF_FAKE\"; }\nconst Y: &str = \"VLLM_AFTER\";";
    let names: Vec<String> = names_in(&without_tests(code)).into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["HF_HOME", "MY_BUILD_VAR", "VLLM_AFTER"]);
}

#[test]
fn the_python_scan_finds_reads_and_literals_and_skips_comments() {
    let code = "x = os.environ.get(\"ANY_NAME\", \"1\")  # \"HF_IN_COMMENT\"\nos.environ['OTHER'] = 'v'\nos.environ.setdefault(\"THIRD\", \"1\")\nmsg = \"set SPARK_X\"\nk = \"VLLM_LIT\"\ny = env.get('FROM_ENV')\nz = d.get('lower')\n";
    let names: Vec<String> = names_in_python(code).into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["ANY_NAME", "OTHER", "THIRD", "VLLM_LIT", "FROM_ENV"]);
}
