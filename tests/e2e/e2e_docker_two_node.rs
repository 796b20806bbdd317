//! Tensor parallel 2 across two "nodes", the engine in a container on each: the kit
//! `tiny-cpu-docker-2node` on two network namespaces joined by a veth pair
//! (tests/common/netns.rs), each with a real sshd and its own Docker daemon (started in it with
//! `nsenter --net`, so `--network=host` containers get that namespace's interfaces, and with a
//! /dev/shm of its own, as a machine has; roots and socket under /tmp, tests/common/docker.rs).
//! The supervisor runs in the head's namespace
//! with `DOCKER_HOST` of the head's daemon; the worker's sessions (its node agent among them)
//! get theirs, and a cache of their own, from sshd (`SetEnv`), as a second machine would.
//!
//! One boot serves, one restart, one boot cut short: the image is made on the head (`spark-kit
//! image build`); `up` refuses while the worker lacks it (preflight names `image sync`);
//! `spark-kit image sync` ships it (worker's id = head's); a foreground `up` serves TP=2 through
//! the two containers (OpenAI client, greedy); kill -9 of vLLM's main process in the worker's
//! container → detected, restarted, the same answer; `down` → no container of the deployment
//! on either daemon; kill -9 of the supervisor while both ranks boot again → none within 30 s.
//!
//! Needs root, `ip`, sshd, rsync, docker.io and the engine venv (SPARK_KIT_TEST_E2E, set by
//! tests/run-all.sh); otherwise prints why and skips.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use crate::common;

