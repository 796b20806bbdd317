//! Snapshots (insta) of the main commands' human and JSON output and of their errors, through
//! the real binary, without an engine (no vLLM boot; each run well under a few seconds).
//! Deterministic: an empty environment but a temporary HOME and cache (redacted as `[HOME]`),
//! no machine facts (preflight's local verdicts and messages are redacted to `[machine]`), and
//! the docker kits left out of kit lists (helper "docker" adds them; their own tests cover them).
//! Update after an intended change with `INSTA_UPDATE=always cargo test --test cli cli_snapshots::`
//! and review the diff of `tests/cli/snapshots/`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

struct Run {
    home: tempfile::TempDir,
}

impl Run {
    fn new() -> Self {
        Self { home: tempfile::tempdir().unwrap() }
    }

    /// The binary in an empty environment (HOME, the cache under it, PATH), from the repo root.
    fn output(&self, args: &[&str]) -> (i32, String, String) {
        let home = self.home.path();
        let out = Command::new(env!("CARGO_BIN_EXE_spark-kit"))
            .args(args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .env_clear()
            .env("HOME", home)
            .env("SPARK_KIT_CACHE", home.join("cache"))
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .output()
            .unwrap();
        let text = |b: &[u8]| self.redact(&String::from_utf8_lossy(b));
        (out.status.code().unwrap_or(-1), text(&out.stdout), text(&out.stderr))
    }

    /// Exit code, stdout and stderr in one text.
    fn snapshot(&self, args: &[&str]) -> String {
        let (code, out, err) = self.output(args);
        let line = self.redact(&args.join(" "));
        format!("$ spark-kit {line}\nexit: {code}\n--- stdout\n{out}--- stderr\n{err}")
    }

    fn redact(&self, s: &str) -> String {
        let home = self.home.path().display().to_string();
        let mut s = s.replace(&home, "[HOME]");
        // The docker kits in a list of kit names (`a, b, tiny-cpu-docker, c`).
        while let Some(i) = s.find(", tiny-cpu-docker") {
            let end = s[i + 2..].find([',', '\n']).map_or(s.len(), |j| i + 2 + j);
            s.replace_range(i..end, "");
        }
        s
    }
}

fn without_docker_lines(s: &str) -> String {
    s.lines().filter(|l| !l.starts_with("tiny-cpu-docker")).map(|l| format!("{l}\n")).collect()
}

#[test]
fn kits_human_and_json() {
    let r = Run::new();
    let (code, out, err) = r.output(&["kits"]);
    assert_eq!((code, err.as_str()), (0, ""));
    insta::assert_snapshot!("kits", without_docker_lines(&out));
    let (code, out, _) = r.output(&["kits", "--json"]);
    assert_eq!(code, 0);
    let mut v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v.as_array_mut().unwrap().retain(|k| !k["name"].as_str().unwrap().contains("docker"));
    insta::assert_snapshot!("kits_json", serde_json::to_string_pretty(&v).unwrap());
}

#[test]
fn kit_show_and_check() {
    let r = Run::new();
    insta::assert_snapshot!("kit_show_tiny_cpu", r.snapshot(&["kit", "show", "tiny-cpu"]));
    insta::assert_snapshot!("kit_check_tiny_cpu", r.snapshot(&["kit", "check", "tiny-cpu"]));
    let bad = r.home.path().join("bad.yaml");
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/launch-kits/tiny-cpu.yaml")).unwrap();
    std::fs::write(&bad, text.replace("port: 8000", "port: 70000")).unwrap();
    insta::assert_snapshot!("kit_check_bad_port", r.snapshot(&["kit", "check", bad.to_str().unwrap()]));
}

#[test]
fn plan_human_and_json() {
    let r = Run::new();
    insta::assert_snapshot!("plan_virtual", r.snapshot(&["plan", "--virtual"]));
    let (code, out, err) = r.output(&["plan", "--virtual", "--json"]);
    assert_eq!((code, err.as_str()), (0, ""));
    insta::assert_snapshot!("plan_virtual_json", out);
    insta::assert_snapshot!("plan_tiny_cpu_no_checkpoint", r.snapshot(&["plan", "--kit", "tiny-cpu"]));
}

#[test]
fn verify_structure_of_the_modelled_checkpoint() {
    let r = Run::new();
    insta::assert_snapshot!("verify_structure_virtual", r.snapshot(&["verify", "--structure", "--virtual"]));
    insta::assert_snapshot!("verify_no_lock_file", r.snapshot(&["verify"]));
}

#[test]
fn preflight_checks_in_order_with_machine_facts_redacted() {
    let r = Run::new();
    let (code, out, _) = r.output(&["preflight", "--kit", "tiny-cpu", "--json"]);
    assert!(code == 0 || code == 1, "{code}");
    let mut v: serde_json::Value = serde_json::from_str(&out).unwrap();
    for c in v["checks"].as_array_mut().unwrap() {
        for key in ["verdict", "message", "fix"] {
            c[key] = "[machine]".into();
        }
    }
    v["status"] = "[machine]".into();
    insta::assert_snapshot!("preflight_tiny_cpu_json", serde_json::to_string_pretty(&v).unwrap());
    let (_, _, err) = r.output(&["preflight", "--kit", "tiny-cpu"]);
    let first = err.lines().next().unwrap_or_default();
    insta::assert_snapshot!("preflight_tiny_cpu_header", first);
}

#[test]
fn status_with_nothing_running() {
    let r = Run::new();
    insta::assert_snapshot!("status_none", r.snapshot(&["status"]));
    insta::assert_snapshot!("status_none_json", r.snapshot(&["status", "--json"]));
    insta::assert_snapshot!("status_tiny_cpu_none", r.snapshot(&["status", "--kit", "tiny-cpu"]));
    insta::assert_snapshot!("status_tiny_cpu_none_json", r.snapshot(&["status", "--kit", "tiny-cpu", "--json"]));
    // A script reads one JSON value on stdout, and the exit code is the human form's.
    let (code, stdout, _) = r.output(&["status", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&stdout).expect("status --json prints JSON when nothing runs");
    assert_eq!((code, v["running"].as_bool(), v["state"].as_str()), (1, Some(false), Some("stopped")), "{stdout}");
}

#[test]
fn errors() {
    let r = Run::new();
    insta::assert_snapshot!("error_unknown_kit", r.snapshot(&["kit", "show", "nope"]));
    insta::assert_snapshot!("error_set_without_value", r.snapshot(&["plan", "--set", "engine.port"]));
    insta::assert_snapshot!("error_set_out_of_range", r.snapshot(&["plan", "--virtual", "--set", "engine.port=70000"]));
    insta::assert_snapshot!("error_flag_value", r.snapshot(&["download", "--jobs", "0"]));
    insta::assert_snapshot!("error_unknown_flag", r.snapshot(&["plan", "--no-such-flag"]));
}
