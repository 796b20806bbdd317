//! Two "nodes" on one machine (tests/common/netns.rs): network namespaces `spark1` and `spark2`
//! joined by a veth pair (10.77.0.1 / 10.77.0.2), a real sshd in each, the supervisor running in
//! `spark1` (as it would on the head machine). The `tiny-cpu-2node` kit boots tensor parallel 2
//! across them through vLLM's `--nnodes/--headless` mode. Then: kill -9 the worker's engine (restart),
//! SIGSTOP the head's engine (stall detector), take the link down (detected; `restart` after it
//! is back, detached), `down` of that deployment, and kill -9 of a booting supervisor (agents
//! stop their engines).
//!
//! Needs root, `ip`, `sshd` and the engine venv: runs in CI (`tests/run-all.sh` sets
//! SPARK_KIT_TEST_E2E=1); otherwise prints why it skips.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use crate::common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::netns::{self, Net};
use common::{group_members, venv_python, wait};

const NS: [&str; 2] = ["spark1", "spark2"];
const KIT: &str = "tiny-cpu-2node";

fn sh(args: &[&str]) {
    let out = Command::new(args[0]).args(&args[1..]).output().unwrap();
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// `spark-kit <args> --kit tiny-cpu-2node …` inside the head's namespace.
fn spark(net: &Net, args: &[&str]) -> Command {
    net.spark(KIT, args)
}

fn status(net: &Net) -> serde_json::Value {
    let out = spark(net, &["status", "--json"]).output().unwrap();
    assert!(out.status.success(), "status: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn chat(net: &Net) -> String {
    let code = r#"
import sys
from openai import OpenAI
c = OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="none", timeout=120)
r = c.chat.completions.create(model="tiny-llama", messages=[{"role": "user", "content": "import sys"}], max_tokens=12, temperature=0)
print(r.choices[0].message.content)
"#;
    let out = net.exec(0, venv_python()).args(["-c", code]).output().unwrap();
    assert!(out.status.success(), "chat failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn wait_state(net: &Net, want: &str, limit: Duration) -> serde_json::Value {
    wait::state(&|| status(net), want, 0, limit)
}

fn pgids(s: &serde_json::Value) -> Vec<i32> {
    s["nodes"].as_array().unwrap().iter().filter_map(|n| n["engine_pgid"].as_i64()).map(|p| p as i32).collect()
}

fn all_gone(groups: &[i32], limit: Duration) -> f64 {
    let t = Instant::now();
    loop {
        let alive: Vec<String> = groups.iter().flat_map(|g| group_members(*g)).collect();
        if alive.is_empty() {
            return t.elapsed().as_secs_f64();
        }
        assert!(t.elapsed() < limit, "still alive after {limit:?}: {alive:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn foreground_up(net: &Net) -> (Child, std::sync::mpsc::Receiver<String>) {
    let mut child = spark(net, &["up"]).stdout(Stdio::piped()).stderr(Stdio::inherit()).spawn().unwrap();
    let rx = common::stdout_lines(&mut child);
    (child, rx)
}

#[test]
fn two_nodes_boot_tp2_survive_failures_and_stop_clean() {
    if let Some(why) = netns::skip_reason() {
        eprintln!("skipping: {why}");
        return;
    }
    let net = Net::up(NS, ["", ""]);

    // 0. Preflight reaches the worker through its node agent (facts gathered in spark2), checks
    //    ssh both ways; a wrong worker address fails it, and `up` refuses to start on that.
    let out = spark(&net, &["preflight", "--json"]).output().unwrap();
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    assert!(out.status.success(), "preflight: {r}\n{}", String::from_utf8_lossy(&out.stderr));
    let verdict = |r: &serde_json::Value, node: &str, id: &str| -> Vec<(String, String)> {
        r["checks"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["node"] == node && c["id"] == id)
            .map(|c| (c["verdict"].as_str().unwrap().to_string(), c["message"].as_str().unwrap().to_string()))
            .collect()
    };
    assert_eq!(verdict(&r, "node-b", "ssh"), [("pass".into(), "ssh to node-a in batch mode works".into())], "{r}");
    assert_eq!(verdict(&r, "node-a", "ssh"), [("pass".into(), "ssh to node-b in batch mode works".into())], "{r}");
    assert_eq!(verdict(&r, "node-b", "ipv4")[0].0, "pass", "{r}");
    let out = spark(&net, &["preflight", "--json", "--set", "nodes.1.fabric.ipv4=10.77.0.9"]).output().unwrap();
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    assert_eq!(out.status.code(), Some(1), "{r}");
    let bad = verdict(&r, "node-b", "ipv4");
    assert!(bad[0].0 == "fail" && bad[0].1.contains("veth-spark2 does not carry the kit's address 10.77.0.9"), "{r}");
    let t = Instant::now();
    let out = spark(&net, &["up", "--set", "nodes.1.fabric.ipv4=10.77.0.9"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("preflight failed") && err.contains("node-b ipv4"), "{err}");
    assert!(!err.contains("starting its engine"), "an engine was started despite preflight: {err}");
    eprintln!("up refused on a failed preflight in {:.1} s", t.elapsed().as_secs_f64());

    // 1. Boot TP=2 across the namespaces and answer a chat completion.
    let (mut sup, rx) = foreground_up(&net);
    let t = Instant::now();
    loop {
        let line = rx.recv_timeout(Duration::from_secs(900)).expect("no ready banner");
        if line.starts_with("endpoint: http://127.0.0.1:8000/v1") {
            break;
        }
    }
    eprintln!("two-node TP=2 ready in {:.1} s", t.elapsed().as_secs_f64());
    let first = chat(&net);
    assert!(!first.is_empty());
    let s = status(&net);
    assert_eq!(s["schema"], 1);
    assert_eq!(s["nodes"].as_array().unwrap().len(), 2);
    let log = std::fs::read_to_string(net.logs().join("tiny-cpu-2node-node-b-engine.log")).unwrap();
    assert!(log.contains("--headless") || log.contains("headless"), "worker did not run headless");

    // 2. kill -9 the worker's engine group: detected, whole job restarted, serves again.
    let worker_pgid = s["nodes"][1]["engine_pgid"].as_i64().unwrap() as i32;
    nix::sys::signal::killpg(nix::unistd::Pid::from_raw(worker_pgid), nix::sys::signal::Signal::SIGKILL).unwrap();
    let (_, secs) = wait::restarts_at_least(&|| status(&net), 1, Duration::from_secs(30));
    eprintln!("worker death detected in {secs:.1} s");
    wait_state(&net, "ready", Duration::from_secs(900));
    assert_eq!(chat(&net), first, "greedy answer changed after the restart");

    // 3. SIGSTOP the head's engine group: its probes fail and the stall detector fires at the
    //    serving threshold (`engine.stall_timeout_s`, 20 s).
    let s = status(&net);
    let head_pgid = s["nodes"][0]["engine_pgid"].as_i64().unwrap() as i32;
    nix::sys::signal::killpg(nix::unistd::Pid::from_raw(head_pgid), nix::sys::signal::Signal::SIGSTOP).unwrap();
    let (s, waited) = wait::restarts_at_least(&|| status(&net), 2, Duration::from_secs(180));
    assert!(s["reason"].as_str().unwrap_or_default().contains("hang"), "{s}");
    eprintln!("hang detected {waited:.1} s after SIGSTOP (stall threshold 20 s)");
    assert!(waited >= 18.0, "hang declared before the threshold");
    let dumps: Vec<_> = std::fs::read_dir(net.logs())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("hang-"))
        .collect();
    assert!(!dumps.is_empty(), "no stack dump attempted");
    wait_state(&net, "ready", Duration::from_secs(900));

    // 4. Link down: detected and shown by status.
    sh(&["ip", "-n", net.ns[0], "link", "set", "veth-spark1", "down"]);
    let t = Instant::now();
    loop {
        let s = status(&net);
        let lost = s["nodes"][1]["agent_connected"] == false;
        if lost || s["state"] == "restarting" || s["state"] == "failed" {
            eprintln!("link down detected in {:.1} s: {}", t.elapsed().as_secs_f64(), s["reason"]);
            assert!(s["reason"].is_string(), "{s}");
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(90), "link down not detected: {s}");
        std::thread::sleep(Duration::from_secs(1));
    }
    sh(&["ip", "-n", net.ns[0], "link", "set", "veth-spark1", "up"]);
    // `restart` stops whatever is left and brings the job up detached.
    let out = spark(&net, &["restart"]).output().unwrap();
    assert!(out.status.success(), "restart: {}", String::from_utf8_lossy(&out.stderr));
    let _ = sup.wait();
    assert_eq!(chat(&net), first);

    // 5. The detached deployment `restart` made: status schema, and `down` leaves nothing on
    //    either node.
    let s = status(&net);
    for key in ["schema", "kit", "state", "supervisor_pid", "restarts", "endpoint", "model", "nodes"] {
        assert!(s.get(key).is_some(), "status lacks {key}: {s}");
    }
    for n in s["nodes"].as_array().unwrap() {
        for key in ["name", "rank", "agent_pid", "engine_pgid", "engine_alive", "mem_available", "healthy", "uptime_s"]
        {
            assert!(n.get(key).is_some(), "node status lacks {key}: {n}");
        }
    }
    let groups = pgids(&s);
    assert_eq!(groups.len(), 2, "{s}");
    let out = spark(&net, &["down"]).output().unwrap();
    assert!(out.status.success(), "down: {}", String::from_utf8_lossy(&out.stderr));
    all_gone(&groups, Duration::from_secs(5));
    net.assert_no_leftovers();

    // 6. kill -9 the supervisor while both engines boot: both agents stop their engines.
    let (mut sup, _rx) = foreground_up(&net);
    let t = Instant::now();
    let groups = loop {
        let out = spark(&net, &["status", "--json"]).output().unwrap();
        let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        let alive = s["nodes"].as_array().is_some_and(|n| n.len() == 2 && n.iter().all(|n| n["engine_alive"] == true));
        if alive && pgids(&s).len() == 2 {
            break pgids(&s);
        }
        assert!(t.elapsed() < Duration::from_secs(300), "engines not started on both nodes: {s}");
        std::thread::sleep(Duration::from_millis(500));
    };
    sup.kill().unwrap();
    let _ = sup.wait();
    let secs = all_gone(&groups, Duration::from_secs(30));
    eprintln!("engines gone {secs:.1} s after kill -9 of the booting supervisor");
    net.assert_no_leftovers();
}