use std::process::{Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use common::docker::{self, daemon_in, vllm_main, NsDaemon};
use common::netns::{self, Net};
use common::{venv_python, wait, Reap};

const NS: [&str; 2] = ["sparkd1", "sparkd2"];
const KIT: &str = "tiny-cpu-docker-2node";
const IMAGE: &str = "spark-kit/tiny-cpu-engine:local";
const LABEL: &str = "label=spark-kit.kit=tiny-cpu-docker-2node";

/// Fields drop in order: the daemons (their containers removed) before the namespaces.
struct Env {
    head: NsDaemon,
    worker: NsDaemon,
    net: Net,
    /// The worker's own spark-kit cache (where `image sync` copies to).
    worker_cache: tempfile::TempDir,
    venv: String,
}

impl Env {
    fn up() -> Self {
        let (_, head_host) = docker::paths("h");
        let (_, worker_host) = docker::paths("w");
        let worker_cache = tempfile::tempdir().unwrap();
        let net = Net::up(
            NS,
            [
                &format!("SetEnv DOCKER_HOST={head_host}\n"),
                &format!("SetEnv DOCKER_HOST={worker_host} SPARK_KIT_CACHE={}\n", worker_cache.path().display()),
            ],
        );
        let head = daemon_in(NS[0], "h").unwrap();
        let worker = daemon_in(NS[1], "w").unwrap();
        assert_eq!((head.host.as_str(), worker.host.as_str()), (head_host.as_str(), worker_host.as_str()));
        // Both nodes use this machine's engine venv (the worker's cache is its own).
        let venv = venv_python().parent().unwrap().parent().unwrap().display().to_string();
        Self { head, worker, net, worker_cache, venv }
    }

    /// `spark-kit <args> --kit tiny-cpu-docker-2node …` on the head, against the head's daemon.
    fn spark(&self, args: &[&str]) -> Command {
        let mut c = self.net.spark(KIT, args);
        c.args(["--set", &format!("engine.venv={}", self.venv)]);
        c.env("DOCKER_HOST", &self.head.host);
        c
    }

    fn status(&self) -> serde_json::Value {
        let out = self.spark(&["status", "--json"]).output().unwrap();
        assert!(out.status.success(), "status: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// The deployment's containers (running or not) on (head, worker), by label.
    fn containers(&self) -> [Vec<String>; 2] {
        let ps = |d: &NsDaemon| -> Vec<String> {
            d.ok(&["ps", "-aq", "--no-trunc", "--filter", LABEL]).lines().map(str::to_string).collect()
        };
        [ps(&self.head), ps(&self.worker)]
    }

    /// Wait until neither daemon lists a container of the deployment; the seconds it took.
    fn no_containers_within(&self, limit: Duration, what: &str) -> f64 {
        let t = Instant::now();
        loop {
            let left = self.containers();
            if left.iter().all(Vec::is_empty) {
                return t.elapsed().as_secs_f64();
            }
            assert!(t.elapsed() < limit, "{what}: containers left after {limit:?} (head, worker): {left:?}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// (id, host pid of its pid 1, network mode) of `d`'s one running container.
    fn running(d: &NsDaemon) -> (String, i32, String) {
        let ids: Vec<String> =
            d.ok(&["ps", "-q", "--no-trunc", "--filter", LABEL]).lines().map(str::to_string).collect();
        assert_eq!(ids.len(), 1, "one running container expected: {ids:?}");
        let t = d.ok(&["inspect", "--format", "{{.Id}} {{.State.Pid}} {{.HostConfig.NetworkMode}}", &ids[0]]);
        let p: Vec<&str> = t.split_whitespace().collect();
        (p[0].to_string(), p[1].parse().unwrap(), p[2].to_string())
    }

    /// A greedy chat completion through the OpenAI client, from the head's namespace.
    fn chat(&self) -> String {
        let code = r#"
from openai import OpenAI
c = OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="none", timeout=120)
r = c.chat.completions.create(model="tiny-llama", messages=[{"role": "user", "content": "import sys"}], max_tokens=12, temperature=0)
print(r.choices[0].message.content)
"#;
        let out = self.net.exec(0, venv_python()).args(["-c", code]).output().unwrap();
        assert!(out.status.success(), "chat failed: {}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
        assert!(!text.is_empty(), "empty answer");
        text
    }

    /// A foreground `up`; its stdout lines arrive on the receiver.
    fn foreground(&self) -> (Reap, Receiver<String>) {
        let mut child = self.spark(&["up"]).stdout(Stdio::piped()).stderr(Stdio::inherit()).spawn().unwrap();
        let rx = common::stdout_lines(&mut child);
        (Reap(Some(child)), rx)
    }
}

impl Drop for Env {
    /// A failed run keeps its logs (the temp dir goes with the namespaces).
    fn drop(&mut self) {
        if std::thread::panicking() {
            let keep = std::env::temp_dir().join(format!("e2e_docker_two_node-logs-{}", std::process::id()));
            let _ = Command::new("cp").arg("-a").arg(self.net.logs()).arg(&keep).status();
            eprintln!("logs kept in {}", keep.display());
        }
    }
}

fn skip_reason() -> Option<String> {
    netns::skip_reason()
        .or_else(docker::unavailable)
        .or_else(|| common::sshd::skip_reason(&["rsync", "nsenter", "unshare"]))
}

#[test]
fn two_nodes_serve_tp2_in_containers_restart_and_leave_none() {
    if let Some(why) = skip_reason() {
        eprintln!("skipping: {why}");
        return;
    }
    let t0 = Instant::now();
    let env = Env::up();

    // 1. The image, made on the head as a user makes it.
    let t = Instant::now();
    let out = env.spark(&["image", "build", "--json"]).output().unwrap();
    assert!(out.status.success(), "image build: {}", String::from_utf8_lossy(&out.stderr));
    let built: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let id = env.head.image_id(IMAGE).expect("the head has the image");
    assert_eq!(built["image_id"].as_str(), Some(id.as_str()));
    eprintln!("image build on the head: {} in {:.1} s", built["action"], t.elapsed().as_secs_f64());

    // 2. The worker lacks it: `up` stops at preflight, before any container, and the worker's
    //    fix is `image sync` (not a build there).
    assert!(env.worker.image_id(IMAGE).is_none());
    let out = env.spark(&["up"]).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("preflight failed") && text.contains("node-b image"), "{text}");
    let line = text.lines().find(|l| l.contains(&format!("image `{IMAGE}` is not on this node"))).unwrap_or_default();
    assert!(line.contains("node-b"), "the missing image is named on node-b: {text}");
    // The fix carries the kit as the user named it (step 3 runs that command).
    let fix = format!("copy the head's image here: run `spark-kit image sync --kit {KIT}` on the head");
    assert!(text.contains(&fix), "the fix names image sync with the kit: {text}");
    assert!(!text.contains("starting its engine"), "an engine was started: {text}");
    assert_eq!(env.containers(), [Vec::<String>::new(), Vec::new()]);

    // 3. `image sync` ships it: the worker's image id equals the head's.
    let t = Instant::now();
    let out = env.spark(&["image", "sync", "--json"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "image sync: {err}");
    let done: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((done[1]["node"].as_str(), done[1]["action"].as_str()), (Some("node-b"), Some("copied")), "{done}");
    assert_eq!(env.worker.image_id(IMAGE).as_deref(), Some(id.as_str()), "worker's id = head's");
    let images = env.worker_cache.path().join("images");
    assert!(std::fs::read_dir(&images).map_or(true, |mut d| d.next().is_none()), "the copied archive is removed");
    eprintln!("image sync to the worker in {:.1} s:\n{err}", t.elapsed().as_secs_f64());

    // 4. A foreground `up` serves TP=2 through a container on each node.
    let t = Instant::now();
    let (mut sup, rx) = env.foreground();
    common::wait_prefix(&rx, "endpoint: http://127.0.0.1:8000/v1", Duration::from_secs(900), "no ready banner");
    eprintln!("two-node TP=2 in containers ready in {:.1} s", t.elapsed().as_secs_f64());
    let first = env.chat();
    let (head_id, _, mode) = Env::running(&env.head);
    assert_eq!(mode, "host");
    let (worker_id, worker_init, mode) = Env::running(&env.worker);
    assert_eq!(mode, "host");
    let s = env.status();
    assert_eq!(s["nodes"][0]["container_id"].as_str(), Some(head_id.as_str()), "{s}");
    assert_eq!(s["nodes"][1]["container_id"].as_str(), Some(worker_id.as_str()), "{s}");
    assert_eq!(s["nodes"][1]["image_id"].as_str(), Some(id.as_str()), "{s}");
    let cmd = env.worker.ok(&["inspect", "--format", "{{json .Config.Cmd}}", &worker_id]);
    assert!(cmd.contains("\"--headless\"") && cmd.contains("\"10.77.0.1\""), "worker's vLLM: {cmd}");

    // 5. kill -9 of vLLM's main process in the worker's container: detected, the job
    //    restarted, the same greedy answer.
    let main = vllm_main(worker_init);
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(main), nix::sys::signal::Signal::SIGKILL).unwrap();
    let t = Instant::now();
    let (_, secs) = wait::restarts_at_least(&|| env.status(), 1, Duration::from_secs(30));
    eprintln!("worker container death detected in {secs:.1} s");
    wait::state(&|| env.status(), "ready", 1, Duration::from_secs(900));
    eprintln!("serving again {:.1} s after the kill", t.elapsed().as_secs_f64());
    assert_eq!(env.chat(), first, "greedy answer changed after the restart");
    let (again, _, _) = Env::running(&env.worker);
    assert_ne!(again, worker_id, "the worker's container was not replaced");

    // 6. `down`: no container of the deployment on either daemon, nothing left running.
    let t = Instant::now();
    let out = env.spark(&["down"]).output().unwrap();
    assert!(out.status.success(), "down: {}", String::from_utf8_lossy(&out.stderr));
    let secs = env.no_containers_within(Duration::from_secs(10), "down");
    eprintln!("down: no container on either node {secs:.1} s after it returned ({:.1} s)", t.elapsed().as_secs_f64());
    let status = sup.0.take().unwrap().wait().unwrap();
    assert!(status.success(), "the foreground up after down: {status}");
    env.net.assert_no_leftovers();

    // 7. kill -9 of the supervisor while both ranks boot: each node's agent removes its
    //    container within 30 s.
    let (mut sup, _rx) = env.foreground();
    let t = Instant::now();
    loop {
        let [h, w] = env.containers();
        if h.len() == 1 && w.len() == 1 {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(300), "no container on both nodes: {h:?} {w:?}");
        std::thread::sleep(Duration::from_millis(300));
    }
    let mut child = sup.0.take().unwrap();
    child.kill().unwrap();
    let _ = child.wait();
    let secs = env.no_containers_within(Duration::from_secs(30), "kill -9 of the supervisor");
    eprintln!("no container on either node {secs:.1} s after kill -9 of the booting supervisor");
    env.net.assert_no_leftovers();
    eprintln!("e2e_docker_two_node: {:.1} s in all", t0.elapsed().as_secs_f64());
}
