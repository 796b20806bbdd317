//! Issue 21 items 3, 5 and 7 through the real binary, without an engine: what `logs`, `down`,
//! `status` and `setup` say (and exit with) when there is nothing to read or run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::Output;

use common::spark_kit;

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn run(args: &[&str], env: &[(&str, &str)]) -> Output {
    spark_kit().args(args).envs(env.iter().copied()).output().unwrap()
}

/// Item 5: `logs` fails, naming the node, when a node's log cannot be read (a missing file, an
/// unreachable ssh host), and still prints what the other nodes had.
#[test]
fn logs_fail_naming_each_node_that_could_not_be_read() {
    let dir = tempfile::tempdir().unwrap();
    let logs = dir.path().display().to_string();
    let set_logs = format!("paths.logs={logs}");
    let o = run(&["logs", "--kit", "tiny-cpu", "--set", &set_logs], &[]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    let err = text(&o.stderr);
    assert!(err.contains("error: node local: cannot read its engine log"), "{err}");
    assert!(err.contains("tiny-cpu-local-engine.log"), "{err}");

    // Two nodes: the head's log is there, the worker's host does not resolve.
    std::fs::write(dir.path().join("tiny-cpu-2node-node-a-engine.log"), "2026-12-03T10:00:00.000Z node-a/r0 out| hello\n")
        .unwrap();
    let o = run(
        &["logs", "--kit", "tiny-cpu-2node", "--set", &set_logs, "--set", "nodes.1.ssh_host=no-such-host.invalid"],
        &[],
    );
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(text(&o.stdout).contains("node-a/r0 out| hello"), "{}", text(&o.stdout));
    assert!(err.contains("error: node node-b: cannot read its engine log"), "{err}");
    assert!(!err.contains("node node-a:"), "{err}");

    // With -f a missing file fails at once instead of waiting forever.
    let o = run(&["logs", "--kit", "tiny-cpu", "-f", "--set", &format!("paths.logs={logs}/none")], &[]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("error: node local: cannot read its engine log"));

    // And a readable log exits 0.
    std::fs::write(dir.path().join("tiny-cpu-local-engine.log"), "x local/r0 out| hi\n").unwrap();
    let o = run(&["logs", "--kit", "tiny-cpu", "--set", &set_logs], &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
}

/// Item 7: `down` with nothing running says so first, and nothing about stopping.
#[test]
fn down_with_nothing_running_checks_first() {
    let dir = tempfile::tempdir().unwrap();
    let set_logs = format!("paths.logs={}", dir.path().display());
    let o = run(&["down", "--kit", "tiny-cpu", "--set", &set_logs], &[]);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(!err.contains("stopping"), "{err}");
    assert!(err.contains("error: no deployment of kit tiny-cpu is running here"), "{err}");
}

/// Item 7: an unwritable cache names SPARK_KIT_CACHE in the hint.
#[test]
fn setup_with_an_unwritable_cache_names_spark_kit_cache() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, "").unwrap();
    let cache = file.join("cache").display().to_string();
    let o = run(&["setup", "--kit", "tiny-cpu"], &[("SPARK_KIT_CACHE", &cache)]);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains(&format!("error: cannot create {cache}")), "{err}");
    assert!(err.contains("hint: ") && err.contains("set SPARK_KIT_CACHE to a writable directory"), "{err}");
}
