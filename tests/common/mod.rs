//! Shared helpers of the integration tests.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

pub mod docker;
pub mod gateway;
pub mod netns;
pub mod sshd;
pub mod up;
pub mod wait;

use std::path::PathBuf;
use std::process::Command;

/// The spark-kit binary under test, with a clean `SPARK_KIT_*` environment (test variables kept).
pub fn spark_kit() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_spark-kit"));
    for (k, _) in std::env::vars() {
        if k.starts_with("SPARK_KIT_") && !k.starts_with("SPARK_KIT_TEST_") && k != "SPARK_KIT_CACHE" {
            cmd.env_remove(k);
        }
    }
    cmd
}

/// A TCP port that was free a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// The tiny-cpu engine venv's python (from `spark-kit setup --json`, instant when built).
pub fn venv_python() -> PathBuf {
    let out = spark_kit().args(["setup", "--kit", "tiny-cpu", "--json"]).output().unwrap();
    assert!(out.status.success(), "setup: {}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    PathBuf::from(v["path"].as_str().unwrap()).join("bin/python")
}

fn stats() -> Vec<spark_kit::engine::pgroup::Stat> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
        .filter_map(|s| spark_kit::engine::pgroup::parse_stat(&s))
        .filter(|s| s.state != 'Z')
        .collect()
}

/// Pids whose parent is `pid`.
pub fn children_of(pid: i32) -> Vec<i32> {
    stats().into_iter().filter(|s| s.ppid == pid).map(|s| s.pid).collect()
}

/// Live members of a process group, as "pid (comm)".
pub fn group_members(pgid: i32) -> Vec<String> {
    spark_kit::engine::pgroup::members(pgid).into_iter().map(|s| format!("{} ({})", s.pid, s.comm)).collect()
}

/// Every descendant of `pid` (children, grandchildren, …).
pub fn descendants(pid: i32) -> Vec<i32> {
    let all = stats();
    let mut out = Vec::new();
    let mut frontier = vec![pid];
    while let Some(p) = frontier.pop() {
        for s in all.iter().filter(|s| s.ppid == p) {
            out.push(s.pid);
            frontier.push(s.pid);
        }
    }
    out
}

/// The process group of the engine (`spark-kit __engine`) started under `pid`, if any.
pub fn engine_pgid_under(pid: i32) -> Option<i32> {
    descendants(pid).into_iter().find(|p| {
        std::fs::read(format!("/proc/{p}/cmdline")).is_ok_and(|c| c.split(|b| *b == 0).any(|a| a == b"__engine"))
    })
}

/// Live processes that carry `marker` in their environment (set on the command a test started,
/// inherited by its agents) or `needle` in their command line (e.g. `--port 8123` of an engine).
/// Unrelated processes on a shared machine are not counted.
pub fn marked_processes(marker: &str, needle: &str) -> Vec<(i32, String)> {
    stats()
        .into_iter()
        .filter(|s| {
            let env = std::fs::read(format!("/proc/{}/environ", s.pid)).unwrap_or_default();
            let cmd = std::fs::read(format!("/proc/{}/cmdline", s.pid)).unwrap_or_default();
            let has = |hay: &[u8], n: &str| !n.is_empty() && hay.windows(n.len()).any(|w| w == n.as_bytes());
            let cmd_text: Vec<u8> = cmd.iter().map(|b| if *b == 0 { b' ' } else { *b }).collect();
            has(&env, marker) || has(&cmd_text, needle)
        })
        .map(|s| (s.pid, s.comm))
        .collect()
}

/// The child's stdout (piped) as lines on a channel, read by a thread until it closes (so the
/// child never blocks on a full pipe).
pub fn stdout_lines(child: &mut std::process::Child) -> std::sync::mpsc::Receiver<String> {
    use std::io::BufRead;
    let out = child.stdout.take().expect("stdout is piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// Wait for the first line that starts with `prefix` (panics after `limit`, naming `what`).
pub fn wait_prefix(rx: &std::sync::mpsc::Receiver<String>, prefix: &str, limit: std::time::Duration, what: &str) {
    let deadline = std::time::Instant::now() + limit;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let line = rx.recv_timeout(left).unwrap_or_else(|_| panic!("{what}: no line starting `{prefix}` in {limit:?}"));
        if line.starts_with(prefix) {
            return;
        }
    }
}

/// Kills and reaps the child when dropped (a test that fails mid-way leaves no process behind);
/// `None` once the test has waited for it itself.
pub struct Reap(pub Option<std::process::Child>);

impl Drop for Reap {
    fn drop(&mut self) {
        if let Some(c) = self.0.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
