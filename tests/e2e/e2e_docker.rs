//! End to end with the engine in a container: `spark-kit up --kit tiny-cpu-docker` against a
//! real Docker daemon started by this test (tests/common/docker.rs), with the image made the way
//! a user makes it (`spark-kit image build --kit tiny-cpu-docker`: a small rootfs; the engine
//! venv is bind-mounted read-only).
//!
//! One test, sequential phases, to keep to one deployment at a time on a 2-core machine:
//! a missing image stops `up` before any container with the build command as the fix; that
//! command, run as printed, makes the image; a foreground `up` serves a greedy completion; kill
//! -9 of the container's main process is detected and restarted and serves the same answer;
//! SIGSTOP of the container's processes is detected as a hang and restarted; SIGINT (while the
//! engine boots again) leaves no container; a survivor is refused, then replaced with --replace;
//! on that deployment, a hog grown inside the container is stopped by the memory guard `up`
//! hosts (attributed by the container's cgroup; a host process left alone); `down` (while it
//! restarts) leaves none; kill -9 of a detached supervisor (while its engine boots) leaves none
//! within 30 s. Boots are the cost here, so SIGINT, `down` and the supervisor's death come
//! mid-boot.
//!
//! Needs root, docker.io and the tiny-cpu engine venv (SPARK_KIT_TEST_E2E, set by
//! tests/run-all.sh); otherwise it prints why and skips.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use crate::common;

