//! Issue 21 items 3, 5 and 7 through the real binary, without an engine: what `logs`, `down`,
//! `status` and `setup` say (and exit with) when there is nothing to read or run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::Path;
use std::process::Output;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use common::spark_kit;
use spark_kit::live::{self, Record};
use spark_kit::supervisor::control::serve;
use spark_kit::supervisor::snapshot::{initial_snapshot, Handles};

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The binary with its own cache (so the live-deployment registry is this test's alone).
fn run_in(cache: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    spark_kit().args(args).env("SPARK_KIT_CACHE", cache).envs(env.iter().copied()).output().unwrap()
}

fn run(args: &[&str], env: &[(&str, &str)]) -> Output {
    let cache = tempfile::tempdir().unwrap();
    run_in(cache.path(), args, env)
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
    std::fs::write(
        dir.path().join("tiny-cpu-2node-node-a-engine.log"),
        "2026-12-03T10:00:00.000Z node-a/r0 out| hello\n",
    )
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

/// A real control socket (the supervisor's own server) for a kit, registered in `cache`.
fn live_supervisor(cache: &Path, kit_name: &str, kit_arg: &str) -> (Record, Handles) {
    let kit = spark_kit::kit::resolve(spark_kit::kit::source(Some(kit_name)).unwrap(), &[], &[]).unwrap().kit;
    let snap = initial_snapshot(&kit);
    let h =
        Handles { snapshot: Arc::new(Mutex::new(snap.clone())), stop: Arc::new(AtomicBool::new(false)), front: None };
    let socket = cache.join(format!("{kit_name}.sock"));
    serve(&socket, h.clone()).unwrap();
    let rec = Record {
        schema: 1,
        kit_name: kit.name.clone(),
        kit_arg: Some(kit_arg.into()),
        socket,
        pid: std::process::id(),
        endpoint: snap.endpoint,
        kit,
    };
    let dir = live::run_dir(&spark_kit::dirs::Dirs { home: cache.into(), cache: cache.into() });
    // Both records carry this test's pid; their file names differ by kit.
    live::register(&dir, &rec).unwrap();
    (rec, h)
}

/// Item 3: `status` with no --kit finds the one live deployment of any kit (here tiny-cpu, whose
/// logs dir is elsewhere), and lists them when there are several (exit 2, a runnable hint each).
#[test]
fn status_without_kit_finds_the_live_deployment_or_lists_several() {
    let cache = tempfile::tempdir().unwrap();
    let o = run_in(cache.path(), &["status"], &[]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("error: no spark-kit deployment is running here"), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("hint: start it with `spark-kit up --detach`"), "{}", text(&o.stderr));

    let (_a, _ha) = live_supervisor(cache.path(), "tiny-cpu", "tiny-cpu");
    let o = run_in(cache.path(), &["status", "--json"], &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["kit"], "tiny-cpu");
    // With --kit, the registry is used too when the kit's own socket path is not where it runs.
    let o = run_in(cache.path(), &["status", "--kit", "tiny-cpu"], &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(text(&o.stdout).contains("kit tiny-cpu"), "{}", text(&o.stdout));

    let (_b, _hb) = live_supervisor(cache.path(), "tiny-cpu-2node", "tiny-cpu-2node");
    let o = run_in(cache.path(), &["status"], &[]);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("error: 2 deployments are running here: tiny-cpu (supervisor pid"), "{err}");
    let hint = err.lines().find_map(|l| l.strip_prefix("hint: name one with --kit: ")).unwrap();
    // Every command the hint names runs as printed.
    for cmd in hint.split(" or ") {
        let cmd = cmd.trim_matches('`');
        let o = std::process::Command::new("sh")
            .arg("-c")
            .arg(cmd.replacen("spark-kit", env!("CARGO_BIN_EXE_spark-kit"), 1))
            .env("SPARK_KIT_CACHE", cache.path())
            .output()
            .unwrap();
        assert!(o.status.success(), "{cmd}: {}", text(&o.stderr));
    }
}

/// #28: with HOME unset, spark-kit took `/root` for it (another user's cache and models); now
/// every command that needs the home says so and how to set it, with exit 2.
#[test]
fn an_unset_home_is_a_usage_error_naming_home_and_the_fix() {
    for args in
        [&["plan", "--kit", "tiny-cpu"][..], &["status", "--kit", "tiny-cpu"], &["preflight", "--kit", "tiny-cpu"]]
    {
        let o = spark_kit().args(args).env_remove("HOME").output().unwrap();
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.starts_with("error: HOME is not set:") && err.contains("export HOME="), "{args:?}: {err}");
    }
}