use std::process::{Child, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use common::docker::{daemon, unavailable, vllm_main, Daemon, HOG};
use common::up::e2e_enabled;
use common::{descendants, free_port, spark_kit, venv_python, wait, Reap};

const KIT: &str = "tiny-cpu-docker";
const IMAGE: &str = "spark-kit/tiny-cpu-engine:local";
const LABEL: &str = "label=spark-kit.kit=tiny-cpu-docker";

struct Env {
    d: &'static Daemon,
    logs: tempfile::TempDir,
    port: u16,
}

impl Drop for Env {
    /// A failed run brings its deployment down (a detached supervisor would outlive the test).
    fn drop(&mut self) {
        // `down` bounds its own wait for the supervisor (as e2e_hints' DownOnDrop relies on).
        if std::thread::panicking() {
            let _ = self.spark(&["down"]).output();
        }
    }
}

impl Env {
    /// `spark-kit <args…> --kit tiny-cpu-docker` against the test daemon, with short timeouts:
    /// a 20 s serving-stall threshold, 300 s of boot silence (a boot on a loaded 2-core machine
    /// can be quiet for over a minute), a 3 s stop window.
    fn spark(&self, args: &[&str]) -> Command {
        let mut c = spark_kit();
        c.args(args).args(["--kit", KIT, "--set", &format!("paths.logs={}", self.logs.path().display())]);
        c.env("DOCKER_HOST", &self.d.host);
        c
    }

    fn up(&self, extra: &[&str]) -> Command {
        let mut c = self.spark(&["up"]);
        c.args(["--port", &self.port.to_string()]);
        c.args(["--set", "engine.hang_timeout_s=300", "--set", "engine.stall_timeout_s=20"]);
        c.args(["--set", "engine.shutdown_timeout_s=3"]);
        c.args(extra);
        c
    }

    fn status(&self) -> serde_json::Value {
        let out = self.spark(&["status", "--json"]).output().unwrap();
        assert!(out.status.success(), "status: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// Containers of this deployment (running or not), by label.
    fn containers(&self) -> Vec<String> {
        self.d.ok(&["ps", "-aq", "--no-trunc", "--filter", LABEL]).lines().map(str::to_string).collect()
    }

    /// Wait until no container of the deployment is listed; the seconds it took.
    fn no_containers_within(&self, limit: Duration, what: &str) -> f64 {
        let t = Instant::now();
        loop {
            let left = self.containers();
            if left.is_empty() {
                return t.elapsed().as_secs_f64();
            }
            assert!(t.elapsed() < limit, "{what}: containers left after {limit:?}: {left:?}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// (id, host pid of the main process) of the one running container.
    fn running(&self) -> (String, i32) {
        let ids = self.containers();
        assert_eq!(ids.len(), 1, "one container expected: {ids:?}");
        let t = self.d.ok(&["inspect", "--format", "{{.Id}} {{.State.Pid}} {{.State.Running}}", &ids[0]]);
        let p: Vec<&str> = t.split_whitespace().collect();
        assert_eq!(p[2], "true", "{t}");
        (p[0].to_string(), p[1].parse().unwrap())
    }

    fn wait_state(&self, want: &str, min_restarts: u64, limit: Duration) -> serde_json::Value {
        wait::state(&|| self.status(), want, min_restarts, limit)
    }

    /// A greedy completion through the OpenAI client of the engine venv.
    fn complete(&self) -> String {
        let code = r#"
import sys
from openai import OpenAI
c = OpenAI(base_url=sys.argv[1], api_key="none", timeout=120)
r = c.completions.create(model="tiny-llama", prompt="def main():", max_tokens=16, temperature=0)
print(r.choices[0].text)
"#;
        let base = format!("http://127.0.0.1:{}/v1", self.port);
        let out = Command::new(venv_python()).args(["-c", code, &base]).output().unwrap();
        assert!(out.status.success(), "completion failed: {}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8_lossy(&out.stdout).trim_end().to_string();
        assert!(!text.trim().is_empty(), "empty completion");
        text
    }
}

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
/// How far below MemAvailable (before the guarded deployment boots) its hard floor is.
const GUARD_MARGIN: u64 = 5 * GIB;

fn mem_available() -> u64 {
    let t = std::fs::read_to_string("/proc/meminfo").unwrap();
    spark_kit::memguard::meminfo::parse(t.as_bytes()).unwrap().mem_available
}

/// Start a foreground `up`; its stdout lines arrive on the receiver.
fn foreground(env: &Env) -> (Child, Receiver<String>) {
    let mut child = env.up(&[]).stdout(Stdio::piped()).stderr(Stdio::inherit()).spawn().unwrap();
    let rx = common::stdout_lines(&mut child);
    (child, rx)
}

fn signal(pid: i32, sig: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig).unwrap();
}

#[test]
fn serves_in_a_container_restarts_and_leaves_no_container() {
    if !e2e_enabled() {
        return;
    }
    if let Some(why) = unavailable() {
        eprintln!("skipping: {why}");
        return;
    }
    let env = Env { d: daemon().unwrap(), logs: tempfile::tempdir().unwrap(), port: free_port() };

    // 1. No image: `up` stops at preflight, before any container, and the fix is the command
    //    that makes the image.
    assert!(env.d.image_id(IMAGE).is_none());
    let out = env.up(&[]).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("preflight failed") && text.contains(&format!("image `{IMAGE}` is not on this node")),
        "{text}"
    );
    let build = format!("spark-kit image build --kit {KIT}");
    assert!(text.contains(&format!("fix: make it here, offline: `{build}`")), "{text}");
    assert!(!text.contains("starting its engine"), "an engine was started without an image: {text}");
    assert!(env.containers().is_empty());

    // 2. The printed command makes it (cached rootfs: a second run does nothing).
    let t = Instant::now();
    let out = env.spark(&["image", "build", "--json"]).output().unwrap();
    assert!(out.status.success(), "image build: {}", String::from_utf8_lossy(&out.stderr));
    let built: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    eprintln!("image build: {} in {:.1} s ({} bytes)", built["action"], t.elapsed().as_secs_f64(), built["bytes"]);
    assert_eq!(built["image_id"].as_str(), env.d.image_id(IMAGE).as_deref());
    let again = env.spark(&["image", "build", "--json"]).output().unwrap();
    let again: serde_json::Value = serde_json::from_slice(&again.stdout).unwrap();
    assert_eq!(again["action"], "present", "{again}");
    assert_eq!(again["image_id"], built["image_id"]);

    // 3. A foreground `up` serves through the container.
    let t = Instant::now();
    let (child, rx) = foreground(&env);
    let mut child = Reap(Some(child));
    common::wait_prefix(&rx, "Ctrl-C", Duration::from_secs(600), "no ready banner");
    eprintln!("ready through up in {:.1} s", t.elapsed().as_secs_f64());
    let first = env.complete();
    let (id, pid) = env.running();
    let inspect = env.d.ok(&["inspect", "--format", "{{.Config.Image}} {{.HostConfig.NetworkMode}}", &id]);
    assert_eq!(inspect, format!("{IMAGE} host"));
    // The node's compile caches are mounted read-write (a restart does not compile again).
    let mounts =
        env.d.ok(&["inspect", "--format", "{{range .Mounts}}{{.Source}}>{{.Destination}}>{{.RW}} {{end}}", &id]);
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    for c in spark_kit::runtime::docker::run::CACHES {
        let want = format!("{home}/{c}>/root/{c}>true");
        assert!(mounts.split_whitespace().any(|m| m == want), "{want} not among {mounts}");
    }
    // `status --json` names the container and its image per rank.
    let s = env.status();
    assert_eq!(s["nodes"][0]["container_id"].as_str(), Some(id.as_str()), "{s}");
    assert_eq!(s["nodes"][0]["image_id"].as_str(), env.d.image_id(IMAGE).as_deref(), "{s}");

    // 4. kill -9 of the container's main process (vLLM's own, the one child of docker-init,
    //    the container's pid 1): detected, restarted, same greedy answer.
    let main = vllm_main(pid);
    signal(main, nix::sys::signal::Signal::SIGKILL);
    let t = Instant::now();
    let (_, secs) = wait::restarts_at_least(&|| env.status(), 1, Duration::from_secs(30));
    eprintln!("container death detected in {secs:.1} s");
    env.wait_state("ready", 1, Duration::from_secs(600));
    eprintln!("serving again {:.1} s after the kill", t.elapsed().as_secs_f64());
    let (id2, pid2) = env.running();
    assert_ne!(id2, id, "the same container after a restart");
    assert_eq!(env.complete(), first, "greedy answer changed after the restart");

    // 5. SIGSTOP of every process of the container: the stall detector fires (20 s threshold).
    let mut frozen = descendants(pid2);
    frozen.push(pid2);
    for p in &frozen {
        signal(*p, nix::sys::signal::Signal::SIGSTOP);
    }
    let (s, waited) = wait::restarts_at_least(&|| env.status(), 2, Duration::from_secs(150));
    eprintln!("hang detected {waited:.1} s after SIGSTOP (stall threshold 20 s): {}", s["reason"]);
    assert!(waited >= 18.0, "hang declared before the threshold");
    let reason = s["reason"].as_str().unwrap_or_default().to_string();
    assert!(reason.contains("hang") || reason.contains("stall") || reason.contains("no new"), "{s}");
    // The restart replaces the frozen container (no need to wait for it to serve: kill -9 above
    // showed a restart serving again).
    let t = Instant::now();
    while env.containers().contains(&id2) {
        assert!(t.elapsed() < Duration::from_secs(60), "the frozen container is still there");
        std::thread::sleep(Duration::from_millis(200));
    }
    let t = Instant::now();
    while env.containers().is_empty() {
        assert!(t.elapsed() < Duration::from_secs(300), "no new container after the hang");
        std::thread::sleep(Duration::from_millis(200));
    }

    // 6. SIGINT of the foreground `up` while its engine boots again: exit 130, no container left.
    let pid = child.0.as_ref().unwrap().id() as i32;
    signal(pid, nix::sys::signal::Signal::SIGINT);
    let secs = env.no_containers_within(Duration::from_secs(30), "SIGINT");
    let status = child.0.take().unwrap().wait().unwrap();
    assert_eq!(status.code(), Some(130), "up exit status {status}");
    eprintln!("no container {secs:.1} s after SIGINT");

    // 7. A survivor of an earlier run: preflight names it and `up` refuses; `up --replace`
    //    removes it first. Then `down`: no container left.
    let name = "spark-kit-tiny-cpu-docker-local-r0";
    let leftover = env.d.ok(&["create", "--name", name, "--label", "spark-kit.kit=tiny-cpu-docker", IMAGE, "/bin/sh"]);
    let out = env.up(&[]).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains(&format!("from an earlier run: {name} ({}, created)", &leftover[..12])), "{text}");
    let fix = format!("`spark-kit up --kit {KIT} --replace` (it removes them first), or only remove them: `docker rm -f {name}` on local");
    assert!(text.contains(&fix), "{text}");
    assert_eq!(env.containers(), vec![leftover.clone()], "up touched the survivor without --replace");
    //    This deployment's memory guard gets floors a hog can reach: the hard one
    //    GUARD_MARGIN below what is available now (the engine's boot stays well above it).
    let avail = mem_available();
    let guard = avail >= 2 * GUARD_MARGIN;
    let (soft, hard) = if guard { (avail - GUARD_MARGIN + 256 * MIB, avail - GUARD_MARGIN) } else { (GIB, GIB / 2) };
    let floors = [format!("memory.guard.soft_floor={soft}"), format!("memory.guard.hard_floor={hard}")];
    let out = env
        .up(&[
            "--detach",
            "--replace",
            "--set",
            &floors[0],
            "--set",
            &floors[1],
            "--set",
            "memory.guard.policy=protect-host",
        ])
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "up --detach --replace: {text}");
    let sup_path = env.logs.path().join(format!("{KIT}-supervisor.log"));
    let sup_log = std::fs::read_to_string(&sup_path).unwrap();
    assert!(sup_log.contains(&format!("local: removed {name}")), "{sup_log}");
    let now = env.containers();
    assert!(now.len() == 1 && now[0] != leftover, "{now:?}");

    // 8. The memory guard that `up` hosts, acting on the container: a hog grows inside it
    //    (`docker exec`: the container's cgroup) past the hard floor; the guard attributes the
    //    growth to the container, stops it, writes a receipt naming it, and an idle host
    //    process is left alone. Then `down` (the supervisor is restarting it): no container.
    if guard {
        let (id, _) = env.running();
        // Killed when dropped (also when an assert below fails), and off the test's output: an
        // orphan holding it would keep the lane's log pipe open for its 600 s.
        let mut host = common::Reap(Some(
            Command::new("sleep").arg("600").stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap(),
        ));
        let python = venv_python();
        // What the hog must take to reach the hard floor now that the new engine runs (its boot and
        // the host's other processes took some of GUARD_MARGIN already).
        let room = mem_available().saturating_sub(hard);
        let mut hog = env
            .d
            .cmd()
            .args(["exec", &id])
            .arg(&python)
            .args(["-c", HOG, &hard.to_string(), &(6 * GIB).to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let t = Instant::now();
        let guard_event = |kind: &str| -> Option<serde_json::Value> {
            let log = std::fs::read_to_string(&sup_path).unwrap_or_default();
            log.lines().filter_map(|l| l.split_once("memory guard: ")).find_map(|(_, j)| {
                let v: serde_json::Value = serde_json::from_str(j).ok()?;
                (v["event"] == kind).then_some(v)
            })
        };
        let acting = loop {
            if let Some(v) = guard_event("acting") {
                break v;
            }
            assert!(t.elapsed() < Duration::from_secs(60), "the guard did not act in 60 s: {}", env.status());
            std::thread::sleep(Duration::from_millis(200));
        };
        assert_eq!(acting["decision"], "kill-engine-group", "{acting}");
        assert_eq!(acting["engine"]["container"], id.as_str(), "{acting}");
        let grown = acting["engine"]["grown_bytes"].as_u64().unwrap_or(0);
        assert!(
            grown >= room.min(512 * MIB) / 2,
            "growth attributed to the container's cgroup ({} MiB to the floor): {acting}",
            room / MIB
        );
        let acted = loop {
            if let Some(v) = guard_event("acted") {
                break v;
            }
            assert!(t.elapsed() < Duration::from_secs(90), "no `acted` from the guard");
            std::thread::sleep(Duration::from_millis(200));
        };
        assert_eq!(acted["gone"], true, "{acted}");
        // `gone` is the container's cgroup empty; the container itself goes a moment later (the
        // daemon's `--rm`, the agent's `Runtime::stop` when its next heartbeat sees the engine exited).
        let removing = Instant::now();
        while env.containers().contains(&id) {
            assert!(removing.elapsed() < Duration::from_secs(5), "the guarded container is still there after 5 s");
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!("guarded container removed {} ms after `acted`", removing.elapsed().as_millis());
        let r: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(acted["receipt"].as_str().unwrap()).unwrap()).unwrap();
        assert_eq!(r["signals"][0]["target"], "container", "{r}");
        assert_eq!(r["signals"][0]["container"], id.as_str(), "{r}");
        assert!(host.0.as_mut().unwrap().try_wait().unwrap().is_none(), "the host's process was not left alone");
        eprintln!(
            "memory guard in up: acted {:.1} s after the hog started ({} MiB grown in the container, {} MiB to the floor at its start), reaction {} ms, gone after {} ms",
            t.elapsed().as_secs_f64(),
            grown / MIB,
            room / MIB,
            r["reaction_ms"],
            r["outcome"]["ms"]
        );
        let _ = hog.wait();
        drop(host);
    } else {
        eprintln!("skipping the memory-guard step: MemAvailable {} MiB < {} MiB", avail / MIB, 2 * GUARD_MARGIN / MIB);
    }
    let t = Instant::now();
    let out = env.spark(&["down"]).output().unwrap();
    assert!(out.status.success(), "down: {}", String::from_utf8_lossy(&out.stderr));
    env.no_containers_within(Duration::from_secs(10), "down");
    eprintln!("down: no container after {:.1} s", t.elapsed().as_secs_f64());

    // 9. kill -9 of a detached supervisor while its engine boots: its agent removes the
    //    container within 30 s (and the waiting `up --detach` fails).
    let waiting = env.up(&["--detach"]).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    let mut waiting = Reap(Some(waiting));
    let t = Instant::now();
    let sup = loop {
        let out = env.spark(&["status", "--json"]).output().unwrap();
        let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        if let (Some(pid), 1) = (s["supervisor_pid"].as_i64(), env.containers().len()) {
            break pid as i32;
        }
        assert!(t.elapsed() < Duration::from_secs(300), "no container for the detached up: {s}");
        std::thread::sleep(Duration::from_millis(300));
    };
    signal(sup, nix::sys::signal::Signal::SIGKILL);
    let secs = env.no_containers_within(Duration::from_secs(30), "kill -9 of the supervisor");
    eprintln!("no container {secs:.1} s after kill -9 of the supervisor");
    let status = waiting.0.take().unwrap().wait().unwrap();
    assert!(!status.success(), "up --detach succeeded though its supervisor was killed");
}
